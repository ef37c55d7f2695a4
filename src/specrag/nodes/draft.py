"""``draft``: answer without evidence while retrieval runs; confidence from log-probs.

Confidence = ``exp(mean_i log p(token_i))`` over the draft's tokens, the geometric mean of the
token probabilities under the draft model (untempered). ``None`` when the model reports no
log-probabilities.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from langgraph.runtime import Runtime

from specrag import prompts
from specrag.errors import short_error
from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.graph.signals import cancel_search_behind, retrieval_signal
from specrag.graph.state import State
from specrag.models.options import DecodeOptions
from specrag.nodes.streaming import emit, live_marks, now, resumed_origin, stream_model


def draft_seed(seed: int | None) -> int | None:
    """The draft's own seed, drawn from the run's ``seed`` (the answer's).

    Not the run's seed itself: the draft's tokens are candidates the answer model verifies,
    and speculative sampling is exact only where candidates are independent of the verifier's
    random draws - the same seed made them one stream (a sampled answer's first tokens were
    measurably off the model's distribution, p < 0.001; a review, 2026-12-06).
    """
    if seed is None:
        return None
    digest = hashlib.sha256(f"specrag-draft:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1  # < 2**31, as the run's own: a remote API's
    # seed field may be a signed 32- or 64-bit integer


def _drafted(status: str, tokens: int, confidence: float | None, timings: dict[str, float]) -> None:
    """The ``drafted`` event: how the draft ended, whether or not there is one."""
    emit(
        {
            "event": "drafted",
            "status": status,
            "tokens": tokens,
            "confidence": confidence,
            **timings,
        }
    )


def _no_draft(status: str, **extra: Any) -> dict[str, Any]:
    """No draft (``off``, ``failed``): its ``drafted`` event still comes, as README says."""
    _drafted(status, 0, None, extra.get("timings", {}))
    return {
        "draft": "",
        "draft_status": status,
        "draft_tokens": 0,
        "draft_confidence": None,
        "draft_truncated": False,
        **extra,
    }


def make_draft(services: Services):  # noqa: ANN201
    """Build the draft node."""

    async def draft(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        if ctx.draft_policy == "off":
            return _no_draft("off")
        start = now()
        try:
            model = services.chat_model(ctx.draft_spec, ctx)
            await asyncio.to_thread(services.warm, model)  # loaded in prepare: a no-op
            until_retrieval = ctx.draft_policy == "until_retrieval"
            result = await stream_model(
                model,
                prompts.draft_messages(
                    state.get("question", ""), ctx.draft_prompt, state.get("history") or []
                ),
                budget_s=ctx.draft_timeout_s,
                tags=["draft"],
                options=DecodeOptions(
                    temperature=ctx.draft_temperature,
                    max_new_tokens=ctx.draft_max_tokens,
                    speculation="none",
                    seed=draft_seed(state.get("seed")),
                    stop=ctx.stop_sequences(),
                ),
                # stops within one token of retrieval delivering evidence
                stop_event=retrieval_signal(dict(state)) if until_retrieval else None,
                confidence=True,  # a remote model's log-probabilities too: the gate reads them
            )
        except asyncio.CancelledError:  # the run is cancelled: the search retrieve left
            cancel_search_behind(dict(state))  # running for the later batches stops too
            raise
        except Exception as exc:  # noqa: BLE001 - becomes the generate route
            # what the failed attempt took (retries of a remote call held the gate up)
            origin = live_marks(dict(state)).get("origin", start)
            return _no_draft(
                "failed",
                errors=[f"draft: {short_error(exc)}"],
                timings={"draft_s": round(now() - origin, 4)},
                **resumed_origin(dict(state), start),
            )
        # cut by its budget, by retrieval, or - text it wrote - by its token limit ("length":
        # mid-sentence too; a limit before any text is an empty draft, not one retrieval cut)
        at_limit = result.metadata.get("finish_reason") == "length" and bool(result.text)
        truncated = result.timed_out or result.stopped or at_limit
        if not result.text:
            status = "timeout" if result.timed_out else "empty"
        else:
            status = "truncated" if truncated else "ok"
        # both from the run's origin, as ttft_s is (the node's start where the origin is not
        # this process's: a resumed run): draft_ttft_s <= draft_s always
        origin = live_marks(dict(state)).get("origin", start)
        timings = {"draft_s": round(now() - origin, 4)}
        if result.ttft_s is not None:
            timings["draft_ttft_s"] = round(result.started - origin + result.ttft_s, 4)
        _drafted(status, result.tokens, result.confidence, timings)
        return {
            "draft": result.text,
            "draft_status": status,
            "draft_tokens": result.tokens,
            "draft_truncated": truncated,
            "draft_confidence": result.confidence,
            "timings": timings,
            **resumed_origin(dict(state), start),
        }

    return draft
