"""``retrieve``: search the index (or the input document) under the retrieval budget."""

from __future__ import annotations

import asyncio
from typing import Any

from langgraph.runtime import Runtime

from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services, answer_token_length
from specrag.graph.state import State
from specrag.nodes.common import emit, now, retrieval_signal, short_error


def make_retrieve(services: Services):  # noqa: ANN201 - a node function
    """Build the retrieve node."""

    async def retrieve(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        question = state.get("question", "")
        document = state.get("document") or None
        signal = retrieval_signal(runtime)
        update: dict[str, Any] = {"marks": {"retrieve": now()}, "document_tokens": 0}
        try:
            # Loading the embedding model (first run only) is not part of the budget.
            await asyncio.to_thread(services.warm_retriever, ctx, document)
            if document:
                count = answer_token_length(ctx)
                update["document_tokens"] = await asyncio.to_thread(count, document)
            start = now()

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
            start = update["marks"]["retrieve"]
            update.update(chunks=[], retrieval_status="timeout")
            update["errors"] = [f"retrieve: no result within {ctx.retrieval_timeout_s}s"]
        except Exception as exc:  # noqa: BLE001 - becomes the fallback route
            start = update["marks"]["retrieve"]
            update.update(chunks=[], retrieval_status="failed")
            update["errors"] = [f"retrieve: {short_error(exc)}"]
        finally:
            signal.set()  # "draft while you wait" stops now
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
