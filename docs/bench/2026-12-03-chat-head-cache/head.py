"""What a KV cache of the chat head (system prompt + user-turn opening) would save, and whether
it keeps greedy answers identical (an experiment; specrag does not do this).

Usage (repository root): .venv/bin/python docs/bench/2026-12-03-chat-head-cache/head.py OUT N

The pair's 1.5B (fp32, as ``load_lm`` loads it: weight layout per the kept verdict) on the
prompts of ``bench rag --models pair``: N terse SQuAD questions (hybrid top-5, the preset's
answer prompt) and N long ones ("Explain in detail", top-3, the detailed prompt). Per prompt,
two rounds in alternating order: a prefill from an empty cache ("full") and a prefill from a
clone of the cached head ("head": the clone is timed, the head's own prefill is not - a cache
holds it). Then 24 greedy tokens from each state, compared token by token.
"""

import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console

from specrag import prompts
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import decode, prefill
from specrag.decoding.state import LMState, shared_prefix
from specrag.evaluation import metrics
from specrag.evaluation.bench_pair import LONG_PROMPT, TOP_K
from specrag.evaluation.bench_rag import build_datasets
from specrag.graph.context import SpecRagContext
from specrag.graph.services import open_index
from specrag.models.loading import load_lm
from specrag.models.local import encode_chat

out, n = Path(sys.argv[1]), int(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
log = Console(stderr=True)
items = build_datasets(2 * n, 0, log)
ctx = SpecRagContext(models="pair")
lm = load_lm(ctx.answer_spec, ctx.device, ctx.dtype)
index = open_index(replace(ctx, index_dir=items[0]["index_dir"], collection=items[0]["collection"]))
cases = []
for i, it in enumerate(items):
    long = i >= n
    question = LONG_PROMPT.format(question=it["question"]) if long else it["question"]
    k = TOP_K["long" if long else "squad"]
    chunks = [c.as_dict() for c in index.search(question, k, "hybrid")]
    system = prompts.ANSWER_DETAILED_SYSTEM if long else ctx.answer_prompt
    ids = encode_chat(lm, prompts.evidence_messages(question, chunks, system))
    cases.append(("long" if long else "squad", it["id"], ids))
# the head: what every prompt of one system prompt shares (its system turn and user opening),
# found against a prompt of other evidence and another question, as a cache would find it
heads = {}
for kind in ("squad", "long"):
    group = [ids for k, _, ids in cases if k == kind]
    system = prompts.ANSWER_DETAILED_SYSTEM if kind == "long" else ctx.answer_prompt
    other = encode_chat(lm, prompts.evidence_messages("Why?", [{"text": "-", "source": "-"}], system))
    h = min(shared_prefix(other, g) for g in group)
    heads[kind] = group[0][:h]
    log.print(f"{kind}: head {h} tokens: {lm.tokenizer.decode(group[0][:h])!r}")
head_states = {}
for kind, head in heads.items():
    state = LMState(lm.model, lm.device)
    state.extend(head, all_logits=False)
    head_states[kind] = state
warm = LMState(lm.model, lm.device)
prefill(warm, cases[0][2])  # warm-up
greedy = Sampler(0.0, 1.0)


def run(state: LMState | None, ids: list[int]) -> tuple[float, list[int], torch.Tensor]:
    start = time.perf_counter()
    if state is None:
        state = LMState(lm.model, lm.device)
    else:
        state = state.clone()
    logits = prefill(state, ids)
    seconds = time.perf_counter() - start
    tokens = []
    for step in decode(state, ids, max_new_tokens=24, sampler=greedy, eos_ids=lm.eos_token_ids):
        tokens += [t.id for t in step]
    return seconds, tokens, logits


records = []
for j, (kind, qid, ids) in enumerate(cases):
    times = {"full": [], "head": []}
    for r in range(2):
        order = ["full", "head"] if (j + r) % 2 == 0 else ["head", "full"]
        for which in order:
            base = None if which == "full" else head_states[kind]
            seconds, tokens, logits = run(base, ids)
            times[which].append(seconds)
            if r == 0:
                if which == "full":
                    full_tokens, full_logits = tokens, logits
                else:
                    head_tokens, head_logits = tokens, logits
    rec = {
        "set": kind,
        "id": qid,
        "prompt_tokens": len(ids),
        "head_tokens": len(heads[kind]),
        "full_s": statistics.median(times["full"]),
        "head_s": statistics.median(times["head"]),
        "same_24_tokens": full_tokens == head_tokens,
        "first_token_logits_max_abs_diff": float((full_logits - head_logits).abs().max()),
    }
    records.append(rec)
    log.print(rec)
(out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
result = {}
for kind in ("squad", "long"):
    rs = {r["id"]: r for r in records if r["set"] == kind}
    ratio, ci = metrics.ratio_ci(
        {k: r["head_s"] for k, r in rs.items()}, {k: r["full_s"] for k, r in rs.items()},
        metrics.mean,
    )
    result[kind] = {
        "n": len(rs),
        "head_tokens": len(heads[kind]),
        "prompt_tokens_mean": statistics.mean(r["prompt_tokens"] for r in rs.values()),
        "full_prefill_s_mean": statistics.mean(r["full_s"] for r in rs.values()),
        "head_prefill_s_mean": statistics.mean(r["head_s"] for r in rs.values()),
        "prefill_head_vs_full": ratio,
        "prefill_head_vs_full_ci95": ci,
        "same_24_tokens": sum(r["same_24_tokens"] for r in rs.values()),
        "max_abs_logit_diff": max(r["first_token_logits_max_abs_diff"] for r in rs.values()),
    }
(out / "result.json").write_text(json.dumps(result, indent=2))
print(json.dumps(result, indent=2))
