"""``retrieve``: search the index (or the run's document) under the retrieval budget."""

from __future__ import annotations

import asyncio
from typing import Any

from langgraph.runtime import Runtime

from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.signals import retrieval_signal
from specrag.graph.state import State
from specrag.nodes.answer import short_error
from specrag.nodes.streaming import emit, now


def make_retrieve(services: Services):  # noqa: ANN201 - a node function
    """Build the retrieve node."""

    async def retrieve(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        question = state.get("question", "")
        document = state.get("run_document") or None
        start = now()
        update: dict[str, Any] = {}
        try:

            async def search() -> list[Any]:
                if ctx.added_retrieval_latency_s > 0:  # injected (benchmarks only)
                    await asyncio.sleep(ctx.added_retrieval_latency_s)
                return await asyncio.to_thread(services.retriever, question, document, ctx)

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
