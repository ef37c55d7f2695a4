"""``specrag bench followup``: does rewriting a follow-up question help retrieval?

Multi-turn cases are built from SQuAD v2 dev, seeded: a question that names its article's
subject ("How long is the Rhine?") becomes a follow-up with a pronoun ("How long is it?") after
a first turn about the subject ("Tell me about the Rhine." / "The Rhine is the subject of
these documents."). Each case is searched in the bench index of all 1,204 SQuAD paragraphs with
the three ``query_rewrite`` modes - ``off`` (the follow-up as asked), ``concat`` (previous
question + follow-up) and ``model`` (the draft model rewrites it) - and scored by whether the
gold paragraph is in the top 3 (recall@3), with 95% bootstrap intervals of the difference to
``off`` (paired by case).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from specrag.data.datasets import sample, squad_paragraphs, squad_questions
from specrag.evaluation import metrics
from specrag.evaluation.bench_rag import SEED, _index
from specrag.evaluation.store import say_written, write_results
from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services, open_index
from specrag.nodes.retrieve import followup_query
from specrag.progress import progress_bar

MODES = ["off", "concat", "model"]


def build_cases(n: int) -> list[dict[str, Any]]:
    """Follow-up cases: questions naming their article's title, the title made a pronoun."""
    titles = {p.id: p.title for p in squad_paragraphs()}
    pool = []
    for q in squad_questions():
        title = titles[q.gold_ids[0]].replace("_", " ")
        pattern = re.compile(rf"\b(the )?{re.escape(title)}\b", re.IGNORECASE)
        if len(title) < 4 or not pattern.search(q.question):
            continue
        follow = pattern.sub("it", q.question, count=1)
        if follow == q.question:
            continue
        pool.append(
            {
                "id": q.id,
                "title": title,
                "original": q.question,
                "followup": follow[0].upper() + follow[1:],
                "gold": list(q.gold_ids),
                "history": [
                    {"role": "user", "content": f"Tell me about {title}."},
                    {"role": "assistant", "content": f"{title} is covered in these documents."},
                ],
            }
        )
    return sample(pool, min(n, len(pool)), SEED)


def concat_query(case: dict[str, Any]) -> str:
    """The query ``query_rewrite="concat"`` searches for ``case`` (the model's fallback)."""
    previous = [t["content"] for t in case["history"] if t["role"] == "user"]
    return f"{previous[-1]} {case['followup']}" if previous else case["followup"]


def run(
    *, quick: bool, out_dir: Path, log: Console, fresh: bool = False, models: str = "embedded"
) -> dict[str, Any]:
    """Run the check; write JSON and markdown; return the summary."""
    out_dir = out_dir / ("bench_followup_pair" if models == "pair" else "bench_followup")
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = build_cases(8 if quick else 40)
    directory = _index("bench_squad", [(p.id, p.text) for p in squad_paragraphs()], log)
    base = SpecRagContext(models=models, index_dir=str(directory), collection="bench_squad")  # type: ignore[arg-type]
    index = open_index(base)
    services = Services()
    # warm-up (untimed): the draft model loads and the index answers once, so the first
    # "model" rewrite is not cut by its budget while loading (it would fall back to concat)
    log.print("bench followup: warming up (the draft model, the index; one untimed rewrite)")
    index.search("warm-up", 1, "dense")
    first = cases[0]
    for mode in MODES:
        warm = replace(base, query_rewrite=mode)  # type: ignore[arg-type]
        asyncio.run(followup_query(first["followup"], first["history"], warm, services))
    rows: list[dict[str, Any]] = []
    with progress_bar(log) as bar:
        task = bar.add_task("bench followup", total=len(cases) * len(MODES))
        for case in cases:
            row: dict[str, Any] = {"id": case["id"], "followup": case["followup"]}
            for mode in MODES:
                ctx = replace(base, query_rewrite=mode)  # type: ignore[arg-type]
                start = time.perf_counter()
                query = asyncio.run(
                    followup_query(case["followup"], case["history"], ctx, services)
                )
                rewrite_s = time.perf_counter() - start
                found = [c.source for c in index.search(query, 3, "dense")]
                row[mode] = {
                    "query": query,
                    "hit_at_3": float(bool(set(case["gold"]) & set(found))),
                    "rewrite_s": round(rewrite_s, 4),
                }
                if mode == "model":  # a late, empty or failed rewrite searches concat's query
                    row[mode]["fell_back"] = query == concat_query(case)
                bar.advance(task)
            rows.append(row)
    summary: dict[str, Any] = {"n": len(rows)}
    # how many "model" rows measured concat's query (the rewrite was late, empty or failed)
    summary["model_fell_back"] = sum(bool(r["model"].get("fell_back")) for r in rows)
    for mode in MODES:
        hits = [r[mode]["hit_at_3"] for r in rows]
        summary[mode] = {
            "recall_at_3": metrics.mean(hits),
            "recall_at_3_ci95": metrics.bootstrap_ci(hits, metrics.mean, seed=SEED),
            "rewrite_s_mean": metrics.mean([r[mode]["rewrite_s"] for r in rows]),
        }
        if mode != "off":
            pairs = [(r[mode]["hit_at_3"], r["off"]["hit_at_3"]) for r in rows]
            diff, ci = metrics.mean_diff_ci(pairs, seed=SEED)
            summary[mode]["diff_vs_off"], summary[mode]["diff_vs_off_ci95"] = diff, ci
    lines = ["| mode | recall@3 [95% CI] | diff vs off [95% CI] | rewrite s |", "|---|---|---|---|"]
    for mode in MODES:
        s = summary[mode]
        ci = s["recall_at_3_ci95"]
        d = s.get("diff_vs_off")
        dci = s.get("diff_vs_off_ci95")
        dtext = f"{d:+.3f} [{dci[0]:+.3f}, {dci[1]:+.3f}]" if d is not None and dci else "-"
        lines.append(
            f"| {mode} | {s['recall_at_3']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | {dtext} | "
            f"{s['rewrite_s_mean']:.3f} |"
        )
    lines.append(
        f"\n`model` rewrites that fell back to concat's query (late, empty or failed): "
        f"{summary['model_fell_back']} of {len(rows)}"
    )
    table = "\n".join(lines) + "\n"
    results = json.dumps({"summary": summary, "cases": rows}, indent=2)
    files = write_results(out_dir, quick, {"summary.json": results, "table.md": table})
    log.print(table)
    say_written(log, files)
    return {
        "benchmark": "followup",
        "models": models,
        "quick": quick,
        "summary": summary,
        "files": files,
    }
