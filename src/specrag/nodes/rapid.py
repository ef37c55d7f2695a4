"""``rapid_generate``: answer about a long document with RAPID decoding.

The target reads the whole document; the drafter reads the chunks ``retrieve`` found in it.
"""

from __future__ import annotations

from langchain_core.messages import HumanMessage, SystemMessage

from specrag import prompts
from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.state import State
from specrag.models.options import DecodeOptions
from specrag.nodes.answer import AnswerCall, make_answer_node


def make_rapid_generate(services: Services):  # noqa: ANN201
    """Build the rapid_generate node (an error: ``generate``, or ``fallback`` without evidence)."""

    def build(state: State, ctx: SpecRagContext) -> AnswerCall:
        chunks = state.get("chunks") or []
        return AnswerCall(
            # ChatRapid defuses control tokens in the document, the chunks and the question
            model=services.rapid_model(ctx),
            messages=[  # earlier turns after the document (layout): its prefix stays cached
                SystemMessage(ctx.answer_prompt),
                *prompts.history_messages(state.get("history") or []),
                HumanMessage(state.get("question", "")),
            ],
            options=DecodeOptions(
                document=state.get("run_document", ""),
                # no relevant chunk found (the search failed): ChatRapid's own retriever
                drafter_context="\n\n".join(str(c.get("text", "")) for c in chunks)
                if chunks
                else None,
                seed=state.get("seed"),
                stop=ctx.stop_sequences(),
            ),
        )

    return make_answer_node("rapid_generate", services, build)
