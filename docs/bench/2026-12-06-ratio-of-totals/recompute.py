"""Every committed pair-bench run's spec_verify ratios, as ratios of medians and of totals.

Run: .venv/bin/python docs/bench/2026-12-06-ratio-of-totals/recompute.py > table.md
Reads every docs/bench/*rag-pair*/**/runs*.jsonl (quick and partial runs too; the last record
of each key); one row per set and protocol+setup, as the bench summarises one protocol's keys.
It times nothing.
Intervals: the bench's paired bootstrap (questions, seed 2026: bench_rag.SEED).
"""

import glob
import json
from pathlib import Path

from specrag.evaluation import metrics
from specrag.evaluation.bench_pair import SEED
from specrag.evaluation.bench_rag import _values

ROOT = Path(__file__).resolve().parents[1]


def fmt(point, ci):
    """A ratio and its interval as the tables print them."""
    if point is None:
        return "-"
    return f"{point:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


print(
    "| run | set | protocol, setup | n | vs serial RAG, medians | vs serial RAG, totals "
    "| vs HF prompt lookup, medians | totals | vs HF assisted, medians | totals "
    "| draft TTFT vs serial TTFT, totals |"
)
print("|---|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(str(ROOT / "*rag-pair*" / "**" / "runs*.jsonl"), recursive=True)):
    by_key = {}
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "key" in rec:
            by_key[rec["key"]] = rec
    records = list(by_key.values())
    # one row per set and protocol+setup: the bench summarises one protocol's keys only
    runs = sorted({(r["dataset"], r["key"].split("|", 4)[4]) for r in records})
    for dataset, tail in runs:
        mine = [r for r in records if r["dataset"] == dataset and r["key"].endswith(tail)]
        of = {
            s: [r for r in mine if r["system"] == s]
            for s in ("spec_verify", "serial_plain", "serial_lookup", "serial_hf_assisted")
        }
        spec = of["spec_verify"]
        if not spec:
            continue
        cells = []
        for base in ("serial_plain", "serial_lookup", "serial_hf_assisted"):
            for agg in (metrics.median, metrics.mean):
                cells.append(
                    fmt(
                        *metrics.ratio_ci(
                            _values(spec, "e2e_s"), _values(of[base], "e2e_s"), agg, seed=SEED
                        )
                    )
                )
        draft = fmt(
            *metrics.ratio_ci(
                _values(spec, "draft_ttft_s"),
                _values(of["serial_plain"], "ttft_s"),
                metrics.mean,
                seed=SEED,
            )
        )
        protocol, setup = (tail.split("|") + [""])[:2]
        where = Path(path).relative_to(ROOT).parent
        print(
            f"| {where} | {dataset} | {protocol} {setup} | {len(spec)} | "
            + " | ".join(cells)
            + f" | {draft} |"
        )
