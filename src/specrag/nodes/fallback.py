"""``fallback``: the graceful end - the draft marked unverified, or an honest message."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from specrag import prompts
from specrag.graph.context import SpecRagContext
from specrag.graph.routing import draft_usable
from specrag.graph.state import State
from specrag.nodes.answer import run_timings
from specrag.nodes.streaming import emit, now


async def fallback(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
    """Answer without evidence: never raises."""
    ctx = runtime.context or SpecRagContext()
    usable, _ = draft_usable(dict(state), ctx)
    if usable:
        answer = prompts.UNVERIFIED_PREFIX + (state.get("draft") or "").strip()
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
