"""``specrag bench rapid``: RAPID against HF decoding baselines on long-context QA.

Long contexts are built RULER-qa_2-style from HotpotQA dev: a question's gold paragraphs are
hidden among distractor paragraphs of other questions until the document reaches 2K, 4K or 8K
tokens (seeded; the gold position varies). Every method decodes greedily from the SAME target
prompt (instructions + document + question) with the same model:

* ``target_only`` - HF ``generate`` (no speculation);
* ``hf_assisted`` - HF assisted generation, the same model as assistant (it reads the same long
  prompt: HF has no separate drafter context);
* ``hf_prompt_lookup`` - HF ``prompt_lookup_num_tokens=10``;
* ``rapid_eta0`` - RAPID without knowledge transfer (lossless);
* ``rapid_kt`` - RAPID with knowledge transfer (``transfer=shift``, ``eta`` as configured).

Decode speed is ``(new_tokens - 1) / (time after the first token)``, so one shared prefill of the
document does not blur it; the RAPID runs also report first-question and repeat-question
end-to-end latency (the second hits the document prefix cache).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from langchain_core.messages import HumanMessage
from rich.console import Console

from specrag.data.datasets import QAExample, hotpot_questions, sample
from specrag.decoding.prefix_cache import PrefixCache, prefix_key
from specrag.evaluation import metrics
from specrag.evaluation.hf import hf_generate
from specrag.evaluation.store import RunLog
from specrag.models.loading import LoadedLM, load_lm
from specrag.models.rapid_chat import RAPID_INSTRUCTIONS, ChatRapid, layout
from specrag.models.worker import MODEL_THREAD
from specrag.progress import progress_bar

LENGTHS = [2048, 4096, 8192]
METHODS = ["target_only", "hf_assisted", "hf_prompt_lookup", "rapid_eta0", "rapid_kt"]
SEED = 7
MAX_NEW = 48


def build_document(
    ex: QAExample, pool: list[QAExample], tokens: int, loaded: LoadedLM, rng: random.Random
) -> str:
    """Gold paragraphs hidden among distractors, about ``tokens`` tokens long."""
    count = lambda t: len(loaded.tokenizer(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    gold = [f"{p.title}: {p.text}" for p in ex.paragraphs if p.id in ex.gold_ids]
    distractors = [
        f"{p.title}: {p.text}"
        for other in pool
        if other.id != ex.id
        for p in other.paragraphs
        if p.id not in ex.gold_ids
    ]
    rng.shuffle(distractors)
    budget = tokens - 200 - sum(count(g) for g in gold)  # room for the question and answer
    body: list[str] = []
    used = 0
    for para in distractors:
        cost = count(para) + 2
        if used + cost > budget:
            continue
        body.append(para)
        used += cost
        if used > budget - 40:
            break
    for g in gold:  # the gold position varies with the seed
        body.insert(rng.randint(0, len(body)), g)
    return "\n\n".join(body)


def run_case(
    ex: QAExample,
    document: str,
    length: int,
    loaded: LoadedLM,
    eta: float,
    method: str,
    shared: dict[str, Any],
) -> dict[str, Any]:
    """One method on one (question, document)."""
    if method.startswith("rapid"):
        cache: PrefixCache = shared.setdefault("prefix_cache", PrefixCache())
        model = ChatRapid(
            eta=0.0 if method == "rapid_eta0" else eta,
            max_new_tokens=MAX_NEW,
            prefix_cache=cache,
            adaptive_gamma=True,
        )
        start = time.perf_counter()
        msg = model.invoke([HumanMessage(ex.question)], document=document)
        first_e2e = time.perf_counter() - start
        meta = msg.response_metadata
        rec = {
            "answer": str(msg.content),
            "new_tokens": meta["new_tokens"],
            "decode_s": meta["decode_s"],
            "target_forward_passes": meta["target_forward_passes"],
            "acceptance_rate": meta["acceptance_rate"],
            "mean_accepted_per_step": meta["mean_accepted_per_step"],
            "prefix_cache_hit": meta["prefix_cache_hit"],
            "e2e_s": first_e2e,
            "tokens_per_s": (meta["new_tokens"] - 1) / meta["decode_s"]
            if meta["decode_s"] and meta["new_tokens"] > 1
            else None,
        }
        if method == "rapid_kt":  # repeat the question: the document prefix is cached now
            start = time.perf_counter()
            again = model.invoke([HumanMessage(ex.question)], document=document)
            rec["repeat_e2e_s"] = time.perf_counter() - start
            rec["repeat_prefix_cache_hit"] = again.response_metadata["prefix_cache_hit"]
        return rec
    head, doc, tail = layout(loaded, RAPID_INSTRUCTIONS, document, ex.question)
    prompt = head + doc + tail
    if method == "target_only":
        # Target-only decoding starts from the document prefill the first RAPID run cached
        # (plus the question): the same prompt, and decode speed is measured after the
        # first token anyway.
        def prefilled() -> Any:
            state = shared["prefix_cache"].get(prefix_key(loaded.key, head + doc))
            if state is None:
                from specrag.decoding.state import LMState

                state = LMState(loaded.model, loaded.device)
                state.extend(head + doc, all_logits=False)
            state.extend(tail[:-1], all_logits=False)
            return state

        state = MODEL_THREAD.call(prefilled)
        res = hf_generate(loaded, prompt, max_new_tokens=MAX_NEW, cache=state.cache)
    else:
        # HF's speculative paths run as users run them: from the prompt, with their own
        # prefill (assisted generation prefills the assistant on the same long prompt too).
        # Handing them a pre-filled cache changed their greedy output in transformers 5.24.
        kwargs: dict[str, Any] = (
            {"assistant_model": loaded.model}
            if method == "hf_assisted"
            else {"prompt_lookup_num_tokens": 10}
        )
        res = hf_generate(loaded, prompt, max_new_tokens=MAX_NEW, **kwargs)
    res["e2e_s"] = res.pop("total_s")
    res["target_forward_passes"] = res.pop("forward_passes")
    return res


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per context length: tokens/s per method, ratios to target-only, accuracy."""
    out: dict[str, Any] = {}
    for length in LENGTHS:
        rows = [r for r in records if r["length"] == length]
        if not rows:
            continue
        per: dict[str, Any] = {
            "tokens_per_s": {},
            "speedup_vs_target": {},
            "accuracy": {},
            "f1": {},
            "acceptance_rate": {},
        }
        for method in METHODS:
            rs = [r for r in rows if r["method"] == method]
            if not rs:
                continue
            tps = [r["tokens_per_s"] for r in rs if r.get("tokens_per_s")]
            per["tokens_per_s"][method] = metrics.mean(tps) if tps else None
            per["accuracy"][method] = metrics.mean([r["contains"] for r in rs])
            per["f1"][method] = metrics.mean([r["f1"] for r in rs])
            acc = [r["acceptance_rate"] for r in rs if r.get("acceptance_rate") is not None]
            if acc:
                per["acceptance_rate"][method] = metrics.mean(acc)
        base = per["tokens_per_s"].get("target_only")
        for method, tps in per["tokens_per_s"].items():
            per["speedup_vs_target"][method] = tps / base if tps and base else None
        kt = [r for r in rows if r["method"] == "rapid_kt" and r.get("repeat_e2e_s")]
        per["first_question_s"] = metrics.mean([r["e2e_s"] for r in kt]) if kt else None
        per["repeat_question_s"] = metrics.mean([r["repeat_e2e_s"] for r in kt]) if kt else None
        per["repeat_question_speedup"] = (
            per["first_question_s"] / per["repeat_question_s"] if kt else None
        )
        per["n_questions"] = len({r["qid"] for r in rows})
        per["document_tokens"] = metrics.mean([r["document_tokens"] for r in rows])
        out[str(length)] = per
    return out


def markdown(summary: dict[str, Any]) -> str:
    """Results table."""
    head = (
        "| context | method | tokens/s | speedup vs target | acceptance | accuracy (contains) "
        "| F1 |\n|---|---|---|---|---|---|---|\n"
    )
    lines = []
    f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for length, per in summary.items():
        for method in METHODS:
            if method not in per["tokens_per_s"]:
                continue
            lines.append(
                f"| {length} | {method} | {f(per['tokens_per_s'][method])} | "
                f"{f(per['speedup_vs_target'].get(method))} | "
                f"{f(per['acceptance_rate'].get(method))} | "
                f"{f(per['accuracy'][method])} | {f(per['f1'][method])} |"
            )
        lines.append(
            f"| {length} | repeat question (rapid_kt, prefix cache) | "
            f"first {f(per['first_question_s'])} s | repeat {f(per['repeat_question_s'])} s "
            f"| speedup {f(per['repeat_question_speedup'])} | | |"
        )
    return head + "\n".join(lines) + "\n"


def run(
    *, quick: bool, out_dir: Path, log: Console, fresh: bool = False, eta: float = 5.0
) -> dict[str, Any]:
    """Run (or resume) the benchmark and write JSON + markdown."""
    out_dir = out_dir / "bench_rapid"
    out_dir.mkdir(parents=True, exist_ok=True)
    loaded = load_lm("embedded", "auto", "auto")
    torch.manual_seed(SEED)
    n_questions = 1 if quick else 5
    pool = hotpot_questions()
    picked = sample(pool, n_questions, SEED)
    distractor_pool = sample(pool, 300, SEED + 1)
    runlog = RunLog(out_dir / ("runs-quick.jsonl" if quick else "runs.jsonl"), fresh=fresh)
    work = [(ex, length) for length in LENGTHS for ex in picked]
    with progress_bar(log) as bar:
        task = bar.add_task("bench rapid", total=len(work) * len(METHODS))
        for ex, length in work:
            rng = random.Random(f"{SEED}:{ex.id}:{length}")
            document = build_document(ex, distractor_pool, length, loaded, rng)
            n_tokens = len(loaded.tokenizer(document, add_special_tokens=False)["input_ids"])
            shared: dict[str, Any] = {}
            # RAPID first: its first run pays (and caches) the document prefill
            for method in [
                "rapid_kt",
                "rapid_eta0",
                "target_only",
                "hf_prompt_lookup",
                "hf_assisted",
            ]:
                key = f"{ex.id}|{length}|{method}"
                bar.update(task, description=f"{length} tokens: {method}")
                if not runlog.done(key):
                    rec = run_case(ex, document, length, loaded, eta, method, shared)
                    rec.update(
                        qid=ex.id,
                        length=length,
                        method=method,
                        document_tokens=n_tokens,
                        contains=metrics.contains(rec["answer"], ex.answers),
                        f1=metrics.f1(rec["answer"], ex.answers),
                    )
                    runlog.add(key, rec)
                bar.advance(task)
    keys = {f"{ex.id}|{length}|{m}" for ex, length in work for m in METHODS}
    summary = summarize([r for k, r in runlog.records.items() if k in keys])
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "table.md").write_text(markdown(summary))
    files = [str(out_dir / "summary.json"), str(out_dir / "table.md"), str(runlog.path)]
    log.print(markdown(summary))
    log.print("results written to: " + ", ".join(files))
    return {
        "benchmark": "rapid",
        "quick": quick,
        "eta": eta,
        "max_new_tokens": MAX_NEW,
        "per_context_length": summary,
        "files": files,
    }
