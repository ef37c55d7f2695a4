"""Incremental answers through the graph, on the embedded SmolLM2 (the article's third path).

The search delivers a misleading first batch (the French and Indian War paragraph naming
Tanaghrisson, a "leader") and, only once the answer has streamed a few tokens, a second batch
that re-ranks the evidence (the Normans paragraphs naming Rollo). The incremental answer must
start from the first batch, retract what the second contradicts, and end token-identical to
the serial (``wait``) answer over the final evidence.
"""

import asyncio
import threading

import pytest

from specrag import SpecRagContext, build_graph
from specrag.data.datasets import squad_paragraphs
from specrag.graph.services import Services
from specrag.indexing.documents import Chunk
from specrag.indexing.store import Batch

pytestmark = pytest.mark.integration

QUESTION = "Who was the Norse leader?"


def paragraph(pid: str, score: float) -> Chunk:
    text = next(p.text for p in squad_paragraphs() if p.id == pid)  # ids: squad:Title:n
    return Chunk(id=pid, source=pid, text=text, score=score)


MISLEADING = paragraph("squad:French_and_Indian_War:18", 0.38)
RANKED = [paragraph("squad:Normans:4", 0.37), paragraph("squad:Normans:0", 0.36), MISLEADING]


def gated_batches(release: threading.Event):
    """Batch 1 at once; batch 2 (a re-ranking) only when ``release`` is set."""

    def batches(query, document, ctx):
        yield Batch("dense", [MISLEADING])
        assert release.wait(60), "the answer never streamed"
        yield Batch("hybrid", RANKED[:2], RANKED)

    return batches


def run(policy: str, route_settings: dict, release: threading.Event, after_tokens: int = 4):
    """Stream one run; release batch 2 once ``after_tokens`` answer chunks were streamed."""
    ctx = SpecRagContext(
        answer_policy=policy, retrieval_timeout_s=60, answer_timeout_s=120, **route_settings
    )
    graph = build_graph(Services(batch_retriever=gated_batches(release)))

    async def go():
        final, revises, streamed = {}, [], 0
        async for mode, payload in graph.astream(
            {"question": QUESTION}, context=ctx, stream_mode=["messages", "custom", "values"]
        ):
            if mode == "messages":
                chunk, meta = payload
                if meta.get("langgraph_node") in ("refine", "generate") and chunk.content:
                    streamed += 1
                    if streamed >= after_tokens:
                        release.set()
            elif mode == "custom" and payload.get("event") == "revise":
                revises.append(payload)
            elif mode == "values":
                final = payload
        return final, revises

    return asyncio.run(go())


ROUTES = {
    "generate": {"draft_policy": "off"},
    "refine": {
        "draft_policy": "complete",
        "draft_max_tokens": 12,
        "draft_temperature": 0.0,
        "min_draft_tokens": 0,
        "confidence_threshold": 0.0,
        "draft_timeout_s": 60.0,  # a loaded machine must not turn this route into generate
    },
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_incremental_answer_retracts_and_equals_serial_rag(route):
    released = threading.Event()
    released.set()  # wait: batch 2 comes at once, the answer starts after it
    serial, none = run("wait", ROUTES[route], released)
    assert not none and not serial["revisions"]

    incremental, revises = run("incremental", ROUTES[route], threading.Event())
    assert incremental["route"] == serial["route"] == route
    # the answer started from batch 1 and was revised when batch 2 re-ranked the evidence
    assert revises, incremental["answer"]
    # each event names the node whose text it cuts; the state's revisions are that node's
    assert all(r["node"] == route for r in revises)
    same = [{k: r[k] for k in r if k not in ("event", "node")} for r in revises]
    assert incremental["revisions"] == same
    assert all(r["dropped_tokens"] > 0 and r["dropped_text"] for r in revises)
    stats = incremental["stats"][route]
    assert stats["rebuilds"] and stats["rebuilds"][-1]["reused_prefix_tokens"] > 0
    # ... and ends as serial RAG over the final evidence, in the canonical order
    assert incremental["answer"] == serial["answer"]
    assert [c["id"] for c in incremental["chunks"]] == [c.id for c in RANKED]
    assert [c["id"] for c in incremental["citations"]] == [c.id for c in RANKED]
    assert incremental["chunks"] == serial["chunks"]
    sources = [b["source"] for b in incremental["batches"]]
    assert sources == ["dense", "hybrid"] == [b["source"] for b in serial["batches"]]
    first, second = incremental["batches"]
    assert first["chunks"] == [MISLEADING.id] and first["arrival_s"] < second["arrival_s"]
    assert second.get("dropped") is None  # re-ranked to third, still in the top k


def test_a_batch_within_the_grace_joins_the_first_prompt():
    """A later batch that arrives before the first prefill costs no rebuild (local stores)."""
    released = threading.Event()
    released.set()  # batch 2 comes at once
    serial, _ = run("wait", ROUTES["generate"], released)
    settings = {**ROUTES["generate"], "incremental_grace_s": 5.0}
    incremental, revises = run("incremental", settings, released)
    assert not revises and not incremental["revisions"]
    assert incremental["stats"]["generate"].get("rebuilds", []) == []
    assert incremental["answer"] == serial["answer"]
    assert incremental["chunks"] == serial["chunks"]
    assert [b["source"] for b in incremental["batches"]] == ["dense", "hybrid"]


def test_an_answer_ended_by_its_budget_stops_the_search_and_says_so():
    """Batch 2 never comes within the answer budget: the answer (from batch 1) is final, the
    search behind it is stopped, and the errors say its later batches were not woven in
    (before, the search ran on to the retrieval deadline and the evidence was reported
    complete)."""
    never = threading.Event()
    asked = []

    def batches(query, document, ctx):
        yield Batch("dense", [MISLEADING])
        asked.append("batch 2")
        never.wait(8)  # past the 6 s answer budget (asyncio.run waits for this thread)
        yield Batch("hybrid", RANKED[:2], RANKED)

    ctx = SpecRagContext(
        answer_policy="incremental",
        retrieval_timeout_s=60,
        answer_timeout_s=6.0,  # room for the first token on a loaded machine; < the 8 s above
        draft_policy="off",
    )
    graph = build_graph(Services(batch_retriever=batches))
    try:
        result = asyncio.run(graph.ainvoke({"question": QUESTION}, context=ctx))
    finally:
        never.set()
    assert result["route"] == "generate" and result["answer"], result["reason"]
    assert asked == ["batch 2"] and [b["source"] for b in result["batches"]] == ["dense"]
    ended = (  # cut by its 6 s budget, or done within it (a terse answer on a fast machine)
        "the answer budget ended the answer first"
        if result["stats"]["generate"].get("truncated")
        else "the answer ended before them"
    )
    assert f"retrieve: later batches were not woven in: {ended}" in result["errors"]
