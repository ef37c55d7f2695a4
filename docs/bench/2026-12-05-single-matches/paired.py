"""Paired run on the pair's long-answer set: spec_verify with 1-token n-gram matches where
nothing else proposes and a narrow pass costs about a step (``single``, the built code) against
the same code with them off (``nosingle``: the plan of the day before), and HF prompt lookup.

    .venv/bin/python docs/bench/2026-12-05-single-matches/paired.py OUT_DIR [N] [single,nosingle,lookup]

Each question through both systems back to back in a rotated order, every path warmed first.
Writes runs.jsonl and summary.json to OUT_DIR; prints the summary.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from statistics import median

from specrag.evaluation import bench_pair
from specrag.evaluation.bench_rag import build_datasets, run_one
from specrag.evaluation.metrics import ratio_ci
from specrag.graph.builder import build_graph
from specrag.graph.context import SpecRagContext
from specrag.graph.services import open_index
from specrag.models.loading import load_lm
from rich.console import Console

import specrag.models.chat as chat

SYSTEMS = sys.argv[3].split(",") if len(sys.argv) > 3 else ["single", "nosingle", "lookup"]
REAL = {"lookup": "serial_lookup"}
VARIANT = {"now": "single"}
_plan = chat.ChatLocalLM._verify_plan


def plan(self, loaded, speculation):
    out = _plan(self, loaded, speculation)
    if VARIANT["now"] == "nosingle" and not out.get("cheap"):
        out = {**out, "single_matches": False}
    return out


chat.ChatLocalLM._verify_plan = plan


def main() -> None:
    out = Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    out.mkdir(parents=True, exist_ok=True)
    log = Console(stderr=True)
    items = build_datasets(1, 0, log)
    items = bench_pair.long_items(n, items[0])
    base = SpecRagContext(models="pair", refine_temperature=0.0)
    load_lm(base.answer_spec, base.device, base.dtype)
    load_lm(base.draft_spec, base.device, base.draft_dtype)
    graph = build_graph()
    base = replace(
        base,
        answer_max_tokens=bench_pair.MAX_TOKENS["long"],
        top_k=bench_pair.TOP_K["long"],
        answer_prompt=bench_pair.prompts.ANSWER_DETAILED_SYSTEM,
        draft_prompt=bench_pair.prompts.DRAFT_DETAILED_SYSTEM,
        answer_timeout_s=bench_pair.BUDGET_S,  # LONG_ANSWER_TIMEOUT_S (300 s) until bcfcabf
    )

    async def one(item, system):
        real = REAL.get(system, "spec_verify")
        VARIANT["now"] = system
        rec = await run_one(item, real, 0.0, graph, base)
        rec["variant"] = system
        return rec

    async def go():
        index = open_index(replace(base, index_dir=items[0]["index_dir"], collection=items[0]["collection"]))
        await asyncio.to_thread(index.search, "warm-up", 1)
        for system in SYSTEMS:  # warm every path
            await one(items[-1], system)
        records = []
        with (out / "runs.jsonl").open("w") as fh:
            for q, item in enumerate(items):
                order = SYSTEMS[q % len(SYSTEMS) :] + SYSTEMS[: q % len(SYSTEMS)]
                for system in order:
                    rec = await one(item, system)
                    records.append(rec)
                    fh.write(json.dumps(rec, default=str) + "\n")
                    fh.flush()
                    ledger = (rec.get("proposer") or {}).get("cost_ledger") or {}
                    log.print(
                        f"{q} {system}: e2e {rec['e2e_s']:.2f}s decode {rec.get('decode_s')} "
                        f"ppt {rec.get('passes_per_token')} from {rec.get('tokens_from')} "
                        f"rounds {({k: v.get('rounds') for k, v in ledger.items()})}"
                    )
        return records

    records = asyncio.run(go())
    by = {}
    for r in records:
        by.setdefault(r["variant"], {})[r["qid"]] = r
    summary = {"questions": len(items), "answers_equal_all": {}, "ratios": {}}
    for s in SYSTEMS:
        summary["answers_equal_all"][s] = sum(
            by[s][q]["answer"] == by["single"][q]["answer"] for q in by["single"]
        )
    pairs = [(a, b) for a in SYSTEMS for b in ("nosingle", "lookup") if a != b and b in SYSTEMS]
    for a, b in pairs:
        for field in ("e2e_s", "decode_s"):
            num = {q: by[a][q][field] for q in by[a]}
            den = {q: by[b][q][field] for q in by[b]}
            summary["ratios"][f"{a}/{b} {field} (median)"] = ratio_ci(num, den, median, seed=0)
            summary["ratios"][f"{a}/{b} {field} (sum)"] = ratio_ci(num, den, sum, seed=0)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
