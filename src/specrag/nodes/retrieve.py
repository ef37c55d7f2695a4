"""``retrieve``: search the index (or the run's document) under the retrieval budget."""

from __future__ import annotations

import asyncio
from typing import Any

from langgraph.runtime import Runtime

from specrag import prompts
from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.signals import retrieval_signal
from specrag.graph.state import State
from specrag.models.options import DecodeOptions
from specrag.nodes.answer import short_error
from specrag.nodes.streaming import emit, now, stream_model


async def followup_query(
    question: str, history: list[dict[str, str]], ctx: SpecRagContext, services: Services
) -> str:
    """The retrieval query: a follow-up question made self-contained from the history.

    ``concat``: the previous user question, then this one ("Who was the Norse leader? And
    when did he die?"); ``model``: the draft model rewrites it (greedy, <= 32 tokens; an empty
    or failed rewrite falls back to ``concat``); ``off`` or no history: the question itself.
    """
    previous = [t["content"] for t in history if t["role"] == "user"]
    if ctx.query_rewrite == "off" or not previous:
        return question
    concat = f"{previous[-1]} {question}"
    if ctx.query_rewrite == "concat":
        return concat
    try:
        result = await stream_model(
            services.chat_model(ctx.draft_spec, ctx),
            prompts.query_rewrite_messages(question, history),
            budget_s=ctx.retrieval_timeout_s,  # the search waits within the same budget
            tags=["query_rewrite"],
            options=DecodeOptions(temperature=0.0, max_new_tokens=32, speculation="none"),
        )
        text = result.text.strip('"').splitlines()
        return text[0].strip() if text and text[0].strip() else concat
    except Exception:  # noqa: BLE001 - rewriting is an aid: never fail retrieval over it
        return concat


def make_retrieve(services: Services):  # noqa: ANN201 - a node function
    """Build the retrieve node."""

    async def retrieve(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        question = state.get("question", "")
        document = state.get("run_document") or None
        start = now()
        update: dict[str, Any] = {"query": question}
        try:

            async def search() -> list[Any]:
                query = await followup_query(question, state.get("history") or [], ctx, services)
                update["query"] = query
                if ctx.added_retrieval_latency_s > 0:  # injected (benchmarks only)
                    await asyncio.sleep(ctx.added_retrieval_latency_s)
                return await asyncio.to_thread(services.retriever, query, document, ctx)

            chunks = await asyncio.wait_for(search(), timeout=ctx.retrieval_timeout_s)
            found = [c.as_dict() for c in chunks]
            relevant = [c for c in found if c["score"] >= ctx.relevance_threshold]
            if document:
                relevant = found  # the document is the user's chosen evidence
            status = "ok" if relevant else ("irrelevant" if found else "empty")
            update.update(chunks=relevant, retrieval_status=status)
            if found and not relevant:
                update["errors"] = [
                    f"retrieve: best score {max(c['score'] for c in found):.2f} "
                    f"< relevance_threshold {ctx.relevance_threshold}"
                ]
        except TimeoutError:
            update.update(chunks=[], retrieval_status="timeout")
            update["errors"] = [f"retrieve: no result within {ctx.retrieval_timeout_s}s"]
        except Exception as exc:  # noqa: BLE001 - becomes the fallback route
            update.update(chunks=[], retrieval_status="failed")
            update["errors"] = [f"retrieve: {short_error(exc)}"]
        if update["retrieval_status"] == "ok":
            # "draft while you wait" stops now. Without evidence the draft runs on within its
            # own budget: it may become the run's (unverified) answer.
            retrieval_signal(dict(state)).set()
        update["timings"] = {"retrieve_s": round(now() - start, 4)}
        emit(
            {
                "event": "retrieved",
                "status": update["retrieval_status"],
                "chunks": len(update["chunks"]),
                "retrieve_s": update["timings"]["retrieve_s"],
            }
        )
        return update

    return retrieve
