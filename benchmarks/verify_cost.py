"""What one verify pass costs by its width (tokens per pass), relative to a plain step.

    python benchmarks/verify_cost.py --models pair --json
    python benchmarks/verify_cost.py --models pair --device cuda --caches 400,4000

Speculative decoding pays when a pass over k candidates costs little more than a single
step. On a GPU that holds; on CPU cores it does not, and the cost model has to know it (the
merged proposer's pay check, README "The cost model"). For each model of the preset and each
cache length: the minimum of ``--reps`` timed passes per width after one warm-up pass
(the cache is cropped back after each), and the drafter/target step ratio the cost model
measures (``specrag.models.loading.pair_costs``). A model loaded with both weight layouts
(``specrag.models.layout``: fp32 on CPU, where it pays) is timed with the usual layout alone
too (``<role>@<cache>/single layout``). Writes results.json to --out (default
results/verify_cost); --json prints the same document on stdout; logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from specrag_entry import loading  # the standard library only

with loading("verify_cost"):  # a Ctrl-C in the seconds the package loads: one line, exit 130
    from specrag.evaluation.script import Parser, run_script
    from specrag.models.records import write_text


def ints(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (an argparse type: a bad list is a usage error)."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return out


def widths_cost(loaded: Any, cache: int, widths: list[int], reps: int) -> dict[str, float]:
    """Seconds of one pass per width on a ``cache``-token KV cache (min over ``reps``)."""
    import torch

    from specrag.decoding.state import LMState

    vocab = int(loaded.model.config.vocab_size)

    def sync() -> None:
        if loaded.device.type == "cuda":
            torch.cuda.synchronize(loaded.device)

    out: dict[str, float] = {}
    with torch.inference_mode():
        lm = LMState(loaded.model, loaded.device)
        lm.extend([(40 + i) % vocab for i in range(cache)], all_logits=False)
        for width in widths:
            times = []
            for rep in range(reps + 1):  # one untimed pass first: every width warmed
                n = len(lm)
                sync()
                t0 = time.perf_counter()
                lm.extend([(300 + j) % vocab for j in range(width)])
                sync()
                if rep:
                    times.append(time.perf_counter() - t0)
                lm.crop(n)
            out[str(width)] = min(times)  # rounded where printed: the ratios use these
    return out


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", choices=["embedded", "pair"], default="pair")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--drafter-dtype", default="auto", help="auto: as the package loads it")
    parser.add_argument("--caches", type=ints, default=[400, 4000], help="cache lengths")
    parser.add_argument("--widths", type=ints, default=[1, 2, 4, 5, 8, 12, 16])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/verify_cost"))
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)

    if args.reps < 1:
        parser.error("--reps must be >= 1")
    if 1 not in args.widths:  # every ratio is to one step (drafter_confidence.py reads them)
        parser.error("--widths must include 1 (the ratios are to a single step)")

    from specrag.graph.context import MODEL_PRESETS
    from specrag.models import layout
    from specrag.models.loading import (
        costs_check,
        drafter_dtype,
        load_lm,
        on_model_thread,
        pair_costs,
        timed,
    )

    drafter_name, target_name = MODEL_PRESETS[args.models]
    target = load_lm(target_name, args.device, args.dtype)  # a load error: one line (run_script)
    same = drafter_name == target_name
    # the drafter in the dtype the package gives it (int8 beside an fp32 or bf16 target on x86)
    ddtype = drafter_dtype(args.drafter_dtype, args.dtype, args.device, same)
    drafter = load_lm(drafter_name, args.device, ddtype)
    models = {"target": target}
    if drafter.key != target.key:
        models["drafter"] = drafter
    result: dict[str, Any] = {
        "models": {role: m.name for role, m in models.items()},
        "device": str(target.device),
        "dtype": str(target.dtype),
        "drafter_dtype": str(drafter.dtype),
        "reps": args.reps,
        "seconds_by_width": {},
        "relative_to_width_1": {},
    }
    for role, loaded in models.items():
        result.setdefault("layout", {})[role] = loaded.layout
        # a model loaded with both weight layouts is timed with the usual one alone too
        dual = layout.has_dual(loaded.model)
        for cache in args.caches:
            for single in (False, True) if dual else (False,):
                print(f"verify_cost: {role} {loaded.name}, cache {cache}", file=sys.stderr)
                layout.set_dual(loaded.model, not single)
                try:  # on the model thread, where every model call runs
                    secs = on_model_thread(widths_cost, loaded, cache, args.widths, args.reps)
                finally:
                    layout.set_dual(loaded.model, dual)
                key = f"{role}@{cache}" + ("/single layout" if single else "")
                result["seconds_by_width"][key] = {w: round(s, 6) for w, s in secs.items()}
                one = secs["1"]
                result["relative_to_width_1"][key] = {w: round(s / one, 3) for w, s in secs.items()}
    if "drafter" in models:
        result["drafter_step_ratio"] = round(pair_costs(drafter, target).step, 4)
        result["drafter_step_ratio_timed"] = timed((drafter, target), costs_check())
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    write_text(path, json.dumps(result, indent=2))
    print(f"verify_cost: results written to {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_script("verify_cost", main))
