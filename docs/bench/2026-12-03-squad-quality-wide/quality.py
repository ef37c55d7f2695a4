"""Contains-gold of serial RAG's answer models on a wider SQuAD sample than the bench's 30.

Usage (repository root): .venv/bin/python docs/bench/2026-12-03-squad-quality-wide/quality.py
    OUT N MODELS    e.g. /tmp/quality 130 pair,embedded

The first 30 of ``build_datasets(N, 0)``'s seeded SQuAD sample are the questions of
``bench rag --models pair`` (``random.sample`` draws a prefix-stable sequence here), the rest
were never looked at by any earlier experiment. Each answer is the serial-RAG answer of the
model's preset as the pair bench makes it: hybrid top-5 chunks, the context's answer prompt,
greedy, <= 64 new tokens, plain HF ``generate`` (greedy answers of every speculative system are
identical to it in fp32, 100% in every fp32 protocol). Answers go to OUT/answers.jsonl (resumed by
(model, id)); the summary to OUT/result.json and stdout.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from specrag import prompts
from specrag.evaluation import metrics
from specrag.evaluation.bench_rag import build_datasets
from specrag.evaluation.hf import hf_generate
from specrag.graph.context import SpecRagContext
from specrag.graph.services import open_index
from specrag.models.loading import load_lm
from specrag.models.local import encode_chat

BENCH_SAMPLE = 30  # bench rag --models pair's SQuAD questions are the first 30
TOP_K, MAX_TOKENS = 5, 64

out, n, models = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
out.mkdir(parents=True, exist_ok=True)
log = Console(stderr=True)
items = build_datasets(n, 0, log)
path = out / "answers.jsonl"
done = {}
if path.exists():
    for line in path.read_text().splitlines():
        r = json.loads(line)
        done[(r["model"], r["id"])] = r
for preset in models:
    ctx = SpecRagContext(models=preset)
    lm = load_lm(ctx.answer_spec, ctx.device, ctx.dtype)
    index = open_index(
        replace(ctx, index_dir=items[0]["index_dir"], collection=items[0]["collection"])
    )
    for i, it in enumerate(items):
        if (preset, it["id"]) in done:
            continue
        chunks = [c.as_dict() for c in index.search(it["question"], TOP_K, "hybrid")]
        ids = encode_chat(lm, prompts.evidence_messages(it["question"], chunks, ctx.answer_prompt))
        ans = hf_generate(lm, ids, max_new_tokens=MAX_TOKENS)["answer"]
        rec = {
            "model": preset,
            "i": i,
            "id": it["id"],
            "question": it["question"],
            "answers": it["answers"],
            "retrieved_gold": any(c["source"] in it["gold"] for c in chunks),
            "contains": metrics.contains(ans, it["answers"]),
            "answer": ans,
        }
        done[(preset, it["id"])] = rec
        with path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        log.print(f"{preset} {i + 1}/{len(items)} contains={rec['contains']:.0f}")


def share(recs: list[dict]) -> dict:
    """Contains-gold share of these answers with its 95% bootstrap interval (by question)."""
    hits = [r["contains"] for r in recs]
    return {
        "n": len(recs),
        "contains": round(metrics.mean(hits), 3),
        "ci95": [round(x, 3) for x in metrics.bootstrap_ci(hits, metrics.mean) or []],
        "retrieved_gold": round(metrics.mean([float(r["retrieved_gold"]) for r in recs]), 3),
    }


result = {}
for preset in models:
    recs = sorted((r for (m, _), r in done.items() if m == preset), key=lambda r: r["i"])
    result[preset] = {
        "bench_sample": share([r for r in recs if r["i"] < BENCH_SAMPLE]),
        "new_questions": share([r for r in recs if r["i"] >= BENCH_SAMPLE]),
        "all": share(recs),
    }
if len(models) > 1:
    a, b = models[:2]
    pairs = [(done[(a, it["id"])]["contains"], done[(b, it["id"])]["contains"]) for it in items]
    diff, ci = metrics.mean_diff_ci(pairs)
    result[f"{a}_minus_{b}"] = {"mean": round(diff, 3), "ci95": [round(x, 3) for x in ci or []]}
(out / "result.json").write_text(json.dumps(result, indent=2))
print(json.dumps(result))
