"""Paired run on the pair's long-answer set: does the drafter pay more when its proposals are
not capped at the narrow width (2 candidates), as HF assisted generation drafts?

    .venv/bin/python docs/bench/2026-12-02-drafter-wide/variants.py OUT_DIR [N_QUESTIONS]

Variants of spec_verify (the graph, as `bench rag --models pair --sets long` runs it), and HF
assisted generation with the same int8 0.5B, on the same prompts, each question through every
system in a rotated order (drift of the machine's speed spreads over all of them):

* ``base``  - today: drafter proposals stop at the narrow width (2), k adaptive 4..8, cut 0.7;
* ``wide8`` - no narrow cap for the drafter: k adaptive 4..8, cut 0.7 (weak n-grams keep theirs);
* ``wide16`` - no narrow cap, k adaptive from 8 up to 16, cut 0.7;
* ``hf_like`` - drafter proposals as HF assisted generation makes them: up to 16 tokens while
  the drafter gives its token >= 0.4, no narrow cap, verified 16 at most without shrinking;
* ``hf_like0`` - ``hf_like`` with the drafter joining at the answer's first token;
* ``hf`` - serial_hf_assisted.

Writes runs.jsonl and summary.json to OUT_DIR; prints the summary.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from dataclasses import replace
from pathlib import Path
from statistics import median

import specrag.models.chat as chat
from specrag.decoding.drafter import MergedProposer
from specrag.evaluation import bench_pair
from specrag.evaluation.bench_rag import build_datasets, run_one
from specrag.evaluation.metrics import ratio_ci
from specrag.graph.builder import build_graph
from specrag.graph.context import SpecRagContext
from specrag.graph.services import open_index
from specrag.models.loading import load_lm
from rich.console import Console

VARIANT = {"name": "base"}


class Variant(MergedProposer):
    # not a dataclass: MergedProposer's generated __init__ would not call a __post_init__
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        name = VARIANT["name"]
        if name in ("wide8", "wide16"):
            self.narrow = 0
        if name == "wide16":
            self.policy = replace(self.policy, start_k=8, max_k=16)
        if name in ("hf_like", "hf_like0"):  # as HF assisted drafts: 16 tokens while >= 0.4 sure
            self.narrow = 0
            self.policy = replace(self.policy, start_k=16, max_k=16, min_confidence=0.4)
        if name == "hf_like0":  # ... and from the answer's first token, as HF does
            self.policy = replace(self.policy, join_factor=0.0, after_tokens=0)


_decode = chat.decode


def decode(*args, **kwargs):
    if VARIANT["name"] in ("hf_like", "hf_like0"):  # verify up to 16 candidates, no shrinking after a rejection
        kwargs.update(max_candidates=16, shrink_k=False)
    return _decode(*args, **kwargs)


chat.MergedProposer = Variant  # type: ignore[misc]
chat.decode = decode
SYSTEMS = sys.argv[3].split(",") if len(sys.argv) > 3 else ["base", "wide8", "wide16", "hf"]


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
        VARIANT["name"] = system
        real = "serial_hf_assisted" if system == "hf" else "spec_verify"
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
                    log.print(
                        f"{q} {system}: e2e {rec['e2e_s']:.2f}s decode {rec.get('decode_s')} "
                        f"ppt {rec.get('passes_per_token')} from {rec.get('tokens_from')}"
                    )
        return records

    records = asyncio.run(go())
    by = {}
    for r in records:
        by.setdefault(r["variant"], {})[r["qid"]] = r
    summary = {"questions": len(items), "answers_equal_base": {}, "ratios": {}}
    for s in SYSTEMS:
        summary["answers_equal_base"][s] = sum(
            by[s][q]["answer"] == by["base"][q]["answer"] for q in by["base"]
        )
    pairs = [(a, b) for a in SYSTEMS for b in ("base", "hf") if a != b and b in SYSTEMS]
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
