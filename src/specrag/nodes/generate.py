"""``generate``: serial RAG - answer from the evidence alone (no draft)."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.runtime import Runtime

from specrag import prompts
from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.state import State
from specrag.nodes.common import answer_update, short_error


def evidence_messages(state: State, ctx: SpecRagContext) -> list[Any]:
    """The serial-RAG prompt: system + evidence blocks + question."""
    user = prompts.ANSWER_USER.format(
        evidence=prompts.format_evidence(state.get("chunks") or []),
        question=state.get("question", ""),
    )
    return [SystemMessage(ctx.answer_prompt), HumanMessage(user)]


def make_generate(services: Services):  # noqa: ANN201
    """Build the generate node."""

    async def generate(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        try:
            model = services.chat_model(ctx.answer_model, ctx)
            await asyncio.to_thread(services.warm, model)
            update = await answer_update(
                model,
                evidence_messages(state, ctx),
                dict(state),
                node="generate",
                budget_s=ctx.answer_timeout_s,
                local_kwargs={
                    "temperature": ctx.refine_temperature,
                    "max_new_tokens": ctx.answer_max_tokens,
                    "speculation": "none" if ctx.speculation == "none" else "prompt",
                },
            )
        except Exception as exc:  # noqa: BLE001 - routed to fallback
            message = f"generate: {short_error(exc)}"
            earlier = state.get("answer_error")  # refine/rapid_generate failed first
            chain = f"{earlier} -> generate; {message}" if earlier else message
            return {"answer_error": chain, "errors": [message]}
        if state.get("answer_error"):  # we got here from a failed refine / rapid_generate
            update["reason"] = f"{state.get('reason', '')}; {state['answer_error']} -> generate"
        return update

    return generate
