"""``generate``: serial RAG - answer from the evidence alone (no draft)."""

from __future__ import annotations

from specrag import prompts
from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.state import State
from specrag.models.options import DecodeOptions
from specrag.nodes.answer import AnswerCall, make_answer_node


def make_generate(services: Services):  # noqa: ANN201
    """Build the generate node (an error routes to ``fallback``)."""

    def build(state: State, ctx: SpecRagContext) -> AnswerCall:
        return AnswerCall(
            model=services.chat_model(ctx.answer_spec, ctx),
            messages=prompts.evidence_messages(
                state.get("question", ""),
                state.get("chunks") or [],
                ctx.answer_prompt,
                state.get("history") or [],
            ),
            options=DecodeOptions(
                temperature=ctx.refine_temperature,
                max_new_tokens=ctx.answer_max_tokens,
                speculation="none" if ctx.speculation == "none" else "prompt",
                seed=state.get("seed"),
                stop=ctx.stop_sequences(),
            ),
        )

    return make_answer_node("generate", services, build)
