"""Pass cost by width of the 1.5B (fp32) with one layout, the transposed copy, or oneDNN-packed.

Run from the repository root: ``.venv/bin/python docs/bench/2026-12-02-packed-layout/measure.py``
(~6 min on 2 cores; the pair must be installed: ``make models-pair``). Prints one JSON document:
per layout and round, the seconds of one pass of each width after a 2,000-token cache (min of
3 after a warm pass), its ratio to a single step, a 512-token prefill, and the largest logit
difference from the single layout.
"""

import json
import sys
import time

import torch
from torch import nn

from specrag.decoding.state import LMState
from specrag.graph.context import MODEL_PRESETS
from specrag.models import layout
from specrag.models.loading import load_lm

WIDTHS = (1, 2, 3, 4, 6, 8, 10, 12, 16)
CACHE = 2000

model = load_lm(MODEL_PRESETS["pair"][1], "auto", "auto").model
layout.remove(model)
LAYERS = layout.linears(model)
forms = {"packed": [], "transposed": []}
for m in LAYERS:
    w = m.weight.detach()
    forms["packed"].append(torch.ops.mkldnn._reorder_linear_weight(w, None))
    forms["transposed"].append(w.t().contiguous())


def use(mode):
    for i, m in enumerate(LAYERS):
        if mode == "single":
            m.__class__ = nn.Linear
            m._buffers.pop("weight_t", None)
        else:
            m.__class__ = layout.DualLinear
            m.register_buffer("weight_t", forms[mode][i], persistent=False)


def run(mode):
    use(mode)
    with torch.inference_mode():
        state = LMState(model)
        prompt = [(i * 7919) % 30000 + 100 for i in range(CACHE)]
        start = time.perf_counter()
        state.extend(prompt[:512], all_logits=False)
        prefill = time.perf_counter() - start
        state.extend(prompt[512:], all_logits=False)
        secs, logits = {}, {}
        for w in WIDTHS:
            ids = list(range(500, 500 + w))
            times = []
            for _ in range(4):
                start = time.perf_counter()
                logits[w] = state.extend(ids).float()
                times.append(time.perf_counter() - start)
                state.crop(CACHE)
            secs[w] = min(times[1:])
    return prefill, secs, logits


out = {"cache": CACHE, "threads": torch.get_num_threads(), "rounds": []}
ref = None
for mode in ("single", "transposed", "packed") * 2:
    prefill, secs, logits = run(mode)
    ref = ref if ref is not None else logits
    row = {
        "layout": mode,
        "prefill_512_s": round(prefill, 3),
        "seconds": {w: round(s, 4) for w, s in secs.items()},
        "vs_step": {w: round(s / secs[1], 3) for w, s in secs.items()},
        "max_logit_diff_vs_single": max(float((logits[w] - ref[w]).abs().max()) for w in WIDTHS),
        "argmax_same_as_single": all(
            bool(torch.equal(logits[w].argmax(-1), ref[w].argmax(-1))) for w in WIDTHS
        ),
    }
    print(mode, row["prefill_512_s"], row["vs_step"], file=sys.stderr, flush=True)
    out["rounds"].append(row)
print(json.dumps(out, indent=1))
