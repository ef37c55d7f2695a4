"""A replay, not an implementation: would a two-branch token tree cut spec_verify's passes?

The question: would verifying the drafter's proposal AND the evidence n-gram's in one pass
(a two-branch token tree) cut spec_verify's target passes on the long set?

    .venv/bin/python docs/bench/2026-12-03-tree-verify/sim.py OUT_DIR [N_QUESTIONS] [CHAIN]

1. Runs each long-set question (`bench rag --models pair --sets long`'s prompts) through the
   graph's spec_verify once and keeps the target's prompt, its greedy answer (token ids), the
   merged proposer (its n-gram sources, its drafter's KV state) and where the drafter joined.
2. Teacher-forces the answer: at every answer position the drafter's greedy chain of CHAIN
   tokens with its confidence at each, and the n-gram proposer's proposal.
3. Times the 1.5B's verify passes of 1..21 tokens at the answer's cache length, and the
   drafter's single step (medians), on the loaded models.
4. Replays proposal policies over those arrays: each pass accepts the longest prefix of its
   candidates equal to the greedy answer and emits one more token; a pass costs its timed
   width, a drafter proposal one drafter step per token. Policies differ only in what they
   verify per pass, so the replay's ratios between policies are what carries over (a tree
   pass with a custom attention mask is priced as a causal pass of as many tokens).

Writes questions.jsonl (per question arrays), costs.json, result.json to OUT_DIR.
``sim.py --replay DIR`` redoes step 4 from DIR/questions.jsonl and REWRITES DIR/result.json and
DIR/costs.json: point it at a copy, not at the committed folder.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from statistics import median

import torch
from rich.console import Console

import specrag.models.chat as chat
from specrag.decoding.candidates import NgramProposer
from specrag.decoding.drafter import MergedProposer
from specrag.evaluation import bench_pair
from specrag.evaluation.bench_rag import build_datasets, run_one
from specrag.evaluation.metrics import ratio_ci
from specrag.graph.builder import build_graph
from specrag.graph.context import SpecRagContext
from specrag.graph.services import open_index
from specrag.models.loading import load_lm

CAPTURED: dict = {}
_decode = chat.decode


def decode(lm, prompt, **kw):
    answer: list[int] = []
    for step in _decode(lm, prompt, **kw):
        if isinstance(step, list):
            answer.extend(t.id for t in step)
        yield step
    if isinstance(kw.get("proposer"), MergedProposer):  # the answer's decode, not the draft's
        CAPTURED.update(lm=lm, prompt=list(prompt), answer=answer, proposer=kw["proposer"])


chat.decode = decode


def join_token(events: list[str]) -> int | None:
    for e in events:
        if e.startswith("joined at token "):
            return int(e.split()[3])
    return None


@torch.inference_mode()
def chains(proposer, prompt: list[int], answer: list[int], size: int) -> list[dict]:
    """Per answer position i >= 1: the drafter's greedy chain after prompt + answer[:i]."""
    dp = proposer.drafter
    lm = dp.lm
    if dp.vocab_first and not dp._restricted:
        lm.restrict(dp.vocab_first, dp.prompt + [*dp.eos_ids])
        dp._restricted = True
    ng = NgramProposer(dict(proposer.ngrams.sources), short_max=proposer.ngrams.short_max)
    out = []
    for i in range(1, len(answer)):
        context = prompt + answer[:i]
        lm.sync(context)
        if len(lm) == len(context):
            lm.crop(len(context) - 1)
        logits = dp._fit(lm.extend(context[len(lm) :], all_logits=False)[-1])
        toks, confs = [], []
        for _ in range(size):
            t = int(logits.argmax())
            toks.append(t)
            confs.append(float(torch.softmax(logits, -1)[t]))
            if t in dp.eos_ids:
                break
            logits = dp._fit(lm.extend([t])[-1])
        cand, src = ng.propose(answer[:i], 16)
        out.append(
            {"i": i, "dr": toks, "conf": confs, "ng": cand, "ng_src": src, "ng_n": ng.last_match}
        )
    return out


@torch.inference_mode()
def pass_costs(lm, answer: list[int], widths: list[int], reps: int = 5) -> dict[int, float]:
    base = len(lm)
    feed = (answer * 4)[: max(widths)]
    times: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(reps):
        for w in widths:
            t0 = time.perf_counter()
            lm.extend(feed[:w])
            times[w].append(time.perf_counter() - t0)
            lm.crop(base)
    return {w: median(v) for w, v in times.items()}


@torch.inference_mode()
def drafter_step(proposer, reps: int = 20) -> float:
    lm = proposer.drafter.lm
    base = len(lm)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        lm.extend([lm.tokens[-1]])
        ts.append(time.perf_counter() - t0)
        lm.crop(base)
    return median(ts)


def match(cands: list[int], truth: list[int]) -> int:
    """How many of ``cands`` match ``truth`` from the start."""
    n = 0
    while n < len(cands) and n < len(truth) and cands[n] == truth[n]:
        n += 1
    return n


def cut(toks: list[int], confs: list[float], cap: int, least: float) -> list[int]:
    """The drafter's proposal: up to ``cap`` tokens, ending after the first one below ``least``."""
    out = []
    for t, c in zip(toks, confs):
        out.append(t)
        if len(out) >= cap or c < least:
            break
    return out


def replay(
    q: dict,
    policy: str,
    cost: dict[int, float],
    step_d: float,
    narrow: int,
    drafter: tuple[int, float] | None = None,
) -> dict:
    """One answer through ``policy``; returns passes, drafter steps, time, tokens per source.

    ``narrow`` caps weak n-gram proposals; ``drafter`` = (cap, cut-off) of the drafter's
    proposals where the policy keeps today's (default: ``narrow`` and 0.7).
    """
    dcap, least = drafter or (narrow, 0.7)
    answer, rows, join = q["answer"], q["rows"], q["join"]
    i, passes, dsteps, seconds = 1, 0, 0, 0.0
    src = {"ng": 0, "dr": 0, "target": 0}
    widest = max(cost)
    while i < len(answer):
        r = rows[i - 1]
        truth = answer[i:]
        room = len(answer) - i - 1
        strong = r["ng_n"] >= 3
        ng = r["ng"][: 8 if strong else narrow][: max(room, 0)]
        joined = join is not None and i >= join
        dr: list[int] = []
        if policy == "single":  # today's choice: strong n-gram, else drafter, else weak n-gram
            if not strong and joined:
                dr, ng = cut(r["dr"], r["conf"], dcap, least), []
        elif policy == "tree":  # the same drafter proposals, the weak n-gram beside them
            if not strong and joined:
                dr = cut(r["dr"], r["conf"], dcap, least)
        elif policy == "tree_all":  # the drafter proposes beside strong matches too
            if joined:
                dr = cut(r["dr"], r["conf"], dcap, least)
        elif policy == "tree_wide":  # ... with proposals up to 8 while >= 0.4 sure
            if joined:
                dr = cut(r["dr"], r["conf"], 8, 0.4)
        elif policy == "drafter_only_wide":  # HF assisted's shape: the drafter alone, from token 1
            dr, ng = cut(r["dr"], r["conf"], 10, 0.4), []
        elif policy == "ngram_only":
            pass
        dr = dr[: max(room, 0)]
        a_ng, a_dr = match(ng, truth), match(dr, truth)
        nodes = len(ng) + len(dr) - match(ng, dr)  # their shared prefix
        width = min((w for w in cost if w >= 1 + nodes), default=widest)  # the next timed width
        seconds += cost[width] + step_d * len(dr)
        passes += 1
        dsteps += len(dr)
        a = max(a_ng, a_dr)
        if a:
            src["ng" if a_ng >= a_dr else "dr"] += a
        src["target"] += 1
        i += a + 1
    return {"passes": passes, "drafter_steps": dsteps, "seconds": seconds, "from": src}


POLICIES = ["single", "tree", "tree_all", "tree_wide", "drafter_only_wide", "ngram_only"]


def main() -> None:
    out = Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    out.mkdir(parents=True, exist_ok=True)
    log = Console(stderr=True)
    items = bench_pair.long_items(n, build_datasets(1, 0, log)[0])
    base = SpecRagContext(models="pair", refine_temperature=0.0)
    load_lm(base.answer_spec, base.device, base.dtype)
    load_lm(base.draft_spec, base.device, base.draft_dtype)
    graph = build_graph()
    base = bench_pair.context_for(base, "long")
    widths = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 21]

    async def go() -> list[dict]:
        index = open_index(
            replace(base, index_dir=items[0]["index_dir"], collection=items[0]["collection"])
        )
        await asyncio.to_thread(index.search, "warm-up", 1)
        await run_one(items[-1], "spec_verify", 0.0, graph, base)  # warm
        qs = []
        with (out / "questions.jsonl").open("w") as fh:
            for k, item in enumerate(items):
                CAPTURED.clear()
                rec = await run_one(item, "spec_verify", 0.0, graph, base)
                prop = CAPTURED["proposer"]
                t0 = time.perf_counter()
                rows = chains(prop, CAPTURED["prompt"], CAPTURED["answer"], size)
                q = {
                    "qid": item["id"],
                    "prompt_tokens": len(CAPTURED["prompt"]),
                    "answer": CAPTURED["answer"],
                    "join": join_token(prop.events),
                    "events": prop.events,
                    "narrow": prop.narrow,
                    "real": {
                        key: rec.get(key)
                        for key in ("e2e_s", "decode_s", "passes_per_token", "tokens_from")
                    },
                    "rows": rows,
                }
                if k == 0:
                    q["pass_s"] = pass_costs(CAPTURED["lm"], CAPTURED["answer"], widths)
                    q["drafter_step_s"] = drafter_step(prop)
                qs.append(q)
                fh.write(json.dumps(q) + "\n")
                fh.flush()
                log.print(
                    f"{k} {item['id']}: {len(q['answer'])} tokens, join {q['join']}, "
                    f"real {q['real']}, chains {time.perf_counter() - t0:.0f}s"
                )
        return qs

    qs = asyncio.run(go())
    summarize(out, qs, size)


def summarize(out: Path, qs: list[dict], size: int) -> None:
    cost = {int(w): s for w, s in qs[0]["pass_s"].items()}
    step_d = qs[0]["drafter_step_s"]
    (out / "costs.json").write_text(
        json.dumps({"pass_s": cost, "drafter_step_s": step_d}, indent=2)
    )
    result: dict = {
        "questions": len(qs),
        "chain": size,
        "pass_vs_step": {w: round(s / cost[1], 3) for w, s in cost.items()},
        "drafter_step_vs_target_step": round(step_d / cost[1], 3),
        "policies": {},
    }
    per: dict[str, dict[str, dict]] = {}
    for p in POLICIES:
        per[p] = {q["qid"]: replay(q, p, cost, step_d, q["narrow"] or 3) for q in qs}
        tot = lambda key: sum(r[key] for r in per[p].values())  # noqa: E731
        result["policies"][p] = {
            "passes": tot("passes"),
            "drafter_steps": tot("drafter_steps"),
            "seconds": round(tot("seconds"), 2),
            "from": {s: sum(r["from"][s] for r in per[p].values()) for s in ("ng", "dr", "target")},
        }
    result["real_passes_single"] = sum(
        round(q["real"]["passes_per_token"] * len(q["answer"])) - 1
        for q in qs
        if q["real"]["passes_per_token"]
    )
    # today's policy with the drafter's cap and cut-off swept (weak n-grams keep their cap)
    single = sum(r["seconds"] for r in per["single"].values())
    result["single_drafter_sweep_vs_single"] = {
        f"cap {cap}": {
            f"cut {least}": round(
                sum(
                    replay(q, "single", cost, step_d, q["narrow"] or 3, (cap, least))["seconds"]
                    for q in qs
                )
                / single,
                3,
            )
            for least in (0.3, 0.5, 0.6, 0.7, 0.8, 0.9)
        }
        for cap in (1, 2, 3, 4, 5, 6, 8)
    }
    for p in POLICIES[1:]:
        num = {k: v["seconds"] for k, v in per[p].items()}
        den = {k: v["seconds"] for k, v in per["single"].items()}
        result["policies"][p]["seconds_vs_single (sum)"] = ratio_ci(num, den, sum, seed=0)
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    if sys.argv[1] == "--replay":  # re-run step 4 on a finished run's questions.jsonl
        folder = Path(sys.argv[2])
        lines = (folder / "questions.jsonl").read_text().splitlines()
        qs = [json.loads(line) for line in lines]
        qs[0]["pass_s"] = {int(w): s for w, s in qs[0]["pass_s"].items()}
        summarize(folder, qs, max(len(r["dr"]) for q in qs for r in q["rows"]))
    else:
        main()
