"""RAPID (eta 0) decode on the pair, int8 drafter: starting gamma and confidence cut-off varied.

Usage: python variants.py [n_questions] > results.json  (stderr: progress)

The bench's HotpotQA haystacks (bench rapid's seed, 2K and 4K tokens). Per (question, length):
target-only greedy decode (the bench's ``run_case``, paying its own prefill), then each variant
through ChatRapid with one shared prefix cache (the first pays the document prefill, the rest
reuse it; ``decode_s`` excludes prefills either way), variants in a rotating order. A warm-up
case runs every variant first. Ratios: decode tokens/s of a variant over target-only's.
"""

import json
import random
import sys
import time

from langchain_core.messages import HumanMessage
from rich.console import Console

from specrag.data.datasets import hotpot_questions, sample
from specrag.decoding.prefix_cache import PrefixCache
from specrag.evaluation import metrics
from specrag.evaluation.bench_rapid import MAX_NEW, SEED, build_document, run_case
from specrag.models.loading import dtype_name, load_lm
from specrag.models.rapid_chat import ChatRapid

VARIANTS = {  # today's defaults: gamma 10 (adaptive, up to 16), no confidence cut-off
    "default": {},
    "gamma4": {"gamma": 4},
    "conf06": {"min_draft_confidence": 0.6},
    "gamma4_conf06": {"gamma": 4, "min_draft_confidence": 0.6},
}
log = Console(stderr=True)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
target = load_lm("qwen2.5-coder-1.5b", dtype="float32")
drafter = load_lm("qwen2.5-coder-0.5b", dtype="int8")
pool = hotpot_questions()
picked = sample(pool, n, SEED)
distractors = sample(pool, 300, SEED + 1)


def rapid(ex, document, cache, **settings):
    model = ChatRapid(
        target_model=target.name,
        drafter_model=drafter.name,
        dtype=dtype_name(target.dtype),
        drafter_dtype=dtype_name(drafter.dtype),
        eta=0.0,
        max_new_tokens=MAX_NEW,
        prefix_cache=cache,
        **settings,
    )
    meta = model.invoke([HumanMessage(ex.question)], document=document).response_metadata
    return {
        "new_tokens": meta["new_tokens"],
        "decode_s": meta["decode_s"],
        "tokens_per_s": (meta["new_tokens"] - 1) / meta["decode_s"],
        "target_passes": meta["target_forward_passes"],
        "drafter_passes": meta["drafter_forward_passes"],
        "acceptance": meta["acceptance_rate"],
        "drafter_vocab_rows": meta.get("drafter_vocab_rows"),
        "drafter_prefill_s": meta["drafter_prefill_s"],
    }


warm = build_document(picked[0], distractors, 512, target, random.Random("warm"))
for name, settings in VARIANTS.items():
    rapid(picked[0], warm, PrefixCache(), **settings)
run_case(picked[0], warm, target, 0.0, "target_only", max_new=8, drafter=drafter)
rows = []
start = time.time()
for qi, ex in enumerate(picked):
    for length in (2048, 4096):
        document = build_document(ex, distractors, length, target, random.Random(f"{SEED}:{ex.id}:{length}"))
        base = run_case(ex, document, target, 0.0, "target_only", max_new=MAX_NEW, drafter=drafter)
        row = {"qid": ex.id, "length": length, "target_only": {
            "new_tokens": base["new_tokens"], "tokens_per_s": base["tokens_per_s"]}}
        cache = PrefixCache()
        names = list(VARIANTS)
        names = names[qi % len(names):] + names[: qi % len(names)]
        for name in names:
            row[name] = rapid(ex, document, cache, **VARIANTS[name])
        rows.append(row)
        log.print(f"{time.time() - start:.0f}s q{qi} {length}: target {base['tokens_per_s']:.2f} tok/s; "
                  + ", ".join(f"{k} {row[k]['tokens_per_s'] / base['tokens_per_s']:.2f}x" for k in VARIANTS))
summary = {}
for length in (2048, 4096):
    rs = [r for r in rows if r["length"] == length]
    den = {r["qid"]: r["target_only"]["tokens_per_s"] for r in rs}
    summary[length] = {}
    for name in VARIANTS:
        num = {r["qid"]: r[name]["tokens_per_s"] for r in rs}
        point, ci = metrics.ratio_ci(num, den, metrics.mean, seed=SEED)
        summary[length][name] = {
            "decode_speedup_vs_target": point, "ci95": ci,
            "vs_default": metrics.ratio_ci(
                num, {r["qid"]: r["default"]["tokens_per_s"] for r in rs}, metrics.mean, seed=SEED
            ),
            "acceptance": metrics.mean([r[name]["acceptance"] for r in rs]),
            "target_passes_per_token": sum(r[name]["target_passes"] for r in rs) / sum(r[name]["new_tokens"] for r in rs),
            "drafter_passes_per_token": sum(r[name]["drafter_passes"] for r in rs) / sum(r[name]["new_tokens"] for r in rs),
        }
print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "n": n, "summary": summary, "rows": rows}, indent=1))
