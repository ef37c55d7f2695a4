"""``rapid_generate``: answer about a long document with RAPID decoding.

The target reads the whole document; the drafter reads the chunks ``retrieve`` found in it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.runtime import Runtime

from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.state import State
from specrag.nodes.common import answer_update, short_error


def make_rapid_generate(services: Services):  # noqa: ANN201
    """Build the rapid_generate node."""

    async def rapid_generate(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        chunks = state.get("chunks") or []
        try:
            model = services.rapid_model(ctx)
            await asyncio.to_thread(services.warm, model)
            update = await answer_update(
                model,
                [SystemMessage(ctx.answer_prompt), HumanMessage(state.get("question", ""))],
                dict(state),
                node="rapid_generate",
                budget_s=ctx.answer_timeout_s,
                local_kwargs={
                    "document": state.get("document", ""),
                    "drafter_context": "\n\n".join(str(c.get("text", "")) for c in chunks),
                },
            )
        except Exception as exc:  # noqa: BLE001 - routed to generate
            return {
                "answer_error": f"rapid_generate: {short_error(exc)}",
                "errors": [f"rapid_generate: {short_error(exc)}"],
            }
        return update

    return rapid_generate
