"""The chat-head KV cache as built (`reuse_chat_head`): time to first token and answers, on/off.

Usage (repository root):
.venv/bin/python docs/bench/2026-12-03-chat-head-reuse/reuse.py OUT N MODELS

MODELS: pair (the 1.5B answers) or embedded (SmolLM2-135M). N terse SQuAD questions of
``bench rag --models pair``'s seeded sample, each asked as serial RAG asks it: hybrid top-5
chunks, the preset's answer prompt, greedy, 24 new tokens, through ``ChatLocalLM`` (no
proposer, so the two differ only in the prefill). Two chat models share the loaded model: one
with ``reuse_chat_head`` (its head kept by a warm-up question first), one without; each
question goes through both, in alternating order, twice. Per question: the median prefill
(``prefill_s`` in the decode's metadata: the time to the first token's logits) of each, and
whether the 24 greedy tokens are the same. Writes records.jsonl and result.json to OUT and
prints result.json; the ratio's interval is a 95% bootstrap over questions.
"""

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from specrag import prompts
from specrag.decoding.prefix_cache import CHAT_HEADS
from specrag.evaluation import metrics
from specrag.evaluation.bench_pair import TOP_K
from specrag.evaluation.bench_rag import build_datasets
from specrag.graph.context import SpecRagContext
from specrag.graph.services import open_index
from specrag.models.chat import ChatLocalLM
from specrag.models.registry import local_model_name


def main() -> None:
    """Measure; write records.jsonl and result.json; print the result."""
    out, n, models = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    out.mkdir(parents=True, exist_ok=True)
    log = Console(stderr=True)
    items = build_datasets(n + 1, 0, log)
    ctx = SpecRagContext(models=models)  # type: ignore[arg-type]
    where = replace(ctx, index_dir=items[0]["index_dir"], collection=items[0]["collection"])
    index = open_index(where)
    cases = []
    for it in items:
        chunks = [c.as_dict() for c in index.search(it["question"], TOP_K["squad"], "hybrid")]
        cases.append(
            (it["id"], prompts.evidence_messages(it["question"], chunks, ctx.answer_prompt))
        )
    common = {
        "model_name": local_model_name(ctx.answer_spec),
        "max_new_tokens": 24,
        "speculation": "none",
    }
    on = ChatLocalLM(**common)
    off = ChatLocalLM(**common, reuse_chat_head=False)
    CHAT_HEADS.clear()
    warm_id, warm = cases.pop(0)  # warms both and leaves the head kept
    for model in (on, off):
        model.invoke(warm)

    def ask(model: ChatLocalLM, messages: list) -> tuple[float, str, dict]:
        got = model.invoke(messages)
        decoding = got.response_metadata["decoding"]
        return decoding["prefill_s"], str(got.content), decoding

    records = []
    for j, (qid, messages) in enumerate(cases):
        times: dict[str, list[float]] = {"on": [], "off": []}
        texts: dict[str, str] = {}
        for r in range(2):
            for which in ("on", "off") if (j + r) % 2 == 0 else ("off", "on"):
                seconds, text, decoding = ask(on if which == "on" else off, messages)
                times[which].append(seconds)
                texts.setdefault(which, text)
                if which == "on":
                    assert decoding["chat_head"]["reused"], decoding
                    head = decoding["chat_head"]["tokens"]
        rec = {
            "id": qid,
            "prompt_tokens": decoding["prompt_tokens"],
            "head_tokens": head,
            "on_s": statistics.median(times["on"]),
            "off_s": statistics.median(times["off"]),
            "same_24_tokens": texts["on"] == texts["off"],
        }
        records.append(rec)
        log.print(rec)
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    ratio, ci = metrics.ratio_ci(
        {r["id"]: r["on_s"] for r in records}, {r["id"]: r["off_s"] for r in records}, metrics.mean
    )
    result = {
        "models": models,
        "questions": len(records),
        "head_tokens": records[0]["head_tokens"],
        "prompt_tokens_mean": statistics.mean(r["prompt_tokens"] for r in records),
        "prefill_off_s_mean": round(statistics.mean(r["off_s"] for r in records), 4),
        "prefill_on_s_mean": round(statistics.mean(r["on_s"] for r in records), 4),
        "prefill_on_vs_off": ratio,
        "prefill_on_vs_off_ci95": ci,
        "same_24_tokens": sum(r["same_24_tokens"] for r in records),
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
