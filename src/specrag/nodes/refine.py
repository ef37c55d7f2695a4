"""``refine``: check the draft against the evidence.

* ``verify`` (default): the answer model gets the same prompt as ``generate`` (evidence +
  question, no draft); the draft's tokens and the evidence's n-grams are only speculative
  candidates, so greedy output is identical to serial RAG and decoding takes fewer passes.
* ``rewrite``: the model reads question + evidence + draft and edits the draft (keeps what the
  evidence supports, corrects contradictions, adds what is missing).
"""

from __future__ import annotations

from specrag import prompts
from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.state import State
from specrag.models.options import DecodeOptions
from specrag.nodes.answer import AnswerCall, make_answer_node


def make_refine(services: Services):  # noqa: ANN201
    """Build the refine node (an error routes to ``generate``)."""

    def build(state: State, ctx: SpecRagContext) -> AnswerCall:
        question, chunks = state.get("question", ""), state.get("chunks") or []
        if ctx.refine_mode == "verify":
            messages = prompts.evidence_messages(
                question, chunks, ctx.answer_prompt, state.get("history") or []
            )
        else:
            messages = prompts.rewrite_messages(
                question, chunks, state.get("draft", ""), ctx.rewrite_prompt
            )
        return AnswerCall(
            model=services.chat_model(ctx.answer_spec, ctx),
            messages=messages,
            options=DecodeOptions(
                temperature=ctx.refine_temperature,
                max_new_tokens=ctx.answer_max_tokens,
                speculation=ctx.speculation,
                draft=state.get("draft", ""),
                seed=state.get("seed"),
                stop=ctx.stop_sequences(),
            ),
        )

    node = make_answer_node("refine", services, build)

    async def refine(state: State, runtime):  # noqa: ANN001, ANN202
        update = await node(state, runtime)
        if "answer" in update:
            ctx = runtime.context or SpecRagContext()
            update["stats"] = {**update["stats"], "refine_mode": ctx.refine_mode}
        return update

    return refine
