"""``fallback``: the graceful end - the draft marked unverified, or an honest message."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from specrag import prompts
from specrag.graph.context import SpecRagContext
from specrag.graph.state import State
from specrag.nodes.common import emit, now, run_timings


async def fallback(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
    """Answer without evidence: never raises."""
    ctx = runtime.context or SpecRagContext()
    draft = (state.get("draft") or "").strip()
    usable = (
        draft
        and state.get("draft_status") in ("ok", "truncated")
        and int(state.get("draft_tokens") or 0) >= ctx.min_draft_tokens
    )
    if usable:
        answer = prompts.UNVERIFIED_PREFIX + draft
    elif state.get("retrieval_status") == "ok" and state.get("answer_error"):
        answer = prompts.ANSWER_FAILED  # evidence was found but no model could answer from it
    else:
        answer = prompts.NO_EVIDENCE_ANSWER
    reason = state.get("reason", "")
    if state.get("answer_error"):
        reason = f"{reason}; {state['answer_error']} -> fallback"
    timings = run_timings(dict(state), now())
    emit({"event": "answered", "node": "fallback", **timings})
    return {
        "answer": answer,
        "route": "fallback",
        "reason": reason,
        "verified": False,
        "citations": [],
        "timings": timings,
    }
