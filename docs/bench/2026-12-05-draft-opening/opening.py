"""Paired run on the pair: spec_verify with the draft's first tokens verified in the prefill
pass (``open``) against the same without (``noopen``), and serial RAG (``serial``).

    .venv/bin/python docs/bench/2026-12-05-draft-opening/opening.py OUT_DIR [N_SQUAD] [N_LONG]

The bench's SQuAD sample (terse answers, 5 hybrid chunks, <= 64 tokens) and its long set
("Explain in detail", 3 chunks, <= 96 tokens), as `bench rag --models pair` asks them, with
1 s of retrieval latency injected (``added_retrieval_latency_s``, a remote store): at none
the local search delivers evidence before the 0.5B has drafted 6 tokens, the draft stops
there and every run takes ``generate`` (no draft to open with). Each question through every
system back to back in a rotated order, every path warmed first.
Writes runs.jsonl and summary.json to OUT_DIR; prints the summary.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console

import specrag.models.chat as chat
from specrag.evaluation import bench_pair
from specrag.evaluation.bench_rag import build_datasets, run_one, warm_indexes
from specrag.evaluation.metrics import ratio_ci
from specrag.graph.builder import build_graph
from specrag.graph.context import SpecRagContext
from specrag.models.loading import load_lm

SYSTEMS = ["open", "noopen", "serial"]
LATENCY_S = 1.0
REAL = {"open": "spec_verify", "noopen": "spec_verify", "serial": "serial_plain"}


def main() -> None:
    out = Path(sys.argv[1])
    n_squad = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    n_long = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    out.mkdir(parents=True, exist_ok=True)
    log = Console(stderr=True)
    items = build_datasets(max(1, n_squad), 0, log)
    items = items[:n_squad] + bench_pair.long_items(n_long, items[0])
    base = SpecRagContext(models="pair", refine_temperature=0.0, seed=bench_pair.SEED)
    load_lm(base.answer_spec, base.device, base.dtype)
    load_lm(base.draft_spec, base.device, base.draft_dtype)
    graph = build_graph()

    async def one(item, system):
        chat.DRAFT_OPENING = system != "noopen"
        ctx = replace(
            bench_pair.context_for(base, item["dataset"]), added_retrieval_latency_s=LATENCY_S
        )
        rec = await run_one(item, REAL[system], 0.0, graph, ctx)
        rec["variant"] = system
        return rec

    async def go():
        await warm_indexes(items, base)
        for item in (items[0], items[-1]):  # warm every path, both sets
            for system in SYSTEMS:
                await one(item, system)
        records = []
        with (out / "runs.jsonl").open("w") as fh:
            for q, item in enumerate(items):
                order = SYSTEMS[q % len(SYSTEMS) :] + SYSTEMS[: q % len(SYSTEMS)]
                for system in order:
                    rec = await one(item, system)
                    records.append(rec)
                    fh.write(json.dumps(rec, default=str) + "\n")
                    fh.flush()
                    log.print(
                        f"{item['dataset']} {q} {system}: {rec.get('route')} e2e "
                        f"{rec['e2e_s']:.2f}s decode {rec.get('decode_s')} from "
                        f"{rec.get('tokens_from')}"
                    )
        return records

    records = asyncio.run(go())
    summary = {"date": "2026-12-05", "added_retrieval_latency_s": LATENCY_S, "sets": {}}
    for dataset in ("squad", "long"):
        by: dict[str, dict[str, dict]] = {}
        for r in records:
            if r["dataset"] == dataset:
                by.setdefault(r["variant"], {})[r["qid"]] = r
        if not by:
            continue
        qids = list(by["open"])
        refined = [q for q in qids if by["open"][q].get("route") == "refine"]
        s = {
            "questions": len(qids),
            "open_refine_runs": len(refined),
            "noopen_refine_runs": sum(by["noopen"][q].get("route") == "refine" for q in qids),
            "answers_equal": {
                f"{a}=serial": sum(by[a][q]["answer"] == by["serial"][q]["answer"] for q in qids)
                for a in ("open", "noopen")
            },
            "draft_tokens_from": {
                a: sum((by[a][q].get("tokens_from") or {}).get("draft", 0) for q in qids)
                for a in ("open", "noopen")
            },
            "ratios": {},
        }
        for subset, keep in (("all", qids), ("refined", refined)):
            if not keep:
                continue
            for a, b in (("open", "noopen"), ("open", "serial"), ("noopen", "serial")):
                for field in ("e2e_s", "decode_s"):
                    ok = [q for q in keep if by[a][q][field] and by[b][q][field]]
                    num = {q: by[a][q][field] for q in ok}
                    den = {q: by[b][q][field] for q in ok}
                    s["ratios"][f"{subset}: {a}/{b} {field} (sum)"] = ratio_ci(
                        num, den, sum, seed=0
                    )
        summary["sets"][dataset] = s
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
