"""``draft``: answer without evidence while retrieval runs; confidence from log-probs.

Confidence = ``exp(mean_i log p(token_i))`` over the draft's tokens, the geometric mean of the
token probabilities under the draft model (untempered). ``None`` when the model reports no
log-probabilities.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.runtime import Runtime

from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.state import State
from specrag.nodes.common import emit, now, retrieval_signal, short_error, stream_model


def make_draft(services: Services):  # noqa: ANN201
    """Build the draft node."""

    async def draft(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        marks = {"draft": now()}
        if ctx.draft_policy == "off":
            return {
                "marks": marks,
                "draft": "",
                "draft_status": "off",
                "draft_tokens": 0,
                "draft_confidence": None,
                "draft_truncated": False,
            }
        try:
            model = services.chat_model(ctx.draft_model, ctx)
            await asyncio.to_thread(services.warm, model)  # a first load is not a timeout
            start = now()
            messages = [
                SystemMessage(ctx.draft_prompt),
                HumanMessage(state.get("question", "")),
            ]
            until_retrieval = ctx.draft_policy == "until_retrieval"
            result = await stream_model(
                model,
                messages,
                budget_s=ctx.draft_timeout_s,
                tags=["draft"],
                local_kwargs={
                    "temperature": ctx.draft_temperature,
                    "max_new_tokens": ctx.draft_max_tokens,
                    "speculation": "none",
                },
                # stops within one token of retrieval finishing ("draft while you wait")
                stop_event=retrieval_signal(runtime) if until_retrieval else None,
            )
        except Exception as exc:  # noqa: BLE001 - becomes the generate route
            return {
                "marks": marks,
                "draft": "",
                "draft_status": "failed",
                "draft_tokens": 0,
                "draft_confidence": None,
                "draft_truncated": False,
                "errors": [f"draft: {short_error(exc)}"],
            }
        truncated = result.timed_out or result.stopped
        if not result.text:
            status = "timeout" if result.timed_out else "empty"
        else:
            status = "truncated" if truncated else "ok"
        timings = {"draft_s": round(result.elapsed_s, 4)}
        if result.ttft_s is not None:
            timings["draft_ttft_s"] = round(start - marks["draft"] + result.ttft_s, 4)
        emit(
            {
                "event": "drafted",
                "status": status,
                "tokens": result.tokens,
                "confidence": result.confidence,
                **timings,
            }
        )
        return {
            "marks": marks,
            "draft": result.text,
            "draft_status": status,
            "draft_tokens": result.tokens,
            "draft_truncated": truncated,
            "draft_confidence": result.confidence,
            "timings": timings,
        }

    return draft
