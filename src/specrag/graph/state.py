"""Graph state: one TypedDict, with narrow input and output schemas.

Keys written by the two parallel branches (``retrieve`` and ``draft``) are disjoint, except
``timings``, ``stats``, ``errors`` and ``marks``, which have merging reducers.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict  # pydantic reads it on 3.11 (Studio's schemas)

DraftStatus = Literal["ok", "truncated", "timeout", "failed", "off", "empty"]
"""ok: finished; truncated: cut by its budget, by retrieval or by ``draft_max_tokens``; the rest:
no usable text."""
RetrievalStatus = Literal["ok", "timeout", "failed", "empty", "irrelevant"]
"""ok: evidence found; otherwise why not (the run then takes the fallback route)."""


def merge_dicts(left: dict[str, Any] | None, right: dict[str, Any] | None) -> dict[str, Any]:
    """Reducer: shallow merge, right wins."""
    return {**(left or {}), **(right or {})}


class InputState(TypedDict, total=False):
    """What a caller provides."""

    question: str
    """The user's question (this or ``messages``)."""
    messages: Annotated[list[AnyMessage], add_messages]
    """Chat interface (``MessagesState``): the question is the last human message, earlier
    turns are history; the answer is appended as an ``AIMessage``."""
    document: str
    """Optional long document to answer from (RAPID path when over the token threshold)."""


class OutputState(TypedDict, total=False):
    """What a caller gets back."""

    answer: str
    """The final answer shown to the user."""
    messages: Annotated[list[AnyMessage], add_messages]
    """With the chat interface: the conversation, the answer appended as an ``AIMessage``
    (citations in ``additional_kwargs``, route/reason/timings in ``response_metadata``)."""
    query: str
    """What was searched: the question, or a follow-up rewritten from the history."""
    route: str
    """Node that produced the answer: refine | generate | rapid_generate | fallback."""
    reason: str
    """Why the gate (or an error handler) chose that route, in words."""
    verified: bool
    """True when the answer was produced from retrieved evidence."""
    draft: str
    """The evidence-free draft (empty when drafting was off or failed)."""
    draft_confidence: float | None
    """exp(mean token log-prob) of the draft, in (0, 1]; None when the model gives none."""
    draft_status: DraftStatus
    """How the draft ended (a route's reason such as "draft too short" can be checked here)."""
    draft_tokens: int
    """Number of draft tokens produced."""
    chunks: list[dict[str, Any]]
    """Retrieved chunks: id, source, score, position, text (best first)."""
    citations: list[dict[str, Any]]
    """Sources the answer was given, numbered as in the evidence blocks."""
    batches: list[dict[str, Any]]
    """The search's batches as they arrived, most relevant first: ``source`` (the ranking),
    ``chunks`` (new chunk ids), ``arrival_s`` (seconds after retrieval started), ``dropped``
    (chunk ids it re-ranked out of the top k)."""
    revisions: list[dict[str, Any]]
    """Retractions of an incremental answer: ``keep`` (characters of the streamed answer that
    stayed), ``kept_tokens``, ``dropped_tokens``, ``dropped_text``, ``at_s``. New evidence's
    only: a remote model's stop-sequence cut is a ``revise`` event of the stream alone."""
    timings: Annotated[dict[str, float], merge_dicts]
    """Seconds: load_s (model loading, before the run's origin), document_index_s, retrieve_s
    and answer_s (the search's and the last answering node's own time, each from its node's
    start; a failed answer's where no later answer node ran: refine's time is replaced by
    generate's when generate takes over),
    and from the origin: draft_s, draft_ttft_s, ttft_s, total_s."""
    seed: int
    """Sampling seed of this run (the ``seed`` setting reproduces a sampled answer given the same
    route and draft)."""
    stats: Annotated[dict[str, Any], merge_dicts]
    """Decoding statistics (candidates proposed/accepted, forward passes, RAPID counters)."""
    errors: Annotated[list[str], operator.add]
    """Errors met on the way (the run still answered)."""
    evidence_complete: bool
    """False while an incremental run's later batches are still coming (``answer_policy``),
    or when later batches missed the retrieval budget or failed and the run answers from the
    evidence that arrived before (``errors`` says which)."""


class State(InputState, OutputState, total=False):
    """Full working state."""

    marks: Annotated[dict[str, Any], merge_dicts]
    """Clock readings (time.perf_counter): ``origin`` (the run's start, after model loading)
    and ``answer`` (start of the first answer node: the one answer budget), and ``clock``:
    whose readings they are (a process, and the checkpoint a replay started from)."""
    run_id: str
    """A fresh id per run (``prepare``): keys the signal between the parallel branches."""
    from_messages: bool
    """True when this run's question came from ``messages`` (the answer is appended there)."""
    question_taken: str
    """The question ``prepare`` took (from either input). A later run's ``question`` that
    differs from it is that run's input: it wins over a human message an earlier run that
    failed left unanswered at the end of ``messages``."""
    history: list[dict[str, str]]
    """Earlier turns given to the prompts (``role``/``content``), newest last, bounded by
    ``history_tokens``."""
    run_document: str
    """This run's document: ``prepare`` moves the input ``document`` here and clears the
    input key, so the next question on the same thread does not inherit it."""
    draft_truncated: bool
    """True when the draft was cut short (by its time budget, by retrieval finishing or by
    ``draft_max_tokens``)."""
    retrieval_status: RetrievalStatus
    document_tokens: int
    """Length of the input document in answer-model tokens (0 without a document)."""
    rapid_unavailable: str
    """Why a long document cannot take RAPID's route ("" where it can): its answer model is
    remote, say. The gate takes serial RAG's routes over the retrieved chunks then."""
    answer_error: str
    """Set when refine/rapid_generate/generate raised; drives the error routes."""
