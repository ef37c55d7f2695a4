"""Route decisions. Each returns a node name from a fixed set, with a reason in words.

The gate writes ``route`` and ``reason`` into the state, so a trace, a test and a user all
see the same explanation; the conditional edges only read them back.
"""

from __future__ import annotations

from typing import Any, Literal

from specrag.graph.context import SpecRagContext

GateRoute = Literal["refine", "generate", "rapid_generate", "fallback"]


def against(value: float, threshold: float) -> str:
    """``value`` with 2 decimals, or as many more as keep it on its side of ``threshold``.

    A reason says "confidence 0.35 < 0.35" otherwise (0.3496 against 0.35): right branch,
    an explanation wrong on its face.
    """
    below = value < threshold
    for digits in range(2, 9):
        shown = f"{value:.{digits}f}"
        if (float(shown) < threshold) == below:
            return shown
    return repr(value)


def draft_usable(state: dict[str, Any], ctx: SpecRagContext) -> tuple[bool, str]:
    """Whether the draft can be used (refined, or shown as unverified), and why not.

    The one place the draft policy is decided: the gate and ``fallback`` both ask it.
    """
    status = state.get("draft_status", "failed")
    tokens = int(state.get("draft_tokens") or 0)
    if status not in ("ok", "truncated") or not (state.get("draft") or "").strip():
        if status == "empty" and state.get("draft_truncated"):  # stopped, not timed out
            if tokens:  # a token whose text is not out yet (a space, part of a character)
                return False, (
                    f"draft stopped after {tokens} token{'s' if tokens > 1 else ''}, before its "
                    "first text (retrieval finished first)"
                )
            return False, "draft stopped before its first token (retrieval finished first)"
        return False, f"draft {status}"
    if tokens < ctx.min_draft_tokens:
        return False, f"draft too short ({tokens} < {ctx.min_draft_tokens} tokens)"
    return True, "draft usable"


def decide(state: dict[str, Any], ctx: SpecRagContext) -> tuple[GateRoute, str]:
    """Choose the answer route after retrieve and draft have both finished."""
    retrieval = state.get("retrieval_status", "failed")
    # the search's own error (an answer after a failed search points at this reason)
    cause = [
        e.removeprefix("retrieve: ")
        for e in state.get("errors") or []
        if e.startswith("retrieve: ")
    ]
    detail = {
        "timeout": f"retrieval timed out after {ctx.retrieval_timeout_s}s",
        "failed": f"retrieval failed ({cause[-1]})" if cause else "retrieval failed",
        "empty": "retrieval found nothing",
        "irrelevant": f"no chunk scored {ctx.relevance_threshold} or more",
    }.get(retrieval, f"retrieval status {retrieval}")
    doc_tokens = int(state.get("document_tokens") or 0)
    long = doc_tokens > ctx.long_document_tokens
    if long and not (cannot := state.get("rapid_unavailable")):  # the target reads it whole
        without = "" if retrieval == "ok" else f" ({detail}: the drafter picks its own chunks)"
        return "rapid_generate", (
            f"long document ({doc_tokens} tokens > {ctx.long_document_tokens}): RAPID decoding"
            + without
        )
    if long:  # said first: the routes below read the retrieved chunks instead
        route, why = decide({**state, "document_tokens": 0}, ctx)
        return route, f"long document, but no RAPID ({cannot}); {why}"
    if retrieval != "ok":
        return "fallback", detail
    usable, why = draft_usable(state, ctx)
    if not usable:
        return "generate", f"{why}: serial RAG without a draft"
    confidence = state.get("draft_confidence")
    cut = " (truncated)" if state.get("draft_truncated") else ""
    if confidence is None:
        return "refine", f"draft{cut} has no log-probabilities (confidence unknown): refine"
    if confidence < ctx.confidence_threshold:
        return "generate", (
            f"draft confidence {against(confidence, ctx.confidence_threshold)} < "
            f"{ctx.confidence_threshold}: serial RAG"
        )
    shown = against(confidence, ctx.confidence_threshold)
    return "refine", f"draft{cut} confidence {shown} >= {ctx.confidence_threshold}: refine"


def route_after_gate(state: dict[str, Any]) -> GateRoute:
    """Conditional edge out of ``gate``: the route it recorded."""
    route = state.get("route")
    if route not in ("refine", "generate", "rapid_generate", "fallback"):
        raise ValueError(f"gate left an unexpected route: {route!r}")
    return route  # type: ignore[return-value]


def route_after_refine(state: dict[str, Any]) -> Literal["generate", "fallback", "__end__"]:
    """An error in refine or rapid_generate falls back to serial RAG, which needs evidence.

    A RAPID run on a document whose search found no relevant chunk has none: ``fallback``.
    """
    if not state.get("answer_error"):
        return "__end__"
    return "generate" if state.get("retrieval_status") == "ok" else "fallback"


def route_after_generate(state: dict[str, Any]) -> Literal["fallback", "__end__"]:
    """An error in generate ends in the graceful fallback answer."""
    return "fallback" if state.get("answer_error") else "__end__"
