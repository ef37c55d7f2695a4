"""``specrag bench retrieval``: recall@3 of dense, BM25 and hybrid retrieval on SQuAD v2 dev.

Every answerable SQuAD v2 dev question (full run) or a seeded sample of 300 (``--quick``) is
searched in the index of all 1,204 dev paragraphs (1,487 chunks: a long paragraph is split)
in each ``retrieval`` mode; a hit is the gold paragraph among the top 3 chunks' sources (one
paragraph may fill two of them). Differences to ``dense`` are paired by question, with 95%
bootstrap intervals. Retrieval only: no language model runs. ``runs.jsonl`` keeps one record
per question (its gold ids, and per mode the 3 sources found and whether one was gold).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from specrag.data.datasets import sample, squad_paragraphs, squad_questions
from specrag.evaluation import metrics
from specrag.evaluation.bench_rag import SEED, _index
from specrag.evaluation.store import out_path, say_written, write_results
from specrag.indexing.pipeline import open_for_writing
from specrag.progress import progress_bar

MODES = ["dense", "bm25", "hybrid"]


def run(
    *, quick: bool, out_dir: Path, log: Console, fresh: bool = False, models: str = "embedded"
) -> dict[str, Any]:
    """Run the comparison; write JSON and markdown; return the summary."""
    out_dir = out_dir / "bench_retrieval"
    out_dir.mkdir(parents=True, exist_ok=True)
    questions = squad_questions()
    if quick:
        questions = sample(questions, 300, SEED)
    directory = _index("bench_squad", [(p.id, p.text) for p in squad_paragraphs()], log)
    index = open_for_writing(directory, "bench_squad", "embedded")
    index.refresh_lexical()
    for mode in MODES:  # warm-up: BM25 loaded, embedding model warm
        index.search("warm-up", 3, mode)
    hits: dict[str, list[float]] = {m: [] for m in MODES}
    seconds: dict[str, float] = dict.fromkeys(MODES, 0.0)
    runs = out_path(out_dir, "runs.jsonl", quick)
    partial = runs.with_name(f".{runs.name}.part")  # the last whole run's stays until this ends
    try:
        with progress_bar(log) as bar, partial.open("w", encoding="utf-8") as records:
            task = bar.add_task("bench retrieval", total=len(questions))
            for q in questions:
                record: dict[str, Any] = {"qid": q.id, "question": q.question, "gold": q.gold_ids}
                for mode in MODES:
                    start = time.perf_counter()
                    found = [c.source for c in index.search(q.question, 3, mode)]
                    seconds[mode] += time.perf_counter() - start
                    hit = bool(set(found) & set(q.gold_ids))
                    hits[mode].append(float(hit))
                    record[mode] = {"found": found, "hit": hit}
                records.write(json.dumps(record) + "\n")
                bar.advance(task)
        partial.replace(runs)
    finally:
        partial.unlink(missing_ok=True)  # a run cut short leaves no part behind
    summary: dict[str, Any] = {"n": len(questions), "k": 3}
    for mode in MODES:
        row = {
            "recall_at_3": metrics.mean(hits[mode]),
            "recall_at_3_ci95": metrics.bootstrap_ci(hits[mode], metrics.mean, seed=SEED),
            "search_ms_mean": 1000 * seconds[mode] / max(1, len(questions)),
        }
        if mode != "dense":
            pairs = list(zip(hits[mode], hits["dense"], strict=True))
            row["diff_vs_dense"], row["diff_vs_dense_ci95"] = metrics.mean_diff_ci(pairs, seed=SEED)
        summary[mode] = row
    lines = [
        "| mode | recall@3 [95% CI] | vs dense, paired [95% CI] | search ms |",
        "|---|---|---|---|",
    ]
    for mode in MODES:
        r = summary[mode]
        ci = r["recall_at_3_ci95"]
        d, dci = r.get("diff_vs_dense"), r.get("diff_vs_dense_ci95")
        dtext = f"{d:+.3f} [{dci[0]:+.3f}, {dci[1]:+.3f}]" if d is not None and dci else "-"
        lines.append(
            f"| {mode} | {r['recall_at_3']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | {dtext} | "
            f"{r['search_ms_mean']:.1f} |"
        )
    table = "\n".join(lines) + "\n"
    texts = {"summary.json": json.dumps(summary, indent=2), "table.md": table}
    files = [*write_results(out_dir, quick, texts), str(runs)]
    log.print(table)
    say_written(log, files)
    return {"benchmark": "retrieval", "quick": quick, "summary": summary, "files": files}
