"""Paired run on the pair's long-answer set: does the drafter pay more when it reads only the
top-ranked evidence block (a third of the prompt to prefill) instead of the target's whole prompt?

    .venv/bin/python docs/bench/2026-12-05-drafter-top-chunk/variants.py OUT_DIR [N] [SYSTEMS]

Variants of spec_verify (the graph, as `bench rag --models pair --sets long` runs it) and HF
prompt lookup on the same prompts, each question through every system in a rotated order:

* ``base`` - today: the drafter reads the target's prompt (3 evidence blocks);
* ``top1`` - the drafter's prompt keeps only evidence block 1 (the target's is unchanged, so
  the answer must stay token-identical);
* ``top2`` - blocks 1 and 2;
* ``lookup`` - serial_lookup (HF prompt lookup), the best HF baseline on this set.

Writes runs.jsonl and summary.json to OUT_DIR; prints the summary.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
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
TOKENIZER: list = []
_BLOCK = re.compile(r'\n*<evidence id="(\d+)"[^>]*>.*?</evidence>', re.S)


def keep_blocks(ids: list[int], n: int) -> list[int]:
    """``ids`` re-encoded with the evidence blocks after the first ``n`` removed."""
    tok = TOKENIZER[0]
    text = tok.decode(ids, skip_special_tokens=False)
    cut = _BLOCK.sub(lambda m: m.group(0) if int(m.group(1)) <= n else "", text)
    return tok(cut, add_special_tokens=False)["input_ids"]



class Variant(MergedProposer):
    # not a dataclass: MergedProposer's generated __init__ would not call a __post_init__
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        name = VARIANT["name"]
        if name in ("top1", "top2") and self.drafter is not None:
            before = len(self.drafter.prompt)
            self.drafter.prompt = keep_blocks(self.drafter.prompt, int(name[-1]))
            VARIANT.setdefault("prompts", []).append((name, before, len(self.drafter.prompt)))


chat.MergedProposer = Variant  # type: ignore[misc]
SYSTEMS = sys.argv[3].split(",") if len(sys.argv) > 3 else ["base", "top1", "lookup"]
REAL = {"lookup": "serial_lookup"}


def main() -> None:
    out = Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    out.mkdir(parents=True, exist_ok=True)
    log = Console(stderr=True)
    items = build_datasets(1, 0, log)
    items = bench_pair.long_items(n, items[0])
    base = SpecRagContext(models="pair", refine_temperature=0.0)
    TOKENIZER.append(load_lm(base.answer_spec, base.device, base.dtype).tokenizer)
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
        real = REAL.get(system, "spec_verify")
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
    pairs = [(a, b) for a in SYSTEMS for b in ("base", "lookup") if a != b and b in SYSTEMS]
    for a, b in pairs:
        for field in ("e2e_s", "decode_s"):
            num = {q: by[a][q][field] for q in by[a]}
            den = {q: by[b][q][field] for q in by[b]}
            summary["ratios"][f"{a}/{b} {field} (median)"] = ratio_ci(num, den, median, seed=0)
            summary["ratios"][f"{a}/{b} {field} (sum)"] = ratio_ci(num, den, sum, seed=0)
    summary["drafter_prompts"] = VARIANT.get("prompts", [])
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
