"""Pass cost by width with transformers' SDPA vs native grouped-query attention (the 1.5B).

Run from the repository root: ``.venv/bin/python docs/bench/2026-12-01-gqa-attention/measure.py``
(~3 min on 2 cores; the pair must be installed: ``make models-pair``). Prints one JSON
document: per attention, the seconds of one pass of each width after a 2,000-token cache (min
of 3, after 2 warm passes), the ratio to a single step, and whether the logits are equal.
"""

import json
import sys
import time

import torch

from specrag.decoding.state import LMState
from specrag.graph.context import MODEL_PRESETS
from specrag.models import attention
from specrag.models.loading import load_lm

WIDTHS = (1, 2, 3, 4, 8, 12, 16)
CACHE = 2000


def passes(model):
    state = LMState(model)
    state.extend([(i * 7919) % 30000 + 100 for i in range(CACHE)], all_logits=False)
    seconds, logits = {}, {}
    for width in WIDTHS:
        ids = list(range(500, 500 + width))
        times = []
        for rep in range(5):
            start = time.perf_counter()
            logits[width] = state.extend(ids)
            if rep >= 2:
                times.append(time.perf_counter() - start)
            state.crop(CACHE)
        seconds[width] = min(times)
    return seconds, logits


lm = load_lm(MODEL_PRESETS["pair"][1], "auto", "auto")
out = {"model": lm.name, "cache_tokens": CACHE, "layout": lm.layout, "torch": torch.__version__}
results = {}
for name in ("sdpa", attention.NAME):
    lm.model.set_attn_implementation(name)
    print(f"timing {name}", file=sys.stderr)
    results[name] = passes(lm.model)
for name, (seconds, _) in results.items():
    out[name] = {
        "seconds": {w: round(s, 4) for w, s in seconds.items()},
        "ratio_to_step": {w: round(s / seconds[1], 3) for w, s in seconds.items()},
    }
base, native = results["sdpa"][1], results[attention.NAME][1]
out["logits_equal"] = {w: bool(torch.equal(base[w], native[w])) for w in WIDTHS}
print(json.dumps(out, indent=1))
