"""What a drafter whose steps cost nothing would buy: the same replay with drafter steps free.

    .venv/bin/python docs/bench/2026-12-03-tree-verify/bound.py [FOLDER]

Reads FOLDER/questions.jsonl and costs.json (default: this folder), replays every policy of
``sim.py`` twice - drafter steps at their timed cost, and free - and prints one JSON document:
each policy's replayed seconds against today's policy (``single``) at the timed cost, with a
95% bootstrap interval by question, and the best cap / cut-off of ``single`` once the drafter is
free. Reads only; writes nothing. A bound, not a plan: on 2 cores the drafter cannot run
beside the target for free (the target's passes are bound by both cores' arithmetic).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sim import POLICIES, replay

from specrag.evaluation.metrics import ratio_ci


def main() -> None:
    """Replay every policy with the drafter timed and free; print the ratios."""
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    qs = [json.loads(line) for line in (folder / "questions.jsonl").read_text().splitlines()]
    costs = json.loads((folder / "costs.json").read_text())
    cost = {int(w): s for w, s in costs["pass_s"].items()}
    step = costs["drafter_step_s"]

    def seconds(policy: str, step_d: float, drafter: tuple[int, float] | None = None) -> dict:
        return {
            q["qid"]: replay(q, policy, cost, step_d, q["narrow"] or 3, drafter)["seconds"]
            for q in qs
        }

    single = seconds("single", step)
    out: dict = {"questions": len(qs), "drafter_step_s": step, "vs_single_timed": {}}
    for p in POLICIES:
        for label, step_d in (("timed", step), ("free", 0.0)):
            out["vs_single_timed"][f"{p} ({label} drafter)"] = ratio_ci(
                seconds(p, step_d), single, sum, seed=0
            )
    cells = {
        (cap, least): sum(seconds("single", 0.0, (cap, least)).values())
        for cap in (1, 2, 3, 4, 5, 6, 8, 10)
        for least in (0.0, 0.2, 0.3, 0.4, 0.5, 0.7)
    }
    (cap, least), best = min(cells.items(), key=lambda kv: kv[1])
    out["single_free_best"] = {
        "cap": cap,
        "cut": least,
        "vs_single_timed": round(best / sum(single.values()), 3),
    }
    print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
