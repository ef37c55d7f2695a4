"""``refine``: check the draft against the evidence.

* ``verify`` (default): the answer model gets the same prompt as ``generate`` (evidence +
  question, no draft); the draft's tokens and the evidence's n-grams are only speculative
  candidates, so greedy output is identical to serial RAG and decoding takes fewer passes.
* ``rewrite``: the model reads question + evidence + draft and edits the draft (keeps what the
  evidence supports, corrects contradictions, adds what is missing).
"""

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
from specrag.nodes.generate import evidence_messages


def rewrite_messages(state: State, ctx: SpecRagContext) -> list[Any]:
    """The rewrite prompt: evidence + question + draft."""
    user = prompts.REWRITE_USER.format(
        evidence=prompts.format_evidence(state.get("chunks") or []),
        question=state.get("question", ""),
        draft=state.get("draft", ""),
    )
    return [SystemMessage(ctx.rewrite_prompt), HumanMessage(user)]


def make_refine(services: Services):  # noqa: ANN201
    """Build the refine node."""

    async def refine(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        try:
            model = services.chat_model(ctx.answer_model, ctx)
            await asyncio.to_thread(services.warm, model)
            messages = (
                evidence_messages(state, ctx)
                if ctx.refine_mode == "verify"
                else rewrite_messages(state, ctx)
            )
            update = await answer_update(
                model,
                messages,
                dict(state),
                node="refine",
                budget_s=ctx.answer_timeout_s,
                local_kwargs={
                    "temperature": ctx.refine_temperature,
                    "max_new_tokens": ctx.answer_max_tokens,
                    "speculation": ctx.speculation,
                    "draft": state.get("draft", ""),
                },
            )
        except Exception as exc:  # noqa: BLE001 - routed to generate
            return {
                "answer_error": f"refine: {short_error(exc)}",
                "errors": [f"refine: {short_error(exc)}"],
            }
        update["stats"] = {**update["stats"], "refine_mode": ctx.refine_mode}
        return update

    return refine
