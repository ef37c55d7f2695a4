"""``generate``: serial RAG - answer from the evidence alone (no draft)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage

from specrag import prompts
from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.state import State
from specrag.models.options import DecodeOptions
from specrag.nodes.answer import AnswerCall, drafter_messages, make_answer_node


def make_generate(services: Services):  # noqa: ANN201
    """Build the generate node (an error routes to ``fallback``)."""

    def build(state: State, ctx: SpecRagContext) -> AnswerCall:
        question, chunks = state.get("question", ""), state.get("chunks") or []
        history = state.get("history") or []

        def make(some: list[dict[str, Any]]) -> list[BaseMessage]:
            return prompts.evidence_messages(question, some, ctx.answer_prompt, history)

        return AnswerCall(
            model=services.chat_model(ctx.answer_spec, ctx),
            messages=make(chunks),
            options=DecodeOptions(
                temperature=ctx.refine_temperature,
                max_new_tokens=ctx.answer_max_tokens,
                speculation="none" if ctx.speculation == "none" else "prompt",
                seed=state.get("seed"),
                stop=ctx.stop_sequences(),
                drafter_messages=drafter_messages(ctx, chunks, make),
            ),
        )

    return make_answer_node("generate", services, build)
