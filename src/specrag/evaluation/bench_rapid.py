"""``specrag bench rapid``: RAPID against HF decoding baselines on long-context QA.

Long contexts are built RULER-qa_2-style from HotpotQA dev: a question's gold paragraphs are
hidden among distractor paragraphs of other questions until the document reaches 2K, 4K or 8K
tokens (seeded; the gold position varies). Every method decodes greedily from the SAME target
prompt (instructions + document + question) with the same model:

* ``target_only`` - HF ``generate`` (no speculation);
* ``hf_assisted`` - HF assisted generation with RAPID's drafter as assistant (the same model on
  ``embedded``, the int8 0.5B on ``--models pair``; it reads the same long prompt: HF has no
  separate drafter context);
* ``hf_prompt_lookup`` - HF ``prompt_lookup_num_tokens=10``;
* ``rapid_eta0`` - RAPID without knowledge transfer (lossless);
* ``rapid_kt`` - RAPID with knowledge transfer (``transfer=shift``, ``eta`` as configured).

Two speeds, both from the same run:

* **decode-only**: tokens emitted after the prefill pass over the time after it, so the
  prefills do not blur it (``decode_speedup_vs_target``; RAPID: ``(new_tokens - 1) /
  decode_s``; HF: from the streamer's steps - HF's assisted generation drafts before its first
  target pass, so its first step carries several tokens and counts as the prefill);
* **end to end**: from the document text and question to the last token, with everything each
  method pays: tokenising, the document prefill (no method starts from a cached document), and
  for RAPID also what only RAPID pays - chunking and embedding the document, the drafter's
  prefill, storing the document prefix (``e2e_speedup_vs_target``).

``rapid_kt`` then asks the same question again: the repeat hits the document prefix cache
(first-question vs repeat-question end-to-end latency). Before anything is timed, one short
case runs through every method (untimed, unrecorded) so model loading, the embedding model
(MiniLM), HF's generation paths and the RAPID path are warm. Every ratio comes with a 95%
bootstrap interval over questions (``*_ci95``; null from one question, as in a ``--quick``
run). Forward passes are counted per model: ``target_passes_per_token`` and
``draft_passes_per_token`` (RAPID's drafter, or HF's assistant, counted apart).
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
from specrag.decoding.prefix_cache import PrefixCache
from specrag.evaluation import metrics
from specrag.evaluation.hf import hf_generate
from specrag.evaluation.store import (
    RunLog,
    dtype_variant,
    out_path,
    say_written,
    setup_tag,
    write_results,
)
from specrag.graph.context import MODEL_PRESETS
from specrag.indexing import document_search
from specrag.models.loading import LoadedLM, drafter_dtype, dtype_name, load_lm
from specrag.models.rapid_chat import RAPID_INSTRUCTIONS, ChatRapid, layout
from specrag.models.worker import MODEL_THREAD
from specrag.progress import progress_bar

LENGTHS = [2048, 4096, 8192]
METHODS = ["target_only", "hf_assisted", "hf_prompt_lookup", "rapid_eta0", "rapid_kt"]
# RAPID first (the order of the methods within a case; no method reuses another's state)
ORDER = ["rapid_kt", "rapid_eta0", "target_only", "hf_prompt_lookup", "hf_assisted"]
SEED = 7
MAX_NEW = 48
WARMUP_TOKENS = 512  # the warm-up case: a short document, a few new tokens
WARMUP_NEW = 8
# Bumped when what a record measures changes, so a resumed run never mixes records of two
# protocols (2: every method pays its own document prefill; passes counted per model;
# 3: lossless RAPID skips the drafter pass whose q it never reads; 4: a drafter that is not the
# target runs in bf16 beside an fp32 target on a CPU with native bf16 - ``drafter_dtype``.
# 5 was tried and reverted (2026-12-01): gamma capped from verify passes timed on a 64-token
# cache; at 2K-4K contexts wide passes cost less than that, and the cap lost - see
# docs/bench/2026-12-01-rapid-pair-gamma-cap/); 6: an fp32 target keeps its linear weights in
# both layouts where that pays (``specrag.models.layout``: wide verify passes cost less), for
# every method - they share the loaded model; 7: RAPID's drafter scores only the first 32,768
# token ids plus its prompt's (``drafter_vocab``, ``specrag.decoding.vocab``; HF assisted's
# assistant scores every row, as HF runs it); 8: the drafter (and HF assisted's assistant) has
# int8 linear layers beside an fp32 target on an x86 CPU (``specrag.models.int8``; a bf16 copy
# for wide passes), its int8 output layer untrimmed; 9: passes of several tokens over the cache
# attend with native grouped-query attention instead of copying the keys and values
# (``specrag.models.attention``: bit-identical logits, cheaper verify passes), every method;
# 10: a RAPID round stops drafting before a position where the drafter's max(q) < 0.6 (the
# first draft token always proposed; ``ChatRapid.min_draft_confidence``; 0 before); 11: the
# target's second weight layout is packed by oneDNN instead of transposed
# (``specrag.models.layout``: a pass of 8 tokens 1.3x a step instead of 1.6x), every method.
# Not a protocol: since 2026-12-02 a bf16 target on an x86 CPU (``--dtype bfloat16``) gets the
# int8 drafter too; ``setup_tag`` keys those records apart (``cpu:bfloat16+cpu:qint8``).
# Not a protocol either: since 2026-12-04 HF's methods stop at every end token the model names,
# as RAPID does; for SmolLM2 and the pair these are the generation config's own (<|im_end|>).
PROTOCOL = 11


def rapid_tokens_per_s(new_tokens: int, decode_s: float) -> float | None:
    """RAPID's decode speed: tokens after the first over ``decode_s`` (None for one token).

    ``decode_s`` counts neither prefill: lossless RAPID's drafter prefill runs after the first
    token (since 2026-12-07) but is timed apart (``drafter_prefill_s``, in the e2e time).
    """
    return (new_tokens - 1) / decode_s if decode_s and new_tokens > 1 else None


def case_key(qid: str, length: int, method: str, setup: str, eta: float = 5.0) -> str:
    """Run-log key of one method on one (question, context length), models as loaded.

    ``rapid_kt``'s names its ``eta``: a run with another one resumed its records as its own.
    """
    knob = f"|eta={eta:g}" if method == "rapid_kt" else ""
    return f"{qid}|{length}|{method}{knob}|p{PROTOCOL}|{setup}"


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


def prefill_state(loaded: LoadedLM, parts: list[list[int]]) -> Any:
    """A fresh KV cache of the target holding ``parts`` (prefilled one part after another)."""
    from specrag.decoding.state import LMState, sync

    def work() -> Any:
        state = LMState(loaded.model, loaded.device)
        for ids in parts:
            if ids:
                state.extend(ids, all_logits=False)
        sync(loaded.device)  # timed by the caller: the passes have run, not only been launched
        return state

    return MODEL_THREAD.call(work)


def run_case(
    ex: QAExample,
    document: str,
    loaded: LoadedLM,
    eta: float,
    method: str,
    max_new: int = MAX_NEW,
    drafter: LoadedLM | None = None,
) -> dict[str, Any]:
    """One method on one (question, document), timed from the text to the last token.

    ``drafter``: RAPID's drafter and HF's assistant (default: the target itself).
    """
    drafter = drafter or loaded
    if method.startswith("rapid"):
        # every RAPID case pays its own chunking and embedding (no case reuses another's)
        document_search.clear_cache()
        model = ChatRapid(
            target_model=loaded.name,
            drafter_model=drafter.name,
            device=str(loaded.device),
            dtype=dtype_name(loaded.dtype),  # the baselines' dtype
            drafter_dtype=dtype_name(drafter.dtype),  # as HF assisted's assistant runs
            eta=0.0 if method == "rapid_eta0" else eta,
            max_new_tokens=max_new,
            prefix_cache=PrefixCache(),  # empty: this call pays the document prefill
            adaptive_gamma=True,
        )
        start = time.perf_counter()
        msg = model.invoke([HumanMessage(ex.question)], document=document)
        e2e = time.perf_counter() - start
        meta = msg.response_metadata
        new, decode_s = meta["new_tokens"], meta["decode_s"]
        rec = {
            "answer": str(msg.content),
            "new_tokens": new,
            "decode_s": decode_s,
            "tokens_per_s": rapid_tokens_per_s(new, decode_s),
            "e2e_s": e2e,
            "ttft_s": meta.get("ttft_s"),
            "target_forward_passes": meta["target_forward_passes"],
            "draft_forward_passes": meta.get("drafter_forward_passes", 0),
            "acceptance_rate": meta.get("acceptance_rate"),
            "draft_tokens": meta.get("draft_tokens"),
            "accepted_tokens": meta.get("accepted_tokens"),
            "mean_accepted_per_step": meta.get("mean_accepted_per_step"),
            "prefix_cache_hit": meta.get("prefix_cache_hit"),
            # the stages: what only RAPID pays, and the prefills every method pays
            "retrieve_s": meta.get("retrieve_s"),
            "document_prefill_s": meta.get("prefix_s"),
            "target_prefill_s": meta.get("target_prefill_s"),
            "drafter_prefill_s": meta.get("drafter_prefill_s"),
        }
        if method == "rapid_kt":  # repeat the question: the document prefix is cached now
            start = time.perf_counter()
            again = model.invoke([HumanMessage(ex.question)], document=document)
            rec["repeat_e2e_s"] = time.perf_counter() - start
            rec["repeat_prefix_cache_hit"] = again.response_metadata.get("prefix_cache_hit")
        return rec
    start = time.perf_counter()
    head, doc, tail = layout(loaded, RAPID_INSTRUCTIONS, document, ex.question)
    prompt = head + doc + tail
    kwargs: dict[str, Any] = {}
    if method == "target_only":
        # Prefilled the way RAPID prefills (document prefix, then the question), so greedy
        # target-only output is the reference rapid_eta0 must reproduce; the prefill is timed.
        state = prefill_state(loaded, [head + doc, tail[:-1]])
        kwargs["cache"] = state.cache
    elif method == "hf_assisted":
        # HF's speculative paths run as users run them: from the prompt, with their own
        # prefill (assisted generation prefills the assistant on the same long prompt too).
        # Handing them a pre-filled cache changed their greedy output in transformers 5.24.
        kwargs["assistant_model"] = drafter.model
    else:
        kwargs["prompt_lookup_num_tokens"] = 10
    before_generate = time.perf_counter() - start
    # RAPID stops at every end token the model names (its generation config's and its
    # tokenizer's); HF at the same ones
    kwargs["eos_token_id"] = list(loaded.eos_token_ids)
    res = hf_generate(loaded, prompt, max_new_tokens=max_new, **kwargs)
    res.pop("output_ids", None)  # no stop sequences here: new_tokens is the answer's length
    res["e2e_s"] = time.perf_counter() - start
    res["generate_s"] = res.pop("total_s")
    if res.get("ttft_s") is not None:
        res["ttft_s"] += before_generate
    if method == "target_only":
        res["document_prefill_s"] = before_generate
    res["target_forward_passes"] = res.pop("forward_passes")
    res["draft_forward_passes"] = res.pop("assistant_forward_passes", 0)
    return res


def warm_up(
    ex: QAExample, pool: list[QAExample], loaded: LoadedLM, eta: float, drafter: LoadedLM
) -> None:
    """A short case through every method, untimed and unrecorded.

    Loads the embedding model RAPID searches with (MiniLM), and runs once every code path the
    timed runs take: the RAPID path (chunking, embedding, both prefills, the prefix cache),
    the target-only prefill and HF's plain, prompt-lookup and assisted generation.
    """
    rng = random.Random(f"{SEED}:warm-up")
    document = build_document(ex, pool, WARMUP_TOKENS, loaded, rng)
    for method in ORDER:
        run_case(ex, document, loaded, eta, method, max_new=WARMUP_NEW, drafter=drafter)


def _by_question(rows: list[dict[str, Any]], field: str) -> dict[str, float]:
    """``{qid: value}`` of ``field`` (rows without a value left out)."""
    return {r["qid"]: r[field] for r in rows if r.get(field) is not None}


def _passes_per_token(rows: list[dict[str, Any]], field: str) -> float | None:
    pairs = [(r[field], r["new_tokens"]) for r in rows if r.get(field) is not None]
    return metrics.per_token(pairs) if pairs else None


def pooled_acceptance(rs: list[dict[str, Any]]) -> float | None:
    """Accepted over proposed draft tokens, all answers pooled (None: nothing proposed).

    A mean of per-answer rates counted an answer that proposed nothing (an end token at
    once) as 0% accepted (a review, 2026-12-07); records without the counts (an older run
    resumed) fall back to that mean.
    """
    counted = [r for r in rs if r.get("draft_tokens") is not None]
    if counted:
        proposed = sum(r["draft_tokens"] for r in counted)
        return sum(r["accepted_tokens"] for r in counted) / proposed if proposed else None
    rates = [r["acceptance_rate"] for r in rs if r.get("acceptance_rate") is not None]
    return metrics.mean(rates) if rates else None


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per context length: speeds, ratios to target-only (with 95% intervals), accuracy."""
    out: dict[str, Any] = {}
    ratio = lambda num, den: metrics.ratio_ci(num, den, metrics.mean, seed=SEED)  # noqa: E731
    for length in LENGTHS:
        rows = [r for r in records if r["length"] == length]
        if not rows:
            continue
        per: dict[str, Any] = {
            key: {}
            for key in (
                "tokens_per_s",
                "decode_speedup_vs_target",
                "decode_speedup_vs_target_ci95",
                "e2e_s",
                "e2e_speedup_vs_target",
                "e2e_speedup_vs_target_ci95",
                "target_passes_per_token",
                "draft_passes_per_token",
                "retrieve_s",
                "drafter_prefill_s",
                "document_prefill_s",
                "accuracy",
                "f1",
                "acceptance_rate",
                "same_answer_as_target",
            )
        }
        by_method = {m: [r for r in rows if r["method"] == m] for m in METHODS}
        base = by_method["target_only"]
        # greedy: the answer target-only gives, as text (HF's paths strip what they return)
        reference = {r["qid"]: str(r["answer"]).strip() for r in base}
        for method, rs in by_method.items():
            if not rs:
                continue
            tps = [r["tokens_per_s"] for r in rs if r.get("tokens_per_s")]
            per["tokens_per_s"][method] = metrics.mean(tps) if tps else None
            per["e2e_s"][method] = metrics.mean([r["e2e_s"] for r in rs])
            per["accuracy"][method] = metrics.mean([r["contains"] for r in rs])
            per["f1"][method] = metrics.mean([r["f1"] for r in rs])
            per["target_passes_per_token"][method] = _passes_per_token(rs, "target_forward_passes")
            per["draft_passes_per_token"][method] = _passes_per_token(rs, "draft_forward_passes")
            for stage in ("retrieve_s", "drafter_prefill_s", "document_prefill_s"):
                values = [r[stage] for r in rs if r.get(stage) is not None]
                if values:
                    per[stage][method] = metrics.mean(values)
            if (pooled := pooled_acceptance(rs)) is not None:
                per["acceptance_rate"][method] = pooled
            same = [
                str(r["answer"]).strip() == reference[r["qid"]] for r in rs if r["qid"] in reference
            ]
            if same:
                per["same_answer_as_target"][method] = sum(same) / len(same)
            if base:  # tokens/s: method over target; seconds: target over method
                point, ci = ratio(
                    _by_question([r for r in rs if r.get("tokens_per_s")], "tokens_per_s"),
                    _by_question([r for r in base if r.get("tokens_per_s")], "tokens_per_s"),
                )
                per["decode_speedup_vs_target"][method] = point
                per["decode_speedup_vs_target_ci95"][method] = ci
                point, ci = ratio(_by_question(base, "e2e_s"), _by_question(rs, "e2e_s"))
                per["e2e_speedup_vs_target"][method] = point
                per["e2e_speedup_vs_target_ci95"][method] = ci
        kt = [r for r in by_method["rapid_kt"] if r.get("repeat_e2e_s")]
        per["first_question_s"] = metrics.mean([r["e2e_s"] for r in kt]) if kt else None
        per["repeat_question_s"] = metrics.mean([r["repeat_e2e_s"] for r in kt]) if kt else None
        point, ci = (
            ratio(_by_question(kt, "e2e_s"), _by_question(kt, "repeat_e2e_s"))
            if kt
            else (None, None)
        )
        per["repeat_question_speedup"] = point
        per["repeat_question_speedup_ci95"] = ci
        per["n_questions"] = len({r["qid"] for r in rows})
        per["document_tokens"] = metrics.mean([r["document_tokens"] for r in rows])
        out[str(length)] = per
    return out


def _f(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else f"{v:.3f}"


def _with_ci(v: Any, ci: list[float] | None) -> str:
    return _f(v) if v is None or not ci else f"{_f(v)} [{_f(ci[0])}, {_f(ci[1])}]"


def markdown(summary: dict[str, Any]) -> str:
    """Results table (ratios with their 95% bootstrap interval over questions)."""
    columns = [
        "context",
        "method",
        "decode tokens/s",
        "decode speedup vs target [95% CI]",
        "e2e s",
        "e2e speedup vs target [95% CI]",
        "RAPID-only s (retrieve + drafter prefill)",
        "target passes/token",
        "draft passes/token",
        "acceptance",
        "accuracy (contains)",
        "F1",
        "same answer as target",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for length, per in summary.items():
        for method in METHODS:
            if method not in per["tokens_per_s"]:
                continue
            get = lambda key: per[key].get(method)  # noqa: E731
            stages = [get("retrieve_s"), get("drafter_prefill_s")]
            cells = [
                length,
                method,
                _f(get("tokens_per_s")),
                _with_ci(get("decode_speedup_vs_target"), get("decode_speedup_vs_target_ci95")),
                _f(get("e2e_s")),
                _with_ci(get("e2e_speedup_vs_target"), get("e2e_speedup_vs_target_ci95")),
                _f(sum(stages)) if None not in stages else "-",
                _f(get("target_passes_per_token")),
                _f(get("draft_passes_per_token")),
                _f(get("acceptance_rate")),
                _f(get("accuracy")),
                _f(get("f1")),
                _f(get("same_answer_as_target")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        speedup = _with_ci(per["repeat_question_speedup"], per["repeat_question_speedup_ci95"])
        cells = [
            length,
            "repeat question (rapid_kt, prefix cache)",
            "",
            "",
            f"first {_f(per['first_question_s'])} s, repeat {_f(per['repeat_question_s'])} s",
            f"speedup {speedup}",
        ] + [""] * (len(columns) - 6)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(
    *,
    quick: bool,
    out_dir: Path,
    log: Console,
    fresh: bool = False,
    eta: float = 5.0,
    models: str = "embedded",
    dtype: str = "auto",
) -> dict[str, Any]:
    """Run (or resume) the benchmark and write JSON + markdown (models in ``dtype``).

    ``models="pair"``: the 1.5B reads the document, the 0.5B drafts from the chunks (and is
    HF's assistant); contexts of 2K and 4K tokens only - on 2 CPU cores one 8K prefill of the
    1.5B takes minutes per method, so 8K does not fit a run of this size.
    """
    pair = models == "pair"
    out_dir = out_dir / ("bench_rapid_pair" if pair else "bench_rapid")
    out_dir.mkdir(parents=True, exist_ok=True)
    target_name, drafter_name = MODEL_PRESETS[models][::-1]
    loaded = load_lm(target_name, "auto", dtype)
    same = drafter_name == target_name
    drafter = load_lm(drafter_name, "auto", drafter_dtype("auto", dtype, "auto", same))
    lengths = LENGTHS[:2] if pair else LENGTHS
    torch.manual_seed(SEED)
    n_questions = 1 if quick else 5
    pool = hotpot_questions()
    picked = sample(pool, n_questions, SEED)
    distractor_pool = sample(pool, 300, SEED + 1)
    runlog = RunLog(out_path(out_dir, "runs.jsonl", quick), fresh=fresh)
    work = [(ex, length) for length in lengths for ex in picked]
    setup = setup_tag(loaded, drafter)
    keys = {case_key(ex.id, length, m, setup, eta) for ex, length in work for m in METHODS}
    # one (question, length)'s methods run side by side: a part-run one is run again whole
    groups = [[case_key(ex.id, length, m, setup, eta) for m in METHODS] for ex, length in work]
    if redo := runlog.keep_whole(groups):
        log.print(f"bench rapid: {redo} records of part-run cases will be run again")
    if any(not runlog.done(k) for k in keys):
        log.print("bench rapid: warming up (one short untimed case through every method)")
        warm_up(picked[0], distractor_pool, loaded, eta, drafter)
    with progress_bar(log) as bar:
        task = bar.add_task("bench rapid", total=len(work) * len(METHODS))
        for ex, length in work:
            rng = random.Random(f"{SEED}:{ex.id}:{length}")
            document = build_document(ex, distractor_pool, length, loaded, rng)
            n_tokens = len(loaded.tokenizer(document, add_special_tokens=False)["input_ids"])
            for method in ORDER:
                key = case_key(ex.id, length, method, setup, eta)
                bar.update(task, description=f"{length} tokens: {method}")
                if not runlog.done(key):
                    rec = run_case(ex, document, loaded, eta, method, drafter=drafter)
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
    summary = metrics.json_ready(summarize([r for k, r in runlog.records.items() if k in keys]))
    texts = {"summary.json": json.dumps(summary, indent=2), "table.md": markdown(summary)}
    # a dtype's summary apart: a later auto run replaced a bf16 run's (the log keeps both)
    files = [*write_results(out_dir, quick, texts, dtype_variant(dtype)), str(runlog.path)]
    log.print(markdown(summary))
    say_written(log, files)
    return {
        "benchmark": "rapid",
        "models": {"preset": models, "target": loaded.name, "drafter": drafter.name},
        # which weight layout each model ran with (specrag.models.layout; int8 for a drafter)
        "layouts": {"target": loaded.layout, "drafter": drafter.layout},
        # each model's load time (its first load in this process), outside every
        # timing above (a separate drafter is a second model to load and keep)
        "load_s": {"target": loaded.load_seconds, "drafter": drafter.load_seconds},
        "dtype": str(loaded.dtype),
        "drafter_dtype": str(drafter.dtype),
        "quick": quick,
        "eta": eta,
        "max_new_tokens": MAX_NEW,
        "per_context_length": summary,
        "statistics": {
            "decode_speedup_vs_target": metrics.RATIO_OF_MEANS + " (tokens per second)",
            "e2e_speedup_vs_target, repeat_question_speedup": (
                "mean over questions of the baseline's seconds / the same mean of the method's"
            ),
            "*_ci95": metrics.BOOTSTRAP,
        },
        "files": files,
    }
