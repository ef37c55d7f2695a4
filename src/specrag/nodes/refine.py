"""``refine``: check the draft against the evidence.

* ``verify`` (default): the answer model gets the same prompt as ``generate`` (evidence +
  question, no draft); the draft's tokens and the evidence's n-grams are only speculative
  candidates, so greedy output is identical to serial RAG and decoding takes fewer passes.
* ``rewrite``: the model reads question + evidence + draft and edits the draft (keeps what the
  evidence supports, corrects contradictions, adds what is missing).
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage

from specrag import prompts
from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.state import State
from specrag.models.options import DecodeOptions
from specrag.nodes.answer import AnswerCall, drafter_messages, make_answer_node


def make_refine(services: Services):  # noqa: ANN201
    """Build the refine node (an error routes to ``generate``)."""

    def build(state: State, ctx: SpecRagContext) -> AnswerCall:
        question, chunks = state.get("question", ""), state.get("chunks") or []
        history, draft = state.get("history") or [], state.get("draft", "")

        def make(some: list[dict[str, Any]]) -> list[BaseMessage]:
            if ctx.refine_mode == "verify":
                return prompts.evidence_messages(question, some, ctx.answer_prompt, history)
            return prompts.rewrite_messages(question, some, draft, ctx.rewrite_prompt, history)

        return AnswerCall(
            model=services.chat_model(ctx.answer_spec, ctx),
            messages=make(chunks),
            options=DecodeOptions(
                temperature=ctx.refine_temperature,
                max_new_tokens=ctx.answer_max_tokens,
                speculation=ctx.speculation,
                draft=draft,
                seed=state.get("seed"),
                stop=ctx.stop_sequences(),
                drafter_messages=drafter_messages(ctx, chunks, make),
            ),
        )

    node = make_answer_node("refine", services, build)

    async def refine(state: State, runtime):  # noqa: ANN001, ANN202
        update = await node(state, runtime)
        if "answer" in update:
            ctx = runtime.context or SpecRagContext()
            # under the node's own stats: `stats` maps each node to a dict
            stats = update.get("stats") or {}
            update["stats"] = {
                **stats,
                "refine": {**stats.get("refine", {}), "refine_mode": ctx.refine_mode},
            }
        return update

    return refine
