"""Verify-pass cost by width on a 900-token cache: specrag's LMState vs HF forward + DynamicCache.

    .venv/bin/python docs/bench/2026-12-04-rag-pair-long-p17-paid-join/pass_cost.py

Loads the pair's 1.5B as the bench does (fp32, its layout verdict), prefills 900 tokens, then
times passes of each width in turn, the cache cropped back after each (the first round a
warm-up), and prints the medians in seconds as one JSON document. Writes nothing.
"""
import json, sys, time
from statistics import median
import torch
from transformers import DynamicCache
from specrag.graph.context import SpecRagContext
from specrag.models.loading import load_lm
from specrag.decoding.state import LMState

ctx = SpecRagContext(models="pair")
t = load_lm(ctx.answer_spec, ctx.device, ctx.dtype)
vocab = int(t.model.config.vocab_size)
prompt = [(40 + 7 * i) % 30000 for i in range(900)]
widths = [1, 4, 8, 10, 12, 14, 15, 16, 17]
reps = 7
out = {}
with torch.inference_mode():
    lm = LMState(t.model, t.device, marks=1)
    lm.extend(prompt, all_logits=False)
    base = len(lm)
    ours = {w: [] for w in widths}
    for rep in range(reps + 1):
        for w in widths:
            t0 = time.perf_counter(); lm.extend([(300 + j) % vocab for j in range(w)]); dt = time.perf_counter() - t0
            lm.crop(base)
            if rep: ours[w].append(dt)
    out["ours"] = {w: round(median(v), 4) for w, v in ours.items()}
    # HF
    cache = DynamicCache()
    ids = torch.tensor([prompt])
    t.model(input_ids=ids, past_key_values=cache, use_cache=True)
    hf = {w: [] for w in widths}
    for rep in range(reps + 1):
        for w in widths:
            x = torch.tensor([[(300 + j) % vocab for j in range(w)]])
            t0 = time.perf_counter(); t.model(input_ids=x, past_key_values=cache, use_cache=True); dt = time.perf_counter() - t0
            cache.crop(-w)
            if rep: hf[w].append(dt)
    out["hf"] = {w: round(median(v), 4) for w, v in hf.items()}
print(json.dumps(out))
