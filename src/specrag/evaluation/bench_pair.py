"""``specrag bench rag --models pair``: the drafter/target pair against serial RAG.

Qwen2.5-Coder-1.5B-Instruct answers, Qwen2.5-Coder-0.5B-Instruct drafts. Systems, on the same
prompts, in ONE run (retrieval from the same Chroma index, no added latency):

* ``serial_plain`` - retrieve, then the 1.5B alone with plain decoding (the reference);
* ``serial_lookup`` - retrieve, then HF ``generate(prompt_lookup_num_tokens=10)`` (1.5B);
* ``serial_hf_assisted`` - retrieve, then HF ``generate(assistant_model=<the 0.5B>)``;
* ``spec_verify`` - the graph: the 0.5B drafts while retrieval runs; the 1.5B verifies
  candidates from ONE merged proposer (the 0.5B reading the evidence, the draft, evidence
  n-grams; the cost model decides when the 0.5B proposes).

Two answer regimes, reported under their own keys of ``datasets``: ``squad`` (and, in the full
run, ``hotpot``): terse answers to SQuAD v2 / HotpotQA dev questions; ``long``: SQuAD questions
asked as "Explain in detail: ..." with a system prompt asking for a paragraph of four to six
sentences from the evidence (``prompts.ANSWER_DETAILED_SYSTEM``; up to 96 answer tokens), where
the answer is long and grounded. Every timed run comes after a warm-up of every system
(untimed, unrecorded), and every ratio has a 95% bootstrap interval over questions.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from specrag import prompts
from specrag.data.datasets import sample, squad_questions
from specrag.errors import InputError
from specrag.evaluation import metrics
from specrag.evaluation.bench_rag import (
    SEED,
    _cell,
    _qkey,
    _values,
    build_datasets,
    run_one,
    warm_indexes,
    warm_systems,
)
from specrag.evaluation.store import (
    RunLog,
    dtype_variant,
    out_path,
    proposer_rules,
    say_written,
    setup_tag,
    write_results,
)
from specrag.graph.builder import build_graph
from specrag.graph.context import SpecRagContext
from specrag.models.loading import load_lm
from specrag.progress import progress_bar

SYSTEMS = ["serial_plain", "serial_lookup", "serial_hf_assisted", "spec_verify"]
# 2: detailed prompts for the long set; ski-rental drafter join. 3 (long set only): a 300 s
# answer budget - the 60 s default cut 5 of the full run's 40 long answers (2026-11-30),
# which then differed from serial RAG's only by being shorter. Other sets keep their runs.
# 3 (squad, hotpot) and 4 (long): the interleaved cost ratio and the pay check (the drafter
# and weak n-gram matches stop when their rounds cost more per token than a plain step).
# 4 (squad, hotpot) and 5 (long): drafter proposals end at the drafter's first unsure token
# (drafter_confidence 0.7); the terse sets retrieve 5 chunks - the full run's contains-gold
# misses were mostly retrieval (recall@3 25/30; the same sample's gold paragraph is in the
# hybrid top 5 for 27/30) - the long set keeps 3, so its runs compare with protocol 4's.
# 5 (squad, hotpot) and 6 (long): the measured cost of a wide verify pass sets the candidates
# per pass (where it is about one step - bf16 with AMX, GPUs - up to 16, n-grams before the
# drafter); fp32 on CPU cores measures 3x and decodes as in protocol 4/5.
# 6 (squad, hotpot) and 7 (long): the drafter's join wait counts from the answer's first
# proposal, not from the first step no strong n-gram match took (39aff56).
# 7 (squad, hotpot) and 8 (long): where wide passes are dear (fp32 on CPU cores: a staircase,
# 2 candidates ~1.1x a step, 3 ~1.9x), the drafter's proposals and weak n-gram matches stop at
# the measured narrow width (``narrow_cap``: 2 for the 1.5B); bf16 with AMX unchanged.
# 8 (squad, hotpot) and 9 (long): the drafter runs in bf16 beside the fp32 target on a CPU with
# native bf16 (``drafter_dtype`` auto), HF assisted generation's assistant too.
# 9 (squad, hotpot) and 10 (long): the drafter's prefill is estimated from its measured prefill
# ratio (``pair_costs``: bf16 0.5B over the fp32 1.5B ~0.13x), not its step ratio (~0.37x),
# so it joined after 1.4-1.9 s of decoding instead of 2.9-4.4 s (long set, 10 vs 9).
# 10 (squad, hotpot) and 11 (long): the fp32 target keeps its linear weights in both layouts
# (``specrag.models.layout``): verify passes of 4+ tokens cost less (9 tokens 2.7x -> 2.2x a
# step) for every system that uses the same loaded model, HF's baselines included.
# 11 (squad, hotpot) and 12 (long): the drafter scores only the first 32,768 token ids plus its
# prompt's (``drafter_vocab``, ``specrag.decoding.vocab``): its step 0.88x as dear.
# 12 (squad, hotpot) and 13 (long): the drafter's linear layers run in int8 beside the fp32
# target on an x86 CPU (``drafter_dtype`` auto, ``specrag.models.int8``; a bf16 copy for wide
# passes), HF assisted generation's assistant too; its output layer is int8 and not trimmed.
# 13 (squad, hotpot) and 14 (long) were the reverted sure-confidence experiment (2af619f, its
# run logs carry them). 14 (squad, hotpot) and 15 (long): a pass of several tokens over the
# cache attends with native grouped-query attention instead of copying the keys and values
# (``specrag.models.attention``; bit-identical logits, cheaper verify passes), for every
# system - they share the loaded models. 15 (squad, hotpot) and 16 (long): the target's second
# weight layout is packed by oneDNN instead of transposed (``specrag.models.layout``: a pass of
# 8 tokens 1.3x a step instead of 1.6x), for every system that uses the loaded target.
# 16 (squad, hotpot) and 17 (long): a benchmark audit's mends (``bench_rag.PROTOCOL`` 8: HF
# baselines stop as the graph does and answer nothing without a relevant chunk, ttft_s and
# draft_ttft_s from the run's start/origin, a fixed draft seed) and every index warmed in every
# retrieval mode (the HotpotQA index's BM25 copy loaded inside its first timed run).
# 17 (squad, hotpot) and 18 (long): a separate drafter reads only the top-ranked evidence block
# (``drafter_evidence`` 1: ``docs/bench/2026-12-05-drafter-top-chunk/``; the long set's first
# run with it, 2026-12-05 01:00, was made under commit 99a58b6's label 17; that commit's join
# waited for the drafter's share of the prompt's prefill, since the next one for the whole
# prompt's, as before: ``docs/bench/2026-12-05-rag-pair-hotpot-top-block/``). Since commit
# af05a82's successor the default is every block again (1 block was level in a paired run), so
# runs of 17/18 made after it decode as 16/17 did.
# Not a protocol: since 2026-12-02 a bf16 target on an x86 CPU (``--dtype bfloat16``) gets the
# int8 drafter too (``docs/bench/2026-12-02-rag-pair-long-bf16-int8/``); ``setup_tag`` keys
# those records apart (``cpu:bfloat16+cpu:qint8``). Where wide passes are cheap (bf16 with AMX,
# a GPU; fp32 on CPU cores with the packed layout on some machines) a 1-token n-gram match
# proposes when nothing else does; ``proposer_rules`` marks bf16 and GPU setups' keys ``~ng1``,
# so their records made before that (2026-12-02 17:44) are not resumed; and since weak
# proposals stop at a timed width there too (2026-12-04 19:23), every key carries ``~wc``,
# and ``~op`` since the draft's start is verified in the prefill pass (2026-12-05). Nor is it
# one that since 2026-12-06 an answer also stops at an invented '<evidence' block
# (``prompts.INVENTED_TURNS``): no answer of the committed runs (docs/bench/*/runs*.jsonl)
# held one.
# 18 (hotpot): the HotpotQA index holds the run's own paragraphs only; it kept every earlier
# run's (a full embedded run's 594 for the pair's 494: ``bench_rag._index``, 2026-12-07).
PROTOCOL = {"squad": 17, "hotpot": 18, "long": 18}
TOP_K = {"squad": 5, "hotpot": 5, "long": 3}
BUDGET_S = 300.0  # the answer and retrieval budgets of every system: never reached
LONG_PROMPT = "Explain in detail: {question}"
MAX_TOKENS = {"squad": 64, "hotpot": 64, "long": 96}


def case_key(item: dict[str, Any], system: str, setup: str) -> str:
    """Run-log key of one system on one question with the models as loaded (:func:`setup_tag`)."""
    protocol = PROTOCOL[item["dataset"]]
    return (
        f"pair|{item['dataset']}|{item['id']}|{system}|p{protocol}|{setup}{proposer_rules(setup)}"
    )


def results_variant(dtype: str, sets: tuple[str, ...] | None) -> str:
    """The summary's file-name tag: a dtype's and a run of some sets' summaries are apart.

    A later auto run replaced a bf16 run's summary (the log keeps both), and a ``--sets long``
    run replaced the whole run's with its one set (``summary-long.json`` now).
    """
    return "-".join(v for v in (dtype_variant(dtype), "+".join(sorted(sets or ()))) if v)


def context_for(base: SpecRagContext, dataset: str) -> SpecRagContext:
    """``base`` as this bench runs every system on a question of ``dataset``.

    Every answer is timed to its end, never cut by a budget: the HF baselines have none. (The
    terse sets ran under the default 60 s answer and 3 s retrieval budgets until 2026-12-06;
    no committed record took over 53 s end to end or fell back, so none was cut.)
    """
    ctx = replace(
        base,
        answer_max_tokens=MAX_TOKENS[dataset],
        top_k=TOP_K[dataset],
        answer_timeout_s=BUDGET_S,
        retrieval_timeout_s=BUDGET_S,
    )
    if dataset == "long":  # every system gets the same detailed prompts
        ctx = replace(
            ctx,
            answer_prompt=prompts.ANSWER_DETAILED_SYSTEM,
            draft_prompt=prompts.DRAFT_DETAILED_SYSTEM,
        )
    return ctx


def long_items(n: int, squad_item: dict[str, Any]) -> list[dict[str, Any]]:
    """SQuAD questions (a sample apart from the terse one) asked as 'explain in detail'."""
    out = []
    for q in sample(squad_questions(), n, SEED + 7):
        out.append(
            {
                **squad_item,
                "dataset": "long",
                "id": q.id,
                "question": LONG_PROMPT.format(question=q.question),
                "answers": list(q.answers),
                "gold": list(q.gold_ids),
            }
        )
    return out


def _sum_sources(rs: list[dict[str, Any]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for r in rs:
        total.update(r.get("tokens_from") or {})
    return dict(total)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """``{dataset: {system: row}}`` with accuracy, latency and ratios against serial_plain."""
    out: dict[str, Any] = {}
    # Ratios are of totals (means) over the questions both systems ran: ratios of medians,
    # until 2026-12-06, read 0.550x on a long set whose total was 0.654x (six of its ten
    # answers above 0.6x), the goal's verdict hanging on which question was the median
    mean, median = metrics.mean, metrics.median
    for dataset in sorted({r["dataset"] for r in records}):
        rows: dict[str, Any] = {}
        recs = [r for r in records if r["dataset"] == dataset]
        base = [r for r in recs if r["system"] == "serial_plain"]
        serial = {_qkey(r): r["answer"] for r in base}
        hf = {
            s: [r for r in recs if r["system"] == s]
            for s in ("serial_lookup", "serial_hf_assisted")
        }
        for system in SYSTEMS:
            rs = [r for r in recs if r["system"] == system]
            if not rs:
                continue
            e2e = [r["e2e_s"] for r in rs]
            same = [float(r["answer"] == serial[_qkey(r)]) for r in rs if _qkey(r) in serial]
            row: dict[str, Any] = {
                "n": len(rs),
                "contains": mean([r["contains"] for r in rs]),
                "contains_ci95": metrics.bootstrap_ci([r["contains"] for r in rs], mean, seed=SEED),
                "f1": mean([r["f1"] for r in rs]),
                "em": mean([r["em"] for r in rs]),
                "same_answer_as_serial": mean(same) if same else None,
                "answer_tokens_mean": mean([r["new_tokens"] for r in rs if r.get("new_tokens")]),
                "e2e_s_median": median(e2e),
                "ttft_s_median": median([r["ttft_s"] for r in rs if r.get("ttft_s")]),
                "routes": dict(Counter(r.get("route") for r in rs)),
                # answers a budget cut (the HF baselines have none): 0 where the bench holds
                "cut_by_budget": sum(r.get("finish_reason") == "time" for r in rs),
            }
            draft_ttft = [r["draft_ttft_s"] for r in rs if r.get("draft_ttft_s")]
            if draft_ttft:
                row["draft_ttft_s_median"] = median(draft_ttft)
            if system == "spec_verify":
                row["tokens_from"] = _sum_sources(rs)
                row["drafter_used"] = dict(
                    Counter(str((r.get("proposer") or {}).get("drafter_used")) for r in rs)
                )
                row["drafter_decisions"] = sorted(
                    {str((r.get("proposer") or {}).get("why")) for r in rs}
                )

            def put(name: str, num: Any, den: Any, agg: Any, row: dict[str, Any] = row) -> None:
                point, interval = metrics.ratio_ci(num, den, agg, seed=SEED)
                row[name], row[f"{name}_ci95"] = point, interval

            if system != "serial_plain" and base:
                put("e2e_vs_serial_plain", _values(rs, "e2e_s"), _values(base, "e2e_s"), mean)
                put(
                    "decode_vs_serial_plain",
                    _values(rs, "decode_s"),
                    _values(base, "decode_s"),
                    mean,
                )
                if draft_ttft:
                    put(
                        "draft_ttft_vs_serial_ttft",
                        _values(rs, "draft_ttft_s"),
                        _values(base, "ttft_s"),
                        mean,
                    )
            if system == "spec_verify":
                for name, hrs in hf.items():
                    if hrs:
                        put(f"e2e_vs_{name}", _values(rs, "e2e_s"), _values(hrs, "e2e_s"), mean)
            rows[system] = row
        out[dataset] = rows
    return out


def markdown(summary: dict[str, Any]) -> str:
    """One table per dataset; ratios as ``value [95% CI]``."""
    cols = [
        "contains",
        "same_answer_as_serial",
        "answer_tokens_mean",
        "draft_ttft_s_median",
        "ttft_s_median",
        "e2e_s_median",
        "decode_vs_serial_plain",
        "e2e_vs_serial_plain",
        "draft_ttft_vs_serial_ttft",
        "e2e_vs_serial_lookup",
        "e2e_vs_serial_hf_assisted",
    ]

    parts = []
    for dataset, rows in summary.items():
        parts.append(f"\n### {dataset}\n")
        parts.append("| system | " + " | ".join(cols) + " | tokens_from | routes |")
        parts.append("|---|" + "---|" * (len(cols) + 2))
        for system, row in rows.items():
            src = ", ".join(f"{k}:{v}" for k, v in (row.get("tokens_from") or {}).items())
            routes = ", ".join(f"{k}:{v}" for k, v in row["routes"].items())
            parts.append(
                f"| {system} | "
                + " | ".join(_cell(row, c) for c in cols)
                + f" | {src or '-'} | {routes} |"
            )
    return "\n".join(parts) + "\n"


def run(
    *,
    quick: bool,
    out_dir: Path,
    log: Console,
    fresh: bool = False,
    sets: tuple[str, ...] | None = None,
    dtype: str = "auto",
) -> dict[str, Any]:
    """Run (or resume) the pair benchmark; write JSON and markdown; return the summary.

    ``sets``: only these question sets (``squad``, ``hotpot``, ``long``; default all).
    ``dtype``: the answer model's dtype (``auto``: fp32 on CPU; the drafter's follows
    :func:`specrag.models.loading.drafter_dtype`); its runs are recorded apart.
    """
    out_dir = out_dir / "bench_rag_pair"
    out_dir.mkdir(parents=True, exist_ok=True)
    n_squad, n_hotpot, n_long = (4, 0, 3) if quick else (30, 10, 10)
    sizes = {"squad": n_squad, "hotpot": n_hotpot, "long": n_long}
    if empty := [s for s in sets or () if not sizes.get(s)]:  # before anything loads
        raise InputError(  # e.g. --quick --sets hotpot: the quick sample has no HotpotQA
            f"--sets {','.join(empty)}: the {'quick ' if quick else ''}sample has no such "
            f"question (it has {', '.join(f'{n} {s}' for s, n in sizes.items() if n)})"
        )
    runlog = RunLog(out_path(out_dir, "runs.jsonl", quick), fresh=fresh)
    items = build_datasets(n_squad, n_hotpot, log)
    items += long_items(n_long, items[0])
    if sets is not None:
        items = [i for i in items if i["dataset"] in sets]
    base = SpecRagContext(models="pair", refine_temperature=0.0, dtype=dtype, seed=SEED)
    log.print("bench rag (pair): loading Qwen2.5-Coder 0.5B and 1.5B")
    target = load_lm(base.answer_spec, base.device, base.dtype)
    drafter = load_lm(base.draft_spec, base.device, base.draft_dtype)
    graph = build_graph()
    work = [(item, system) for item in items for system in SYSTEMS]
    setup = setup_tag(target, drafter)
    keys = {case_key(item, s, setup) for item, s in work}
    groups: dict[str, list[str]] = {}  # one question's systems
    for item, s in work:
        groups.setdefault(f"{item['dataset']}|{item['id']}", []).append(case_key(item, s, setup))
    if redo := runlog.keep_whole(groups.values()):
        log.print(f"bench rag (pair): {redo} records of part-run questions will be run again")

    async def go() -> None:
        if any(not runlog.done(k) for k in keys):
            log.print("bench rag (pair): warming up (indexes, both models, every system)")
            await warm_indexes(items, base)  # every index, every mode (BM25 copies too)
            await warm_systems(  # the last sets' questions first (the long answers)
                items[::-1], SYSTEMS, graph, lambda item: context_for(base, item["dataset"])
            )
        with progress_bar(log) as bar:
            task = bar.add_task("bench rag (pair)", total=len(work))
            for item, system in work:
                key = case_key(item, system, setup)
                if not runlog.done(key):
                    runlog.add(
                        key,
                        await run_one(item, system, 0.0, graph, context_for(base, item["dataset"])),
                    )
                bar.advance(task)

    asyncio.run(go())
    records = [r for k, r in runlog.records.items() if k in keys]
    summary = metrics.json_ready(summarize(records))
    texts = {"summary.json": json.dumps(summary, indent=2), "table.md": markdown(summary)}
    files = [*write_results(out_dir, quick, texts, results_variant(dtype, sets)), str(runlog.path)]
    log.print(markdown(summary))
    say_written(log, files)
    return {
        "benchmark": "rag",
        "models": "pair",
        "quick": quick,
        "questions": {d: sum(1 for i in items if i["dataset"] == d) for d in summary},
        "answer_max_tokens": MAX_TOKENS,
        "top_k": TOP_K,
        "protocol": PROTOCOL,
        "dtype": str(target.dtype),
        "drafter_dtype": str(drafter.dtype),
        # each model's load time (its first load in this process), outside every
        # timing above: the drafter's is the cost of a second model that HF assisted pays too
        "load_s": {"target": target.load_seconds, "drafter": drafter.load_seconds},
        "systems_note": "serial_plain = the 1.5B alone; spec_verify = draft + merged proposer",
        "datasets": summary,
        "statistics": {
            "e2e_vs_*, draft_ttft_vs_serial_ttft": metrics.RATIO_OF_TOTALS,
            "decode_vs_serial_plain": metrics.RATIO_OF_MEANS + " (total decode time)",
            "contains_ci95": "the mean's 95% percentile bootstrap interval over questions",
            "*_ci95": metrics.BOOTSTRAP,
        },
        "files": files,
    }
