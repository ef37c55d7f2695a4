"""``specrag bench rag``: speculative RAG against serial RAG on SQuAD v2 dev and HotpotQA dev.

Systems, all on the same local model and prompts, in ONE run:

* ``no_rag`` - the draft alone (draft prompt, no evidence);
* ``serial_plain`` - retrieve, then generate with plain decoding (the graph with the draft off);
* ``serial_lookup`` - retrieve, then HF ``generate(prompt_lookup_num_tokens=10)``;
* ``spec_rewrite`` - the graph, ``refine_mode=rewrite``;
* ``spec_verify`` - the graph, ``refine_mode=verify`` (default);
* ``serial_incremental`` / ``spec_verify_incremental`` - ``serial_plain`` / ``spec_verify``
  with ``answer_policy=incremental``: the answer starts from the first evidence batch and is
  re-verified (and revised) when later batches arrive;
* answer settings, at no added latency: ``serial_no_stop`` (no stop sequences for invented
  turns), ``serial_brief`` (an answer-first, brief prompt) and ``serial_t0.2`` (sampled at
  temperature 0.2, seeded), and the retrieval modes ``serial_dense`` and ``serial_bm25``
  (``serial_plain`` searches ``hybrid``) - each compared with ``serial_plain``.

The latency sweep ADDS an injected delay (0, 0.5, 1, 2 s) before every evidence batch after
the first (the first - the best dense hit - arrives undelayed), modelling slower sources; a
system that waits for the evidence (``answer_policy=wait``, HF lookup) waits for all of it.
Answers are greedy (``refine_temperature=0``) so accuracy differences come from the systems,
not from sampling.

Before anything is timed, every index is opened (Chroma) and searched once and one question
runs through every system (untimed, unrecorded), so no timed run pays a model load, the
embedding model's load or a Chroma open. Every ratio comes with a 95% bootstrap interval
over questions (``*_ci95``, seeded). ``spec_rewrite`` (and HF lookup) can give answers of
another length than serial RAG, so the decode and end-to-end ratios are also reported per
answer token (``*_per_token_*``: pooled seconds per generated token).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from transformers import StoppingCriteriaList

from specrag import prompts
from specrag.data.datasets import hotpot_questions, sample, squad_paragraphs, squad_questions
from specrag.evaluation import metrics
from specrag.evaluation.hf import hf_generate, stop_on_text
from specrag.evaluation.store import (
    RunLog,
    out_path,
    proposer_rules,
    say_written,
    setup_tag,
    write_results,
)
from specrag.graph.builder import build_graph
from specrag.graph.context import SpecRagContext
from specrag.graph.services import open_index
from specrag.indexing.pipeline import index_records
from specrag.models.chat import ChatLocalLM, encode_chat
from specrag.models.loading import load_lm
from specrag.models.local import decode_text, first_stop, stable_text
from specrag.models.records import write_atomically
from specrag.models.registry import local_model_name
from specrag.nodes.draft import draft_seed
from specrag.paths import cache_dir
from specrag.progress import progress_bar

SEED = 2026
SYSTEMS = [
    "no_rag",
    "serial_plain",
    "serial_lookup",
    "spec_rewrite",
    "spec_verify",
    "serial_incremental",
    "spec_verify_incremental",
]
INCREMENTAL = {"answer_policy": "incremental"}
# Answer settings measured against serial_plain (no added latency only): the old answer
# without stop sequences, a brief answer-first prompt, and sampling at T=0.2 (seeded).
SERIAL = {"draft_policy": "off", "speculation": "none"}
STYLE_SYSTEMS: dict[str, dict[str, Any]] = {
    "serial_no_stop": {**SERIAL, "stop_at_invented_turns": False},
    "serial_brief": {**SERIAL, "answer_prompt": prompts.ANSWER_BRIEF_SYSTEM},
    "serial_t0.2": {**SERIAL, "refine_temperature": 0.2, "seed": SEED},
    "serial_dense": {**SERIAL, "retrieval": "dense"},
    "serial_bm25": {**SERIAL, "retrieval": "bm25"},
}
LATENCIES = [0.0, 0.5, 1.0, 2.0]
# Bumped when what a record measures changes, so a resumed run never mixes records of two
# protocols (2: warm-up before timing; answer token counts recorded; 3: the delay is injected
# before the later evidence batches only; 4: an incremental answer takes a batch arriving within
# incremental_grace_s into its first prompt; 5: where a pass over a few more tokens costs about
# twice a step - fp32 on CPU cores - weak n-gram matches propose at most the narrow width that
# measures about one step, 2 tokens for SmolLM2: ``narrow_cap``; 6: passes of several tokens
# over the cache attend with native grouped-query attention, no copy of the keys and values -
# ``specrag.models.attention``; 7: the second weight layout of an fp32 model on CPU is packed
# by oneDNN instead of transposed, kept where its timing pays - ``specrag.models.layout``;
# 8: a benchmark audit's mends - HF baselines stop at the graph's end tokens and stop sequences
# and answer nothing where no chunk is relevant (the graph's fallback), their ttft_s counts from
# the run's start (the prompt's encoding included), draft_ttft_s counts from the run's
# origin as ttft_s does, the draft's seed is fixed (``SEED``), and the answer settings run
# beside serial_plain in the 0 s pass; 9: ``no_rag`` is the draft node's decoding - its user
# message and stop sequences - every answer stops at an invented '<evidence' block too, and
# an HF answer's tokens before a stop count a character split over tokens as the graph does;
# 10: a 30 s retrieval budget - the default 3 s held a 2 s injected delay with the draft
# decoding beside it, where serial_lookup has none - and a run a budget cut is counted;
# 11: the HotpotQA index holds the run's own paragraphs only (it kept every earlier run's:
# ``_index``), ``no_rag`` samples with the draft node's seed (``draft_seed``, since
# 2026-12-06), and HF baselines' passes per token count the stop text's tokens, as the graph's).
PROTOCOL = 11
RETRIEVAL_BUDGET_S = 30.0  # never reached at the injected delays (LATENCIES)


def budget_cut(result: dict[str, Any]) -> bool:
    """Whether a budget cut the run's search or answer (its ratio is then not the method's)."""
    said = [str(e) for e in result.get("errors") or []] + [str(result.get("reason") or "")]
    return any(
        phrase in line
        for line in said
        for phrase in ("budget", "no result within", "no answer within")
    )


def case_key(item: dict[str, Any], system: str, latency: float, setup: str) -> str:
    """Run-log key of one system on one question at one added latency, model as loaded."""
    rules = proposer_rules(setup)
    return f"{item['dataset']}|{item['id']}|{system}|{latency}|p{PROTOCOL}|{setup}{rules}"


def _index(collection: str, records: list[tuple[str, str]], log: Console) -> Path:
    """The bench index of ``collection``, holding ``records`` and nothing else.

    The sources of one set share a prefix (``squad:``, ``hotpot:``); what a run before this
    one indexed under it and this one does not is pruned: the HotpotQA index grew with every
    sample size run (414 paragraphs for a quick run, 594 after a full one), so a run's
    distractors depended on the runs before it.
    """
    directory = cache_dir() / "bench-index"
    roots = sorted({source.split(":", 1)[0] + ":" for source, _ in records})
    with progress_bar(log, transient=True) as bar:
        task = bar.add_task(f"indexing {collection}", total=len(records))
        index_records(
            records,
            directory,
            collection=collection,
            progress=lambda n: bar.update(task, completed=n),
            prune_roots=roots,
        )
    return directory


def build_datasets(n_squad: int, n_hotpot: int, log: Console) -> list[dict[str, Any]]:
    """Questions with their gold ids and the index each one searches."""
    items: list[dict[str, Any]] = []
    squad_dir = _index("bench_squad", [(p.id, p.text) for p in squad_paragraphs()], log)
    for q in sample(squad_questions(), n_squad, SEED):
        items.append(
            {
                "dataset": "squad",
                "id": q.id,
                "question": q.question,
                "answers": list(q.answers),
                "gold": list(q.gold_ids),
                "index_dir": str(squad_dir),
                "collection": "bench_squad",
            }
        )
    if n_hotpot:
        pool = hotpot_questions()
        picked = sample(pool, n_hotpot, SEED)
        others = sample(pool, 40, SEED + 1)  # a seeded pool of extra distractor paragraphs
        paragraphs = {p.id: p.text for ex in [*picked, *others] for p in ex.paragraphs}
        hot_dir = _index("bench_hotpot", list(paragraphs.items()), log)
        for q in picked:
            items.append(
                {
                    "dataset": "hotpot",
                    "id": q.id,
                    "question": q.question,
                    "answers": list(q.answers),
                    "gold": list(q.gold_ids),
                    "index_dir": str(hot_dir),
                    "collection": "bench_hotpot",
                }
            )
    return items


def run_hf_lookup(
    question: str, chunks: list[dict[str, Any]], ctx: SpecRagContext, assisted: bool = False
) -> dict[str, Any]:
    """Serial RAG answer with HF prompt lookup decoding (same prompt as ``generate``).

    ``assisted``: HF assisted generation with the context's drafter as ``assistant_model``
    instead (the pair's 0.5B for the 1.5B).
    """
    loaded = load_lm(ctx.answer_spec, ctx.device, ctx.dtype)
    ids = encode_chat(loaded, prompts.evidence_messages(question, chunks, ctx.answer_prompt))
    extra: dict[str, Any] = {"prompt_lookup_num_tokens": 10}
    if assisted:
        drafter = load_lm(local_model_name(ctx.draft_spec) or "", ctx.device, ctx.draft_dtype)
        extra = {"assistant_model": drafter.model}
    # the graph's stop rules: its end tokens and its stop sequences (cut from the text, as the
    # graph cuts them)
    stops = ctx.stop_sequences()
    res = hf_generate(
        loaded,
        ids,
        max_new_tokens=ctx.answer_max_tokens,
        eos_token_id=list(loaded.eos_token_ids),
        stopping_criteria=StoppingCriteriaList([stop_on_text(loaded.tokenizer, len(ids), stops)]),
        **extra,
    )
    if (cut := first_stop(res["answer"], stops)) is not None:
        res["answer"] = res["answer"][:cut].strip()
    decoded = res["new_tokens"]
    if (ids := res.pop("output_ids", None)) is not None:  # the answer's tokens, as the graph's
        res["new_tokens"], decoded = tokens_before_stop(loaded.tokenizer, ids, stops), len(ids)
    # per token decoded, the stop text's too, as the graph's DecodeStats counts
    res["passes_per_token"] = res["forward_passes"] / max(decoded, 1)
    return res


def tokens_before_stop(tokenizer: Any, ids: list[int], stops: Sequence[str]) -> int:
    """How many of ``ids`` the answer holds when its text is cut at the first stop sequence.

    As the graph counts (:mod:`specrag.models.local`): a token whose text starts at or after
    the cut is not the answer's. HF stops only once the stop text is written, so its raw
    count holds the stop sequence's tokens, which the graph's does not.
    """
    cut = first_stop(decode_text(tokenizer, ids), stops)
    if cut is None:
        return len(ids)
    # the graph's own text functions: a character split over tokens starts where it starts
    starts = [len(stable_text(tokenizer, ids[:i])) for i in range(len(ids))]
    return sum(1 for start in starts if start < cut)


async def run_one(
    item: dict[str, Any], system: str, latency: float, graph: Any, base: SpecRagContext
) -> dict[str, Any]:
    """One question through one system; returns the measured record."""
    ctx = replace(
        base,
        index_dir=item["index_dir"],
        collection=item["collection"],
        added_batch_latency_s=latency,
    )
    question = item["question"]
    rec: dict[str, Any] = {
        "dataset": item["dataset"],
        "qid": item["id"],
        "system": system,
        "latency": latency,
    }
    start = time.perf_counter()
    if system == "no_rag":
        model = ChatLocalLM(
            temperature=ctx.draft_temperature,
            max_new_tokens=ctx.draft_max_tokens,
            speculation="none",
            seed=draft_seed(SEED),  # the draft node's own seed from the run's (SEED)
            stop=list(ctx.stop_sequences()),  # the draft's own prompt and stop rules
        )
        first: list[float] = []
        text = ""
        async for chunk in model.astream(prompts.draft_messages(question, ctx.draft_prompt)):
            if chunk.content and not first:
                first.append(time.perf_counter() - start)
            text += str(chunk.content)
        rec.update(
            answer=text.strip(),
            ttft_s=first[0] if first else None,
            route="no_rag",
            retrieved=[],
            passes_per_token=1.0,
        )
    elif system in ("serial_lookup", "serial_hf_assisted"):
        index = open_index(ctx)
        await asyncio.sleep(latency)
        found = await asyncio.to_thread(index.search, question, ctx.top_k, ctx.retrieval)
        relevant = [c for c in found if c.score >= ctx.relevance_threshold]
        chunks = [c.as_dict() for c in relevant]
        rec["retrieve_s"] = time.perf_counter() - start
        assisted = system == "serial_hf_assisted"
        if not chunks:  # as the graph: no evidence, no generation (its fallback route), and
            # no retrieved source counted for recall (the graph's chunks are the relevant ones)
            rec.update(answer=prompts.NO_EVIDENCE_ANSWER, route="fallback", retrieved=[])
        else:
            res = await asyncio.to_thread(run_hf_lookup, question, chunks, ctx, assisted)
            rec.update(
                answer=res["answer"],
                route="generate",
                retrieved=[c["source"] for c in chunks],
                passes_per_token=res["passes_per_token"],
                new_tokens=res["new_tokens"],
                # from the run's start, as the graph's: the prompt's encoding included
                ttft_s=(res["first_step_at"] - start) if res["first_step_at"] else None,
                # everything after the target's prefill pass, as the graph's decoding stats
                # count it (a drafter's prefill included); HF's first step also carries drafts
                decode_s=res["decode_all_s"],
                # its first pass can carry several tokens too (timed before decode_all_s)
                first_step_tokens=res.get("first_step_tokens"),
                assistant_passes=res["assistant_forward_passes"],
            )
    else:
        overrides: dict[str, Any] = {
            "serial_plain": SERIAL,
            "spec_rewrite": {"refine_mode": "rewrite"},
            "spec_verify": {"refine_mode": "verify"},
            "serial_incremental": {**SERIAL, **INCREMENTAL},
            "spec_verify_incremental": {"refine_mode": "verify", **INCREMENTAL},
            **STYLE_SYSTEMS,
        }[system]
        result = await graph.ainvoke({"question": question}, context=replace(ctx, **overrides))
        stats = result.get("stats") or {}
        node_stats = stats.get(result.get("route", ""), {}) if isinstance(stats, dict) else {}
        timings = result.get("timings") or {}
        rec.update(
            answer=result.get("answer", ""),
            route=result.get("route"),
            retrieved=[c.get("source") for c in result.get("chunks") or []],
            ttft_s=timings.get("ttft_s"),
            draft_ttft_s=timings.get("draft_ttft_s"),
            passes_per_token=node_stats.get("passes_per_token"),
            new_tokens=node_stats.get("new_tokens"),
            decode_s=node_stats.get("decode_s"),
            first_step_tokens=node_stats.get("first_step_tokens"),
            finish_reason=node_stats.get("finish_reason"),
            accepted=node_stats.get("candidates_accepted"),
            proposed=node_stats.get("candidates_proposed"),
            tokens_from=node_stats.get("tokens_from"),
            proposer=node_stats.get("proposer"),
            verify=node_stats.get("verify"),
            decode_speedup_vs_plain=node_stats.get("decode_speedup_vs_plain"),
            revisions=len(result.get("revisions") or []),
            revised_chars=sum(len(r["dropped_text"]) for r in result.get("revisions") or []),
            # a budget that cut the search or the answer (its ratio is not the method's)
            budget_cut=budget_cut(result),
        )
    rec["e2e_s"] = time.perf_counter() - start
    rec["em"] = metrics.exact_match(rec["answer"], item["answers"])
    rec["f1"] = metrics.f1(rec["answer"], item["answers"])
    rec["contains"] = metrics.contains(rec["answer"], item["answers"])
    gold = set(item["gold"])
    rec["recall_at_k"] = (
        (len(gold & set(rec["retrieved"])) / len(gold)) if system != "no_rag" else None
    )
    return rec


def _finite(value: float) -> float | None:
    return value if value == value else None  # nan (no values) -> None: valid JSON


def _qkey(r: dict[str, Any]) -> str:
    return f"{r['dataset']}|{r['qid']}"


def _values(rs: list[dict[str, Any]], field: str) -> dict[str, Any]:
    """``{question: value}`` of ``field`` (rows without a value, or a zero one, left out)."""
    return {_qkey(r): r[field] for r in rs if r.get(field)}


def _per_token(rs: list[dict[str, Any]], field: str, first: bool = False) -> dict[str, Any]:
    """``{question: (seconds, tokens)}`` of ``field``.

    ``first`` leaves out the tokens of the prefill pass (decode time is measured after it):
    the model's first token and, in ``refine``, the draft opening's it verified
    (``first_step_tokens``; records without it: one).
    """
    out = {}
    for r in rs:
        tokens = (r.get("new_tokens") or 0) - ((r.get("first_step_tokens") or 1) if first else 0)
        if r.get(field) and tokens > 0:
            out[_qkey(r)] = (r[field], tokens)
    return out


INCREMENTAL_SYSTEMS = ("serial_incremental", "spec_verify_incremental")


def revised_fraction(shares: Sequence[tuple[int, int]]) -> float | None:
    """Share of the streamed characters later retracted: retracted / (retracted + final)."""
    retracted = sum(r for r, _ in shares)
    streamed = retracted + sum(n for _, n in shares)
    return retracted / streamed if streamed else None


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system and added latency: accuracy, latency and decoding figures."""
    out: dict[str, Any] = {}
    serial = {
        (r["qid"], r["latency"]): r["answer"] for r in records if r["system"] == "serial_plain"
    }
    rows_of: dict[tuple[str, float], list[dict[str, Any]]] = {}
    ci = lambda values: metrics.bootstrap_ci(values, metrics.median, seed=SEED)  # noqa: E731
    for system in [*SYSTEMS, *STYLE_SYSTEMS]:
        per: dict[str, Any] = {}
        for latency in LATENCIES:
            if (system == "no_rag" or system in STYLE_SYSTEMS) and latency:
                continue  # no retrieval / not swept
            rs = [r for r in records if r["system"] == system and r["latency"] == latency]
            if not rs:
                continue
            rows_of[(system, latency)] = rs
            ppt = [r["passes_per_token"] for r in rs if r.get("passes_per_token") is not None]
            recall = [r["recall_at_k"] for r in rs if r.get("recall_at_k") is not None]
            e2e = [r["e2e_s"] for r in rs]
            row = {
                "n": len(rs),
                "em": metrics.mean([r["em"] for r in rs]),
                "em_ci95": metrics.bootstrap_ci([r["em"] for r in rs], metrics.mean, seed=SEED),
                "f1": metrics.mean([r["f1"] for r in rs]),
                "f1_ci95": metrics.bootstrap_ci([r["f1"] for r in rs], metrics.mean, seed=SEED),
                "contains": metrics.mean([r["contains"] for r in rs]),
                "contains_ci95": metrics.bootstrap_ci(
                    [r["contains"] for r in rs], metrics.mean, seed=SEED
                ),
                "answer_tokens_mean": _finite(
                    metrics.mean([r["new_tokens"] for r in rs if r.get("new_tokens")])
                ),
                "recall_at_k": metrics.mean(recall) if recall else None,
                "recall_at_k_ci95": metrics.bootstrap_ci(recall, metrics.mean, seed=SEED),
                "ttft_s_median": _finite(
                    metrics.median([r["ttft_s"] for r in rs if r.get("ttft_s")])
                ),
                "draft_ttft_s_median": _finite(
                    metrics.median([r["draft_ttft_s"] for r in rs if r.get("draft_ttft_s")])
                ),
                "e2e_s_median": metrics.median(e2e),
                "e2e_s_median_ci95": ci(e2e),
                "e2e_s_p90": metrics.percentile(e2e, 90),
                "passes_per_token": metrics.mean(ppt) if ppt else None,
                "decode_s_mean": _finite(
                    metrics.mean([r["decode_s"] for r in rs if r.get("decode_s")])
                ),
                "routes": dict(Counter(r.get("route") for r in rs)),
                "budget_cuts": sum(bool(r.get("budget_cut")) for r in rs),
            }
            if system in ("spec_verify", "spec_rewrite", *INCREMENTAL_SYSTEMS):
                same = [
                    r["answer"] == serial.get((r["qid"], r["latency"]))
                    for r in rs
                    if (r["qid"], r["latency"]) in serial
                ]
                flags = [float(s) for s in same]
                row["identical_to_serial_plain"] = _finite(metrics.mean(flags))
                row["same_answer_as_serial"] = row["identical_to_serial_plain"]
                row["same_answer_as_serial_ci95"] = metrics.bootstrap_ci(
                    flags, metrics.mean, seed=SEED
                )
                row["identical_to_serial_plain_ci95"] = row["same_answer_as_serial_ci95"]
            if system in INCREMENTAL_SYSTEMS:
                shares = [(r.get("revised_chars") or 0, len(r["answer"])) for r in rs]
                row["revised_fraction"] = revised_fraction(shares)
                row["revised_fraction_ci95"] = metrics.bootstrap_ci(
                    shares, revised_fraction, seed=SEED
                )
                row["revisions_mean"] = metrics.mean([r.get("revisions") or 0 for r in rs])
            per[str(latency)] = row
        out[system] = per

    # ratios measured in this run, each with a bootstrap interval over questions
    def put(row: dict[str, Any], name: str, num: Any, den: Any, agg: Any) -> None:
        point, interval = metrics.ratio_ci(num, den, agg, seed=SEED)
        if point is not None:
            row[name], row[f"{name}_ci95"] = point, interval

    # ratios of totals (means) over the questions both ran, as the pair bench's: until
    # 2026-12-06 the e2e and TTFT ratios were ratios of medians (one system's median question
    # against another question of the baseline's)
    mean, per_token = metrics.mean, metrics.per_token
    for latency in LATENCIES:
        base = rows_of.get(("serial_plain", latency))
        look = rows_of.get(("serial_lookup", latency))
        for system in (
            "spec_verify",
            "spec_rewrite",
            "serial_lookup",
            *INCREMENTAL_SYSTEMS,
            *STYLE_SYSTEMS,
        ):
            if (system, latency) not in rows_of:
                continue
            rs = rows_of[(system, latency)]
            row = out[system][str(latency)]
            if base:
                put(row, "e2e_vs_serial_plain", _values(rs, "e2e_s"), _values(base, "e2e_s"), mean)
                put(
                    row,
                    "decode_vs_serial_plain",
                    _values(rs, "decode_s"),
                    _values(base, "decode_s"),
                    mean,
                )
                put(row, "ttft_vs_serial", _values(rs, "ttft_s"), _values(base, "ttft_s"), mean)
                put(
                    row,
                    "draft_ttft_vs_serial_ttft",
                    _values(rs, "draft_ttft_s"),
                    _values(base, "ttft_s"),
                    mean,
                )
                put(
                    row,
                    "e2e_per_token_vs_serial_plain",
                    _per_token(rs, "e2e_s"),
                    _per_token(base, "e2e_s"),
                    per_token,
                )
                put(
                    row,
                    "decode_per_token_vs_serial_plain",
                    _per_token(rs, "decode_s", first=True),
                    _per_token(base, "decode_s", first=True),
                    per_token,
                )
            if look and system != "serial_lookup":
                put(
                    row,
                    "e2e_vs_serial_lookup",
                    _values(rs, "e2e_s"),
                    _values(look, "e2e_s"),
                    mean,
                )
                put(
                    row,
                    "e2e_per_token_vs_serial_lookup",
                    _per_token(rs, "e2e_s"),
                    _per_token(look, "e2e_s"),
                    per_token,
                )
    return out


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _cell(row: dict[str, Any], col: str) -> str:
    """A value, with its 95% interval where the summary has one (README promises them)."""
    ci = row.get(f"{col}_ci95")
    value = _fmt(row.get(col))
    return f"{value} [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci and value != "-" else value


def _with_ci(value: Any, ci: Any) -> str:
    """``value [lo, hi]`` (or ``-``)."""
    if value is None:
        return "-"
    return f"{_fmt(value)} [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else _fmt(value)


def compare_settings(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Each answer-setting system against serial_plain (no added latency), paired by question.

    Differences of contains-gold and F1 (system minus serial_plain) and ratios of answer tokens
    and end-to-end time, each with a 95% bootstrap interval over questions.
    """
    base = {_qkey(r): r for r in records if r["system"] == "serial_plain" and not r["latency"]}
    out: dict[str, Any] = {}
    for system in STYLE_SYSTEMS:
        pairs = [(r, base[_qkey(r)]) for r in records if r["system"] == system and _qkey(r) in base]
        if not pairs:
            continue
        row: dict[str, Any] = {"n": len(pairs)}
        for field in ("contains", "f1", "recall_at_k"):
            if any(a.get(field) is None or b.get(field) is None for a, b in pairs):
                continue  # not measured for this system (e.g. no retrieval)

            def diff(ps: Any, field: str = field) -> float:
                return metrics.mean([a[field] - b[field] for a, b in ps])

            row[f"{field}_diff"] = diff(pairs)
            row[f"{field}_diff_ci95"] = metrics.bootstrap_ci(pairs, diff, seed=SEED)
        for field in ("new_tokens", "e2e_s"):  # ratios of totals
            num = {_qkey(a): a[field] for a, _ in pairs if a.get(field)}
            den = {_qkey(a): b[field] for a, b in pairs if b.get(field)}
            point, interval = metrics.ratio_ci(num, den, metrics.mean, seed=SEED)
            row[f"{field}_ratio"], row[f"{field}_ratio_ci95"] = point, interval
        out[system] = row
    return out


def settings_markdown(comparison: dict[str, Any]) -> str:
    """The answer-settings comparison as a markdown table."""
    cols = ["contains_diff", "f1_diff", "recall_at_k_diff", "new_tokens_ratio", "e2e_s_ratio"]
    lines = [
        "| system vs serial_plain (no added latency) | n | " + " | ".join(cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for system, row in comparison.items():
        cells = [_with_ci(row.get(c), row.get(f"{c}_ci95")) for c in cols]
        lines.append(f"| {system} | {row['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def save_figure(fig: Any, path: Path) -> None:
    """``fig`` as a PNG at ``path``, atomically (a cut run keeps the last whole plot)."""
    write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))


def markdown(summary: dict[str, Any]) -> str:
    """The results as a markdown table; a value with an interval as ``value [95% CI lo, hi]``."""
    cols = [
        "em",
        "f1",
        "contains",
        "answer_tokens_mean",
        "recall_at_k",
        "draft_ttft_s_median",
        "ttft_s_median",
        "e2e_s_median",
        "e2e_s_p90",
        "passes_per_token",
        "ttft_vs_serial",
        "revised_fraction",
        "decode_vs_serial_plain",
        "decode_per_token_vs_serial_plain",
        "draft_ttft_vs_serial_ttft",
        "e2e_vs_serial_plain",
        "e2e_per_token_vs_serial_plain",
        "e2e_vs_serial_lookup",
        "e2e_per_token_vs_serial_lookup",
        "identical_to_serial_plain",
    ]
    lines = [
        "| system | later batches' delay (s, injected) | " + " | ".join(cols) + " | routes |",
        "|---|---|" + "---|" * len(cols) + "---|",
    ]
    for system, per in summary.items():
        for latency, row in per.items():
            if system == "no_rag" and latency != "0.0":
                continue  # the draft alone does not wait for retrieval
            routes = ", ".join(f"{k}:{v}" for k, v in row["routes"].items())
            lines.append(
                f"| {system} | {latency} | "
                + " | ".join(_cell(row, c) for c in cols)
                + f" | {routes} |"
            )
    return "\n".join(lines) + "\n"


def _yerr(points: list[float], cis: list[Any]) -> list[list[float]]:
    """Matplotlib's asymmetric error bars from 95% intervals (0 where there is none)."""
    lo = [p - ci[0] if ci else 0.0 for p, ci in zip(points, cis, strict=True)]
    hi = [ci[1] - p if ci else 0.0 for p, ci in zip(points, cis, strict=True)]
    return [lo, hi]


def plots(summary: dict[str, Any], out_dir: Path, quick: bool = False) -> list[Path]:
    """latency.png, speedup.png and accuracy.png; error bars are the 95% bootstrap intervals.

    None without matplotlib (in the ``dev`` extra, not a dependency): one warning, the run's
    text results are written all the same.
    """
    try:
        import matplotlib
    except ImportError:
        logging.getLogger(__name__).warning(
            "plots not drawn: matplotlib is not installed (pip install matplotlib)"
        )
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system, per in summary.items():
        if system == "no_rag":
            continue
        xs = [float(k) for k in per]
        ys = [per[k]["e2e_s_median"] for k in per]
        yerr = _yerr(ys, [per[k].get("e2e_s_median_ci95") for k in per])
        ax.errorbar(xs, ys, yerr=yerr, marker="o", capsize=3, label=system)
    ax.set_xlabel("later evidence batches' delay (s, injected)")
    ax.set_ylabel("end-to-end latency, median (s; 95% CI)")
    ax.set_title("specrag bench rag: latency vs retrieval latency")
    ax.legend()
    ax.grid(alpha=0.3)
    latency_png = out_path(out_dir, "latency.png", quick)
    fig.tight_layout()
    save_figure(fig, latency_png)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system in ("spec_verify", "spec_rewrite", "serial_lookup", *INCREMENTAL_SYSTEMS):
        per = summary.get(system, {})
        keys = [k for k in per if per[k].get("e2e_vs_serial_plain") is not None]
        if not keys:
            continue
        ys = [per[k]["e2e_vs_serial_plain"] for k in keys]
        yerr = _yerr(ys, [per[k].get("e2e_vs_serial_plain_ci95") for k in keys])
        ax.errorbar([float(k) for k in keys], ys, yerr=yerr, marker="o", capsize=3, label=system)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xlabel("later evidence batches' delay (s, injected)")
    ax.set_ylabel("e2e total / serial_plain e2e total (95% CI)")
    ax.set_title("specrag bench rag: end-to-end latency relative to serial RAG")
    ax.legend()
    ax.grid(alpha=0.3)
    speedup_png = out_path(out_dir, "speedup.png", quick)
    fig.tight_layout()
    save_figure(fig, speedup_png)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    systems = list(summary)
    first = [next(iter(summary[s].values())) for s in systems]
    x = range(len(systems))
    for offset, name, label in ((-0.2, "em", "EM"), (0.2, "f1", "F1")):
        ys = [r[name] for r in first]
        ax.bar(
            [i + offset for i in x],
            ys,
            width=0.4,
            yerr=_yerr(ys, [r.get(f"{name}_ci95") for r in first]),
            capsize=3,
            label=label,
        )
    ax.set_xticks(list(x), systems, rotation=15)
    ax.set_ylabel("score (95% CI)")
    ax.set_title("specrag bench rag: accuracy per system")
    ax.legend()
    accuracy_png = out_path(out_dir, "accuracy.png", quick)
    fig.tight_layout()
    save_figure(fig, accuracy_png)
    plt.close(fig)
    return [latency_png, speedup_png, accuracy_png]


async def warm_up(items: list[dict[str, Any]], graph: Any, base: SpecRagContext) -> None:
    """Warm every component before anything is timed (untimed, unrecorded).

    Opens and searches every index in every retrieval mode the systems use (Chroma, the
    embedding model, each index's BM25 copy), then runs one question through every system
    (both models, the graph, HF's prompt-lookup path), the answer-setting ones included
    (sampling and its seeded generator, the other prompts).
    """
    await warm_indexes(items, base)
    await warm_systems(items, [*SYSTEMS, *STYLE_SYSTEMS], graph, lambda _item: base)


WARM_TRIES = 3  # questions tried per system until one reaches generation


async def warm_systems(
    items: list[dict[str, Any]],
    systems: list[str],
    graph: Any,
    context_of: Callable[[dict[str, Any]], SpecRagContext],
) -> None:
    """Run each system once, untimed and unrecorded, on a question that reaches generation.

    A question whose retrieval finds no relevant chunk takes the fallback route and warms no
    model (HF's generate never runs for it): the next of ``items`` is tried then, up to
    ``WARM_TRIES`` questions per system.
    """
    for system in systems:
        for item in items[:WARM_TRIES]:
            record = await run_one(item, system, 0.0, graph, context_of(item))
            if record.get("route") != "fallback":
                break


async def warm_indexes(items: list[dict[str, Any]], base: SpecRagContext) -> None:
    """Open and search every index of ``items`` in every retrieval mode (dense, bm25, hybrid).

    An index's BM25 copy loads on its first lexical search: one left cold loads inside the
    first timed run on it.
    """
    for index_dir, collection in sorted({(i["index_dir"], i["collection"]) for i in items}):
        index = open_index(replace(base, index_dir=index_dir, collection=collection))
        for mode in ("dense", "bm25", "hybrid"):
            await asyncio.to_thread(index.search, "warm-up", 1, mode)


def run(
    *,
    quick: bool,
    out_dir: Path,
    log: Console,
    fresh: bool = False,
    models: str = "embedded",
    sets: tuple[str, ...] | None = None,
    dtype: str = "auto",
) -> dict[str, Any]:
    """Run (or resume) the benchmark; write JSON, markdown and plots; return the summary.

    ``models="pair"`` runs the drafter/target pair plan instead (:mod:`bench_pair`), limited
    to the question ``sets`` given, with the models in ``dtype``.
    """
    if models == "pair":
        from specrag.evaluation import bench_pair

        return bench_pair.run(
            quick=quick, out_dir=out_dir, log=log, fresh=fresh, sets=sets, dtype=dtype
        )
    out_dir = out_dir / "bench_rag"
    out_dir.mkdir(parents=True, exist_ok=True)
    n_squad, n_hotpot = (4, 2) if quick else (40, 20)
    runlog = RunLog(out_path(out_dir, "runs.jsonl", quick), fresh=fresh)
    items = build_datasets(n_squad, n_hotpot, log)
    base = SpecRagContext(
        refine_temperature=0.0,
        answer_max_tokens=64,
        seed=SEED,
        retrieval_timeout_s=RETRIEVAL_BUDGET_S,
    )
    setup = setup_tag(load_lm(base.answer_spec, base.device, base.dtype))
    graph = build_graph()
    # the answer settings run beside serial_plain in the 0 s pass, question by question: their
    # e2e ratios against it compare runs minutes apart, not an hour (machine drift)
    work = [(item, "no_rag", 0.0) for item in items]
    work += [
        (item, s, lat)
        for lat in LATENCIES
        for item in items
        for s in SYSTEMS[1:] + (list(STYLE_SYSTEMS) if lat == 0.0 else [])
    ]
    keys = {case_key(item, s, lat, setup) for item, s, lat in work}
    groups: dict[tuple[str, float], list[str]] = {}  # one question's systems at one latency
    for item, s, lat in work:
        groups.setdefault((f"{item['dataset']}|{item['id']}", lat), []).append(
            case_key(item, s, lat, setup)
        )
    if redo := runlog.keep_whole(groups.values()):
        log.print(f"bench rag: {redo} records of part-run questions will be run again")

    async def go() -> None:
        if any(not runlog.done(k) for k in keys):
            log.print("bench rag: warming up (indexes, models; one untimed question)")
            await warm_up(items, graph, base)
        with progress_bar(log) as bar:
            task = bar.add_task("bench rag", total=len(work))
            for item, system, latency in work:
                key = case_key(item, system, latency, setup)
                if not runlog.done(key):
                    runlog.add(key, await run_one(item, system, latency, graph, base))
                bar.advance(task)

    asyncio.run(go())
    records = [r for k, r in runlog.records.items() if k in keys]
    summary = summarize(records)
    settings = compare_settings(records)
    texts = {
        "summary.json": json.dumps(summary, indent=2),
        "table.md": markdown(summary),
        "answer_settings.json": json.dumps(settings, indent=2),
        "answer_settings.md": settings_markdown(settings),
    }
    written = write_results(out_dir, quick, texts)  # before the plots: what a failed one spares
    files = [*written, *map(str, plots(summary, out_dir, quick)), str(runlog.path)]
    log.print(markdown(summary))
    log.print(settings_markdown(settings))
    say_written(log, files)
    return {
        "benchmark": "rag",
        "quick": quick,
        "questions": len(items),
        "added_latencies_s": LATENCIES,
        "added_latency": "injected before every evidence batch after the first",
        "systems": summary,
        "answer_settings": settings,
        "statistics": {
            "e2e_vs_*, ttft_vs_serial, draft_ttft_vs_serial_ttft, e2e_s_ratio": (
                metrics.RATIO_OF_TOTALS
            ),
            "decode_vs_serial_plain, new_tokens_ratio": metrics.RATIO_OF_MEANS,
            "*_per_token_vs_*": metrics.POOLED_PER_TOKEN,
            "*_diff": "mean over questions of (system - serial_plain), paired",
            "*_ci95": metrics.BOOTSTRAP,
        },
        "files": files,
    }
