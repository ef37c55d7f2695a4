"""``gate``: the join of retrieve and draft; records the route and the reason for it."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from specrag.graph.context import SpecRagContext
from specrag.graph.routing import decide
from specrag.graph.signals import discard_signal
from specrag.graph.state import State
from specrag.nodes.streaming import emit


async def gate(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
    """Decide between refine, generate, rapid_generate and fallback."""
    discard_signal(dict(state))  # draft and retrieve are done with it
    route, reason = decide(dict(state), runtime.context or SpecRagContext())
    emit({"event": "route", "route": route, "reason": reason})
    return {"route": route, "reason": reason}
