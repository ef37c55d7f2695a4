"""``specrag bench rag``: speculative RAG against serial RAG on SQuAD v2 dev and HotpotQA dev.

Systems, all on the same local model and prompts, in ONE run:

* ``no_rag`` - the draft alone (draft prompt, no evidence);
* ``serial_plain`` - retrieve, then generate with plain decoding (the graph with the draft off);
* ``serial_lookup`` - retrieve, then HF ``generate(prompt_lookup_num_tokens=10)``;
* ``spec_rewrite`` - the graph, ``refine_mode=rewrite``;
* ``spec_verify`` - the graph, ``refine_mode=verify`` (default).

The retrieval latency sweep ADDS an injected delay (0, 0.5, 1, 2 s) before retrieval results
return, modelling a remote vector store. Answers are greedy (``refine_temperature=0``) so
accuracy differences come from the systems, not from sampling.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from rich.console import Console

from specrag import prompts
from specrag.data.datasets import hotpot_questions, sample, squad_paragraphs, squad_questions
from specrag.evaluation import metrics
from specrag.evaluation.hf import hf_generate
from specrag.evaluation.store import RunLog
from specrag.graph.builder import build_graph
from specrag.graph.context import SpecRagContext
from specrag.graph.services import open_index
from specrag.indexing.pipeline import index_records
from specrag.models.chat import ChatLocalLM, encode_chat
from specrag.models.loading import load_lm
from specrag.paths import cache_dir
from specrag.progress import progress_bar

SYSTEMS = ["no_rag", "serial_plain", "serial_lookup", "spec_rewrite", "spec_verify"]
LATENCIES = [0.0, 0.5, 1.0, 2.0]
SEED = 2026


def _index(collection: str, records: list[tuple[str, str]], log: Console) -> Path:
    directory = cache_dir() / "bench-index"
    with progress_bar(log, transient=True) as bar:
        task = bar.add_task(f"indexing {collection}", total=len(records))
        index_records(
            records, directory, collection=collection, progress=lambda n: bar.advance(task, n)
        )
    return directory


def build_datasets(n_squad: int, n_hotpot: int, log: Console) -> list[dict[str, Any]]:
    """Questions with their gold ids and the index each one searches."""
    items: list[dict[str, Any]] = []
    squad_dir = _index("bench_squad", [(p.id, p.text) for p in squad_paragraphs()], log)
    for q in sample(squad_questions(), n_squad, SEED):
        items.append(
            {
                "dataset": "squad",
                "id": q.id,
                "question": q.question,
                "answers": list(q.answers),
                "gold": list(q.gold_ids),
                "index_dir": str(squad_dir),
                "collection": "bench_squad",
            }
        )
    if n_hotpot:
        pool = hotpot_questions()
        picked = sample(pool, n_hotpot, SEED)
        others = sample(pool, 40, SEED + 1)  # a seeded pool of extra distractor paragraphs
        paragraphs = {p.id: p.text for ex in [*picked, *others] for p in ex.paragraphs}
        hot_dir = _index("bench_hotpot", list(paragraphs.items()), log)
        for q in picked:
            items.append(
                {
                    "dataset": "hotpot",
                    "id": q.id,
                    "question": q.question,
                    "answers": list(q.answers),
                    "gold": list(q.gold_ids),
                    "index_dir": str(hot_dir),
                    "collection": "bench_hotpot",
                }
            )
    return items


def run_hf_lookup(
    question: str, chunks: list[dict[str, Any]], ctx: SpecRagContext
) -> dict[str, Any]:
    """Serial RAG answer with HF prompt lookup decoding (same prompt as ``generate``)."""
    loaded = load_lm(ctx.answer_model, ctx.device, ctx.dtype)
    ids = encode_chat(loaded, prompts.evidence_messages(question, chunks, ctx.answer_prompt))
    res = hf_generate(
        loaded, ids, max_new_tokens=ctx.answer_max_tokens, prompt_lookup_num_tokens=10
    )
    res["passes_per_token"] = res["forward_passes"] / max(res["new_tokens"], 1)
    return res


async def run_one(
    item: dict[str, Any], system: str, latency: float, graph: Any, base: SpecRagContext
) -> dict[str, Any]:
    """One question through one system; returns the measured record."""
    ctx = replace(
        base,
        index_dir=item["index_dir"],
        collection=item["collection"],
        added_retrieval_latency_s=latency,
    )
    question = item["question"]
    rec: dict[str, Any] = {
        "dataset": item["dataset"],
        "qid": item["id"],
        "system": system,
        "latency": latency,
    }
    start = time.perf_counter()
    if system == "no_rag":
        model = ChatLocalLM(
            temperature=ctx.draft_temperature,
            max_new_tokens=ctx.draft_max_tokens,
            speculation="none",
            seed=SEED,
        )
        first: list[float] = []
        text = ""
        async for chunk in model.astream([SystemMessage(ctx.draft_prompt), HumanMessage(question)]):
            if chunk.content and not first:
                first.append(time.perf_counter() - start)
            text += str(chunk.content)
        rec.update(
            answer=text.strip(),
            ttft_s=first[0] if first else None,
            route="no_rag",
            retrieved=[],
            passes_per_token=1.0,
        )
    elif system == "serial_lookup":
        index = open_index(ctx)
        await asyncio.sleep(latency)
        found = await asyncio.to_thread(index.search, question, ctx.top_k)
        relevant = [c for c in found if c.score >= ctx.relevance_threshold] or found[:1]
        chunks = [c.as_dict() for c in relevant]
        rec["retrieve_s"] = time.perf_counter() - start
        res = await asyncio.to_thread(run_hf_lookup, question, chunks, ctx)
        rec.update(
            answer=res["answer"],
            route="generate",
            retrieved=[c["source"] for c in chunks],
            passes_per_token=res["passes_per_token"],
            ttft_s=(rec["retrieve_s"] + res["ttft_s"]) if res["ttft_s"] else None,
            # decode time after the first token, like the graph's decoding stats
            decode_s=res["decode_s"],
        )
    else:
        overrides: dict[str, Any] = {
            "serial_plain": {"draft_policy": "off", "speculation": "none"},
            "spec_rewrite": {"refine_mode": "rewrite"},
            "spec_verify": {"refine_mode": "verify"},
        }[system]
        result = await graph.ainvoke({"question": question}, context=replace(ctx, **overrides))
        stats = result.get("stats") or {}
        node_stats = stats.get(result.get("route", ""), {}) if isinstance(stats, dict) else {}
        timings = result.get("timings") or {}
        rec.update(
            answer=result.get("answer", ""),
            route=result.get("route"),
            retrieved=[c.get("source") for c in result.get("chunks") or []],
            ttft_s=timings.get("ttft_s"),
            draft_ttft_s=timings.get("draft_ttft_s"),
            passes_per_token=node_stats.get("passes_per_token"),
            decode_s=node_stats.get("decode_s"),
            accepted=node_stats.get("candidates_accepted"),
            proposed=node_stats.get("candidates_proposed"),
        )
    rec["e2e_s"] = time.perf_counter() - start
    rec["em"] = metrics.exact_match(rec["answer"], item["answers"])
    rec["f1"] = metrics.f1(rec["answer"], item["answers"])
    rec["contains"] = metrics.contains(rec["answer"], item["answers"])
    gold = set(item["gold"])
    rec["recall_at_k"] = (
        (len(gold & set(rec["retrieved"])) / len(gold)) if system != "no_rag" else None
    )
    return rec


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system and added latency: accuracy, latency and decoding figures."""
    out: dict[str, Any] = {}
    serial = {
        (r["qid"], r["latency"]): r["answer"] for r in records if r["system"] == "serial_plain"
    }
    for system in SYSTEMS:
        per: dict[str, Any] = {}
        for latency in LATENCIES:
            if system == "no_rag" and latency:
                continue  # no retrieval, so no latency sweep
            rs = [r for r in records if r["system"] == system and r["latency"] == latency]
            if not rs:
                continue
            ppt = [r["passes_per_token"] for r in rs if r.get("passes_per_token") is not None]
            recall = [r["recall_at_k"] for r in rs if r.get("recall_at_k") is not None]
            row = {
                "n": len(rs),
                "em": metrics.mean([r["em"] for r in rs]),
                "f1": metrics.mean([r["f1"] for r in rs]),
                "contains": metrics.mean([r["contains"] for r in rs]),
                "recall_at_k": metrics.mean(recall) if recall else None,
                "ttft_s_median": metrics.median([r["ttft_s"] for r in rs if r.get("ttft_s")]),
                "draft_ttft_s_median": metrics.median(
                    [r["draft_ttft_s"] for r in rs if r.get("draft_ttft_s")]
                )
                or None,
                "e2e_s_median": metrics.median([r["e2e_s"] for r in rs]),
                "e2e_s_p90": metrics.percentile([r["e2e_s"] for r in rs], 90),
                "passes_per_token": metrics.mean(ppt) if ppt else None,
                "decode_s_mean": metrics.mean([r["decode_s"] for r in rs if r.get("decode_s")]),
                "routes": dict(Counter(r.get("route") for r in rs)),
            }
            if system in ("spec_verify", "spec_rewrite"):
                same = [
                    r["answer"] == serial.get((r["qid"], r["latency"]))
                    for r in rs
                    if (r["qid"], r["latency"]) in serial
                ]
                row["identical_to_serial_plain"] = metrics.mean([float(s) for s in same])
            per[str(latency)] = row
        out[system] = per
    # ratios measured in this run
    for lat_key in map(str, LATENCIES):
        base = out.get("serial_plain", {}).get(lat_key)
        look = out.get("serial_lookup", {}).get(lat_key)
        for system in ("spec_verify", "spec_rewrite", "serial_lookup"):
            row = out.get(system, {}).get(lat_key)
            if row and base:
                row["e2e_vs_serial_plain"] = row["e2e_s_median"] / base["e2e_s_median"]
                if base.get("decode_s_mean") and row.get("decode_s_mean"):
                    row["decode_vs_serial_plain"] = row["decode_s_mean"] / base["decode_s_mean"]
                if row.get("draft_ttft_s_median") and base.get("ttft_s_median"):
                    row["draft_ttft_vs_serial_ttft"] = (
                        row["draft_ttft_s_median"] / base["ttft_s_median"]
                    )
            if row and look and system != "serial_lookup":
                row["e2e_vs_serial_lookup"] = row["e2e_s_median"] / look["e2e_s_median"]
    return out


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def markdown(summary: dict[str, Any]) -> str:
    """The results as a markdown table."""
    cols = [
        "em",
        "f1",
        "contains",
        "recall_at_k",
        "draft_ttft_s_median",
        "ttft_s_median",
        "e2e_s_median",
        "e2e_s_p90",
        "passes_per_token",
        "decode_vs_serial_plain",
        "draft_ttft_vs_serial_ttft",
        "e2e_vs_serial_plain",
        "e2e_vs_serial_lookup",
        "identical_to_serial_plain",
    ]
    lines = [
        "| system | added latency (s, injected) | " + " | ".join(cols) + " | routes |",
        "|---|---|" + "---|" * len(cols) + "---|",
    ]
    for system, per in summary.items():
        for latency, row in per.items():
            if system == "no_rag" and latency != "0.0":
                continue  # the draft alone does not wait for retrieval
            routes = ", ".join(f"{k}:{v}" for k, v in row["routes"].items())
            lines.append(
                f"| {system} | {latency} | "
                + " | ".join(_fmt(row.get(c)) for c in cols)
                + f" | {routes} |"
            )
    return "\n".join(lines) + "\n"


def plots(summary: dict[str, Any], out_dir: Path) -> list[Path]:
    """latency.png (e2e median vs added retrieval latency) and accuracy.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system, per in summary.items():
        if system == "no_rag":
            continue
        xs = [float(k) for k in per]
        ax.plot(xs, [per[k]["e2e_s_median"] for k in per], marker="o", label=system)
    ax.set_xlabel("added retrieval latency (s, injected)")
    ax.set_ylabel("end-to-end latency, median (s)")
    ax.set_title("specrag bench rag: latency vs retrieval latency")
    ax.legend()
    ax.grid(alpha=0.3)
    latency_png = out_dir / "latency.png"
    fig.tight_layout()
    fig.savefig(latency_png, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    systems = list(summary)
    first = [next(iter(summary[s].values())) for s in systems]
    x = range(len(systems))
    ax.bar([i - 0.2 for i in x], [r["em"] for r in first], width=0.4, label="EM")
    ax.bar([i + 0.2 for i in x], [r["f1"] for r in first], width=0.4, label="F1")
    ax.set_xticks(list(x), systems, rotation=15)
    ax.set_ylabel("score")
    ax.set_title("specrag bench rag: accuracy per system")
    ax.legend()
    accuracy_png = out_dir / "accuracy.png"
    fig.tight_layout()
    fig.savefig(accuracy_png, dpi=110)
    plt.close(fig)
    return [latency_png, accuracy_png]


def run(*, quick: bool, out_dir: Path, log: Console, fresh: bool = False) -> dict[str, Any]:
    """Run (or resume) the benchmark; write JSON, markdown and plots; return the summary."""
    out_dir = out_dir / "bench_rag"
    out_dir.mkdir(parents=True, exist_ok=True)
    n_squad, n_hotpot = (4, 2) if quick else (40, 20)
    runlog = RunLog(out_dir / ("runs-quick.jsonl" if quick else "runs.jsonl"), fresh=fresh)
    items = build_datasets(n_squad, n_hotpot, log)
    base = SpecRagContext(refine_temperature=0.0, answer_max_tokens=64)
    load_lm(base.answer_model, base.device, base.dtype)
    graph = build_graph()
    work = [(item, "no_rag", 0.0) for item in items]
    work += [(item, s, lat) for lat in LATENCIES for item in items for s in SYSTEMS[1:]]

    async def go() -> None:
        with progress_bar(log) as bar:
            task = bar.add_task("bench rag", total=len(work))
            for item, system, latency in work:
                key = f"{item['dataset']}|{item['id']}|{system}|{latency}"
                if not runlog.done(key):
                    runlog.add(key, await run_one(item, system, latency, graph, base))
                bar.advance(task)

    asyncio.run(go())
    keys = {f"{i['dataset']}|{i['id']}|{s}|{lat}" for i, s, lat in work}
    records = [r for k, r in runlog.records.items() if k in keys]
    summary = summarize(records)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "table.md").write_text(markdown(summary))
    pngs = plots(summary, out_dir)
    files = [
        str(out_dir / "summary.json"),
        str(out_dir / "table.md"),
        *map(str, pngs),
        str(runlog.path),
    ]
    log.print(markdown(summary))
    log.print("results written to: " + ", ".join(files))
    return {
        "benchmark": "rag",
        "quick": quick,
        "questions": len(items),
        "added_latencies_s": LATENCIES,
        "systems": summary,
        "files": files,
    }
