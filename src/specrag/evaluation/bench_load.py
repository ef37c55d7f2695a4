"""``specrag bench load``: many questions at once on one process and one local model.

The same questions run at concurrency 1, 4 and 16 (``graph.ainvoke`` from many asyncio tasks).
Generation on local models runs on the one process-wide model thread (up to 4 decodes step in
turn, the rest queue: on 2 CPU cores parallel decodes would only fight for the cores), so
throughput stays flat while latency grows
with the queue; what must not change is any answer. ``cross_talk`` counts runs whose answer or
sources differ from the same question's answer at concurrency 1 (greedy decoding: identical
inputs must give identical outputs). One untimed question runs first (warm-up).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console

from specrag.data.datasets import squad_paragraphs, squad_questions
from specrag.evaluation import metrics
from specrag.evaluation.bench_rag import WARM_TRIES
from specrag.evaluation.store import say_written, write_results
from specrag.graph.builder import build_graph
from specrag.graph.context import SpecRagContext
from specrag.indexing.pipeline import index_records
from specrag.models.loading import load_lm
from specrag.paths import cache_dir

LEVELS = [1, 4, 16]


class PeakRSS:
    """Samples the process's resident memory in a background thread."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.proc = psutil.Process()
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.every_s = every_s

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def load_questions(n: int) -> tuple[list[str], Path]:
    """``n`` distinct SQuAD questions about the Normans, and an index of that article."""
    directory = cache_dir() / "bench-index"
    index_records(
        [(p.id, p.text) for p in squad_paragraphs() if p.title == "Normans"],
        directory,
        collection="bench_load",
    )
    seen: list[str] = []
    for q in squad_questions():
        if q.gold_ids[0].startswith("squad:Normans:") and q.question not in seen:
            seen.append(q.question)
        if len(seen) == n:
            break
    return seen, directory


async def run_level(
    graph: Any, questions: list[str], ctx: SpecRagContext, concurrency: int
) -> dict[str, Any]:
    """All questions with ``concurrency`` in flight; per-run latency and outputs.

    ``summary.json`` keeps them under ``runs``: one record per question and level.
    """
    gate = asyncio.Semaphore(concurrency)
    outputs: list[dict[str, Any]] = [{}] * len(questions)

    async def one(i: int, question: str) -> None:
        async with gate:
            start = time.perf_counter()
            result = await graph.ainvoke({"question": question}, context=ctx)
            outputs[i] = {
                "question": question,
                "latency_s": time.perf_counter() - start,
                "answer": result.get("answer"),
                "route": result.get("route"),
                "sources": [c.get("source") for c in result.get("citations") or []],
            }

    start = time.perf_counter()
    await asyncio.gather(*(one(i, q) for i, q in enumerate(questions)))
    wall = time.perf_counter() - start
    latencies = [o["latency_s"] for o in outputs]
    return {
        "concurrency": concurrency,
        "runs": len(questions),
        "wall_s": wall,
        "throughput_qps": len(questions) / wall,
        "p50_s": metrics.median(latencies),
        "p90_s": metrics.percentile(latencies, 90),
        "outputs": outputs,
    }


def measure(questions: list[str], ctx: SpecRagContext, levels: list[int]) -> dict[str, Any]:
    """Run every level in one process; count cross-talk against concurrency 1."""
    load_lm(ctx.answer_spec, ctx.device, ctx.dtype)
    graph = build_graph()
    # warm-up, untimed: models, the embedding model and the Chroma open are paid here, not by
    # the first question at concurrency 1 - on a question that reaches an answer model (one
    # that falls back warms none: the next is tried, as bench rag's warm-up does)
    for question in questions[:WARM_TRIES]:
        warm = asyncio.run(run_level(graph, [question], ctx, 1))
        if warm["outputs"][0]["route"] != "fallback":
            break
    base_rss = psutil.Process().memory_info().rss
    results = []
    with PeakRSS() as rss:
        for level in levels:
            results.append(asyncio.run(run_level(graph, questions, ctx, level)))
    reference = {o["question"]: (o["answer"], o["sources"]) for o in results[0]["outputs"]}
    cross_talk = 0
    for res in results[1:]:
        res["mismatches"] = [
            o for o in res["outputs"] if (o["answer"], o["sources"]) != reference[o["question"]]
        ]
        cross_talk += len(res["mismatches"])
    return {
        "levels": results,
        "cross_talk": cross_talk,
        "peak_rss_mb": rss.peak / 2**20,
        "rss_growth_mb": (rss.peak - base_rss) / 2**20,
    }


def run(
    *, quick: bool, out_dir: Path, log: Console, fresh: bool = False, models: str = "embedded"
) -> dict[str, Any]:
    """Run the load benchmark; write JSON and markdown."""
    out_dir = out_dir / ("bench_load_pair" if models == "pair" else "bench_load")
    out_dir.mkdir(parents=True, exist_ok=True)
    questions, directory = load_questions(16)
    ctx = SpecRagContext(
        models=models,  # type: ignore[arg-type]
        index_dir=str(directory),
        collection="bench_load",
        refine_temperature=0.0,
        answer_max_tokens=32 if quick else 64,
        answer_timeout_s=600.0,
    )
    shorter = " (--quick: shorter answers, the same sample)" if quick else ""
    log.print(
        f"bench load: {len(questions)} questions at concurrency {LEVELS}, answers of at most "
        f"{ctx.answer_max_tokens} tokens{shorter}"
    )
    result = measure(questions, ctx, LEVELS)
    rows = [
        f"answers of at most {ctx.answer_max_tokens} new tokens"
        f"{' (--quick; a full run: 64)' if quick else ''}",
        "",
        "| concurrency | throughput (q/s) | p50 (s) | p90 (s) | mismatches vs concurrency 1 |",
        "|---|---|---|---|---|",
    ]
    for level in result["levels"]:
        rows.append(
            f"| {level['concurrency']} | {level['throughput_qps']:.3f} | "
            f"{level['p50_s']:.2f} | {level['p90_s']:.2f} | "
            f"{len(level.get('mismatches', []))} |"
        )
    table = "\n".join(rows) + (
        f"\n\ncross_talk: {result['cross_talk']}; peak RSS "
        f"{result['peak_rss_mb']:.0f} MB (+{result['rss_growth_mb']:.0f} MB "
        "during the runs)\n"
    )
    summary = {
        "benchmark": "load",
        "models": models,
        "quick": quick,
        # what --quick changes here: the answers' length (the sample is the same 16 questions)
        "answer_max_tokens": ctx.answer_max_tokens,
        "levels": {
            str(lv["concurrency"]): {
                k: lv[k] for k in ("throughput_qps", "p50_s", "p90_s", "wall_s", "runs")
            }
            for lv in result["levels"]
        },
        "cross_talk": result["cross_talk"],
        "peak_rss_mb": round(result["peak_rss_mb"], 1),
        "rss_growth_mb": round(result["rss_growth_mb"], 1),
    }
    runs = {**summary, "runs": result["levels"]}
    files = write_results(
        out_dir,
        quick,
        {"summary.json": json.dumps(runs, indent=2, default=str), "table.md": table},
    )
    log.print(table)
    say_written(log, files)
    summary["files"] = files
    return summary
