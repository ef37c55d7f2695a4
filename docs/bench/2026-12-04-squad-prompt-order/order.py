"""Does where the question stands, or the order of the evidence, lift the pair's contains-gold?

Usage (repository root): .venv/bin/python docs/bench/2026-12-04-squad-prompt-order/order.py
    OUT N VARIANTS [misses|all] [PRESET]    e.g. /tmp/order 80 qfirst,reversed misses

The answers of ``../2026-12-03-squad-quality-wide/`` (serial RAG of the pair's 1.5B on the first
80 of ``build_datasets``' seeded SQuAD sample: hybrid top-5 chunks, the preset's answer prompt,
greedy, <= 64 new tokens, plain HF ``generate``, fp32) are the baseline. Each variant changes
one thing in the prompt and answers the same questions again (``misses``: only the questions
the baseline missed, a screen). PRESET is the model preset (``pair``, the default, or
``embedded``: SmolLM2-135M, whose baseline answers are in the same file):

- ``qfirst``: the question also stands before the evidence ("Question: ...\\n\\n<evidence>
  ...\\n\\nQuestion: ..."), so the model reads the evidence knowing what it looks for;
- ``reversed``: the same chunks, the best-ranked last (nearest the question).

Answers go to OUT/answers-PRESET.jsonl (resumed by (variant, id)); the summary, with paired
differences against the baseline and 95% bootstrap intervals by question, to OUT/result-PRESET.json
and stdout.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

from langchain_core.messages import HumanMessage, SystemMessage
from rich.console import Console

from specrag import prompts
from specrag.evaluation import metrics
from specrag.evaluation.bench_rag import build_datasets
from specrag.evaluation.hf import hf_generate
from specrag.graph.context import SpecRagContext
from specrag.graph.services import open_index
from specrag.models.loading import load_lm
from specrag.models.local import encode_chat

TOP_K, MAX_TOKENS = 5, 64
BASELINE = Path(__file__).parent.parent / "2026-12-03-squad-quality-wide" / "answers.jsonl"


def messages(variant: str, question: str, chunks: list[dict], system: str) -> list:
    """The serial-RAG prompt as ``variant`` words it."""
    if variant == "reversed":
        return prompts.evidence_messages(question, chunks[::-1], system)
    if variant == "qfirst":
        q = prompts.defuse(question)
        user = f"Question: {q}\n\n{prompts.format_evidence(chunks)}\n\nQuestion: {q}"
        return [SystemMessage(system), HumanMessage(user)]
    raise SystemExit(f"order.py: error: unknown variant {variant!r} (qfirst, reversed)")


out, n, variants = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
only_misses = len(sys.argv) > 4 and sys.argv[4] == "misses"
preset = sys.argv[5] if len(sys.argv) > 5 else "pair"
for v in variants:
    messages(v, "", [], "")  # unknown names fail before any model loads
out.mkdir(parents=True, exist_ok=True)
log = Console(stderr=True)
base = {}
for line in BASELINE.read_text().splitlines():
    r = json.loads(line)
    if r["model"] == preset:
        base[r["id"]] = r
items = [it for it in build_datasets(n, 0, log) if it["id"] in base]
if only_misses:
    items = [it for it in items if not base[it["id"]]["contains"]]
path = out / f"answers-{preset}.jsonl"
done = {}
if path.exists():
    for line in path.read_text().splitlines():
        r = json.loads(line)
        done[(r["variant"], r["id"])] = r
ctx = SpecRagContext(models=preset)
lm = load_lm(ctx.answer_spec, ctx.device, ctx.dtype)
index = open_index(replace(ctx, index_dir=items[0]["index_dir"], collection=items[0]["collection"]))
for variant in variants:
    for i, it in enumerate(items):
        if (variant, it["id"]) in done:
            continue
        chunks = [c.as_dict() for c in index.search(it["question"], TOP_K, "hybrid")]
        ids = encode_chat(lm, messages(variant, it["question"], chunks, ctx.answer_prompt))
        ans = hf_generate(lm, ids, max_new_tokens=MAX_TOKENS)["answer"]
        rec = {
            "variant": variant,
            "i": base[it["id"]]["i"],
            "id": it["id"],
            "question": it["question"],
            "answers": it["answers"],
            "contains": metrics.contains(ans, it["answers"]),
            "baseline_contains": base[it["id"]]["contains"],
            "answer": ans,
            "baseline_answer": base[it["id"]]["answer"],
        }
        done[(variant, it["id"])] = rec
        with path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        log.print(f"{variant} {i + 1}/{len(items)} contains={rec['contains']:.0f}")

result = {"preset": preset, "questions": len(items), "only_baseline_misses": only_misses}
for variant in variants:
    recs = [done[(variant, it["id"])] for it in items]
    pairs = [(r["contains"], r["baseline_contains"]) for r in recs]
    diff, ci = metrics.mean_diff_ci(pairs)
    result[variant] = {
        "contains": round(metrics.mean([r["contains"] for r in recs]), 3),
        "baseline_contains": round(metrics.mean([r["baseline_contains"] for r in recs]), 3),
        "gained": sum(1 for a, b in pairs if a > b),
        "lost": sum(1 for a, b in pairs if a < b),
        "minus_baseline": {"mean": round(diff, 3), "ci95": [round(x, 3) for x in ci or []]},
        "same_answer": sum(1 for r in recs if r["answer"] == r["baseline_answer"]),
    }
(out / f"result-{preset}.json").write_text(json.dumps(result, indent=2))
print(json.dumps(result))
