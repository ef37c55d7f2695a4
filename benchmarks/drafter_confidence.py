"""How often the drafter's next token is the target's, by the drafter's own confidence.

    python benchmarks/drafter_confidence.py --json
    python benchmarks/drafter_confidence.py --questions 4 --out results/drafter_confidence

Where the drafter is unsure, its token is often rejected, and on CPU every extra candidate
widens the target's verify pass (benchmarks/verify_cost.py). This measures, on the pair's
long-answer set (``bench rag --models pair``: SQuAD questions asked as "Explain in detail",
the three chunks hybrid retrieval returns, the detailed answer prompt), the target's own
greedy answer (96 tokens at most), then ONE teacher-forced pass of each model over prompt +
answer: at every answer position, the drafter's probability of its argmax and whether that
argmax is the target's. It then replays the answers under drafting rules - proposals of up to
``k`` tokens (fixed, or adaptive from 4: +1 after a fully accepted proposal, -1 otherwise, as
the merged proposer does) ending after the first token below a confidence cut-off - and
prices each round with the measured costs: the drafter's step ratio (measured here) per
drafted token, plus one target pass of width 1 + drafted tokens, read from a verify_cost
results file (``--verify-cost``; relative to a single step, at the 400-token cache). The
figure of merit is emitted tokens per unit of cost, where plain decoding is 1.0. A replay is
not a run: it leaves out the drafter's prefill, n-gram candidates and machine noise, and after
a drafter token the target rejects it reads the drafter's confidence in the target's context
(teacher-forced), not in the drafter's own.

Writes results.json and table.md to --out (default results/drafter_confidence); --json prints
the same document on stdout; progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from specrag_entry import loading  # the standard library only

with loading("drafter_confidence"):  # a Ctrl-C in the seconds the package loads: one line, exit 130
    from specrag.evaluation.script import Parser, ScriptError, run_script
    from specrag.models.records import write_text

BINS = [(0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 0.9), (0.9, 1.01)]
CUTS = [0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
KS = [2, 4, 8, 16]
VERIFY_COST = Path("docs/bench/2026-11-30-verify-cost/results.json")


def width_cost(table: dict[str, float]) -> Any:
    """Cost of a pass of width ``w`` relative to one step, interpolated from ``table``.

    Made monotone first (each width costs at least what a narrower one measured: single runs
    put 16 tokens below 12); past the widest measured width the cost stays at its value.
    """
    points, top = [], 0.0
    for w, c in sorted((int(w), float(c)) for w, c in table.items()):
        top = max(top, c)
        points.append((w, top))

    def cost(w: int) -> float:
        if w <= points[0][0]:
            return points[0][1]
        for (w0, c0), (w1, c1) in zip(points, points[1:], strict=False):
            if w <= w1:
                return c0 + (c1 - c0) * (w - w0) / (w1 - w0)
        return points[-1][1]

    return cost


def replay(
    conf: list[float],
    match: list[bool],
    cut: float,
    k: int,
    adaptive: bool,
    ratio: float,
    cost: Any,
) -> dict[str, float]:
    """Emitted tokens per unit cost and acceptance of one drafting rule over one answer."""
    i, spent, emitted, drafted, accepted = 0, 0.0, 0, 0, 0
    size = min(4, k) if adaptive else k
    while i < len(match):
        j = n = 0
        alive = True
        while i + j < len(match):
            alive = alive and match[i + j]
            n += alive
            j += 1
            if j >= size or conf[i + j - 1] < cut:
                break
        spent += ratio * j + cost(1 + j)
        emitted += min(n + 1, len(match) - i)  # no bonus token past the answer's end
        drafted += j
        accepted += n
        if adaptive:
            size = min(k, size + 1) if n == j else max(1, size - 1)
        i += n + 1
    return {"emitted": emitted, "cost": spent, "drafted": drafted, "accepted": accepted}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from rich.console import Console

    from specrag import prompts
    from specrag.decoding.candidates import NgramProposer
    from specrag.decoding.speculative import decode
    from specrag.decoding.state import LMState
    from specrag.evaluation.bench_pair import MAX_TOKENS, long_items
    from specrag.evaluation.bench_rag import build_datasets
    from specrag.evaluation.identity import GREEDY
    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import open_index
    from specrag.models.chat import encode_chat
    from specrag.models.loading import (
        costs_check,
        drafter_dtype,
        load_lm,
        on_model_thread,
        pair_costs,
        timed,
    )
    from specrag.progress import progress_bar

    log = Console(stderr=True)
    base = SpecRagContext(models="pair")
    target = load_lm(base.answer_spec, args.device, args.dtype)
    same = base.draft_spec == base.answer_spec
    # the drafter in the dtype the package gives it (int8 beside an fp32 or bf16 target on x86)
    ddtype = drafter_dtype(args.drafter_dtype, args.dtype, args.device, same)
    drafter = load_lm(base.draft_spec, args.device, ddtype)
    items = long_items(args.questions, build_datasets(1, 0, log)[0])
    index = open_index(SpecRagContext(index_dir=items[0]["index_dir"], collection="bench_squad"))
    positions: list[tuple[float, bool]] = []
    answers = []

    def one(item: dict[str, Any]) -> list[tuple[float, bool]]:
        chunks = [c.as_dict() for c in index.search(item["question"], 3, "hybrid")]
        ids = list(
            encode_chat(
                target,
                prompts.evidence_messages(item["question"], chunks, prompts.ANSWER_DETAILED_SYSTEM),
            )
        )
        # the target's greedy answer (evidence n-grams as candidates: the same tokens, sooner)
        steps = decode(
            LMState(target.model, target.device),
            ids,
            max_new_tokens=MAX_TOKENS["long"],
            sampler=GREEDY,
            eos_ids=target.eos_token_ids,
            proposer=NgramProposer({"prompt": ids}),
        )
        answer = [t.id for step in steps for t in step]
        full = torch.tensor([ids + answer], device=target.device)
        n = len(ids)
        with torch.inference_mode():
            zt = target.model(full).logits[0, n - 1 : -1].float()
            zd = drafter.model(full).logits[0, n - 1 : -1].float()[:, : zt.shape[-1]]
        conf, guess = torch.softmax(zd, -1).max(-1)
        hits = (guess == zt.argmax(-1)).tolist()
        answers.append({"id": item["id"], "tokens": len(answer)})
        return list(zip(conf.tolist(), hits, strict=True))

    per_answer = []
    with progress_bar(log) as bar:
        task = bar.add_task("drafter confidence", total=len(items))
        for item in items:
            rows = on_model_thread(one, item)
            per_answer.append(rows)
            positions += rows
            bar.advance(task)
    ratio = pair_costs(drafter, target).step
    cost = width_cost(args.verify_table)
    bins = []
    for lo, hi in BINS:
        hit = [m for c, m in positions if lo <= c < hi]
        bins.append(
            {
                "confidence": f"[{lo}, {min(hi, 1.0)}{']' if hi > 1 else ')'}",
                "positions": len(hit),
                "share": round(len(hit) / len(positions), 3),
                "argmax_agrees": round(sum(hit) / len(hit), 3) if hit else None,
            }
        )
    rules = []
    for cut in CUTS:
        for k in KS:
            for adaptive in (False, True):
                tot = {"emitted": 0, "cost": 0.0, "drafted": 0, "accepted": 0}
                for rows in per_answer:
                    conf = [c for c, _ in rows]
                    hits = [m for _, m in rows]
                    got = replay(conf, hits, cut, k, adaptive, ratio, cost)
                    tot = {key: tot[key] + got[key] for key in tot}
                rules.append(
                    {
                        "cut": cut,
                        "k": k,
                        "adaptive": adaptive,
                        "tokens_per_plain_step_cost": round(tot["emitted"] / tot["cost"], 3),
                        "acceptance": round(tot["accepted"] / max(1, tot["drafted"]), 3),
                    }
                )
    return {
        "models": {"target": target.name, "drafter": drafter.name},
        "device": str(target.device),
        "dtype": str(target.dtype),
        "drafter_dtype": str(drafter.dtype),
        "answers": answers,
        "positions": len(positions),
        "argmax_agrees": round(sum(m for _, m in positions) / len(positions), 3),
        "drafter_step_ratio": round(ratio, 4),
        "drafter_step_ratio_timed": timed((drafter, target), costs_check()),
        "verify_cost_file": str(args.verify_cost),
        "by_confidence": bins,
        "replay": rules,
        # per answer: [drafter confidence, drafter argmax == target argmax] at each position
        "positions_by_answer": [[[round(c, 4), int(m)] for c, m in rows] for rows in per_answer],
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{result['positions']} answer positions, drafter argmax = target argmax at "
        f"{result['argmax_agrees']:.3f}; drafter step {result['drafter_step_ratio']}x the "
        "target's",
        "",
        "| drafter confidence | positions | share | argmax agrees |",
        "|---|---|---|---|",
    ]
    for b in result["by_confidence"]:
        lines.append(
            f"| {b['confidence']} | {b['positions']} | {b['share']} | {b['argmax_agrees']} |"
        )
    lines += [
        "",
        "Replay: emitted tokens per unit cost (plain decoding = 1.0) / acceptance",
        "",
        "| cut | " + " | ".join(f"k={k} | k<={k} adaptive" for k in KS) + " |",
        "|---|" + "---|" * (2 * len(KS)),
    ]
    for cut in CUTS:
        cells = []
        for k in KS:
            for adaptive in (False, True):
                r = next(
                    x
                    for x in result["replay"]
                    if x["cut"] == cut and x["k"] == k and x["adaptive"] == adaptive
                )
                cells.append(f"{r['tokens_per_plain_step_cost']:.2f} / {r['acceptance']:.2f}")
        lines.append(f"| {cut} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=10, help="long-set questions")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--drafter-dtype", default="auto", help="auto: as the package loads it")
    parser.add_argument("--verify-cost", type=Path, default=VERIFY_COST)
    parser.add_argument("--out", type=Path, default=Path("results/drafter_confidence"))
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    if args.questions < 1:
        parser.error("--questions must be >= 1")
    try:
        args.verify_table = json.loads(args.verify_cost.read_text())["relative_to_width_1"][
            "target@400"
        ]
        width_cost(args.verify_table)(1)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ScriptError(
            f"--verify-cost {args.verify_cost}: not a verify_cost results file with "
            f"relative_to_width_1.target@400 ({type(exc).__name__}: {exc})"
        ) from None
    result = measure(args)  # a model that does not load: one line (run_script)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "results.json", json.dumps(result, indent=2))
    write_text(args.out / "table.md", markdown(result))
    print(f"drafter_confidence: results written to {args.out}/", file=sys.stderr)
    print(json.dumps(result) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_script("drafter_confidence", main))
