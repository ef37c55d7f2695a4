"""``fallback``: the graceful end - the draft marked unverified, or an honest message."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from specrag import prompts
from specrag.graph.context import SpecRagContext
from specrag.graph.routing import draft_usable
from specrag.graph.state import State
from specrag.nodes.answer import answer_message, final_reason, run_timings
from specrag.nodes.streaming import emit, now


async def fallback(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
    """Answer without evidence: never raises."""
    ctx = runtime.context or SpecRagContext()
    usable, why_not = draft_usable(dict(state), ctx)
    draft = (state.get("draft") or "").strip()
    if draft and state.get("draft_truncated"):  # "It is approximately 5,838" read as whole
        draft += prompts.DRAFT_CUT_SUFFIX
    evidence_found = state.get("retrieval_status") == "ok"
    # a search that timed out or failed found nothing because it looked at nothing
    unsearched = state.get("retrieval_status") in ("timeout", "failed")
    if evidence_found and state.get("answer_error"):  # no answer model could use the evidence
        answer = prompts.UNCHECKED_PREFIX + draft if usable else prompts.ANSWER_FAILED
    elif state.get("run_document") and state.get("answer_error"):  # RAPID read it, and failed
        answer = (
            prompts.DOCUMENT_UNCHECKED_PREFIX + draft if usable else prompts.DOCUMENT_ANSWER_FAILED
        )
    elif usable:
        answer = (prompts.UNSEARCHED_PREFIX if unsearched else prompts.UNVERIFIED_PREFIX) + draft
    elif state.get("run_document"):  # a run about a given document, not the index
        answer = (
            prompts.SEARCH_FAILED_IN_DOCUMENT if unsearched else prompts.NO_EVIDENCE_IN_DOCUMENT
        )
    else:
        answer = prompts.SEARCH_FAILED_ANSWER if unsearched else prompts.NO_EVIDENCE_ANSWER
    reason = final_reason(dict(state), "fallback")
    if draft and not usable:  # a draft there was, not shown: why (the reason named retrieval)
        reason += f"; the draft is not shown ({why_not})"
    t = now()
    timings = run_timings(dict(state), t, fallback_origin=t)  # resumed here: from its start
    emit(
        {
            "event": "answered",
            "node": "fallback",
            "route": "fallback",
            "reason": reason,
            **timings,
        }
    )
    update: dict[str, Any] = {
        "answer": answer,
        "route": "fallback",
        "reason": reason,
        "verified": False,
        "citations": [],
        "timings": timings,
    }
    return {**update, **answer_message(state, update)}
