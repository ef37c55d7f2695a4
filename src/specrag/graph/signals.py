"""Run-keyed hand-overs between nodes: the evidence signal and the evidence stream.

The "retrieval delivered evidence" signal runs between the two parallel start nodes; the
stream carries the later evidence batches to an incremental answer.

``draft`` (policy ``until_retrieval``) stops within one token of it; ``retrieve`` sets it ONLY
when it found usable evidence, so a failed, slow or empty retrieval lets the draft finish
within its own budget (it may become the unverified fallback answer).

The signal is keyed by the run id ``prepare`` draws for every run (a checkpoint id would be
reused by a replay or a retry, finding an old signal already set). The table is bounded, so
nothing leaks.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

_SIGNALS: OrderedDict[str, threading.Event] = OrderedDict()
_LOCK = threading.Lock()
_MAX = 4096


def retrieval_signal(state: dict[str, Any]) -> threading.Event:
    """The event set when this run's retrieval has delivered evidence."""
    key = str(state.get("run_id") or "")
    with _LOCK:
        event = _SIGNALS.get(key)
        if event is None:
            event = _SIGNALS[key] = threading.Event()
            while len(_SIGNALS) > _MAX:
                _SIGNALS.popitem(last=False)
        return event


def discard_signal(state: dict[str, Any]) -> None:
    """Forget this run's retrieval signal (the gate, once draft and retrieve have joined).

    A run replayed from a checkpoint before the join (Studio's time travel, a fork) keeps its
    ``run_id``: without this its draft found the earlier execution's signal already set and
    stopped before its first token.
    """
    with _LOCK:
        _SIGNALS.pop(str(state.get("run_id") or ""), None)


def restore_signal(snapshot: Any) -> bool:
    """Set the signal of an interrupted run whose retrieve delivered evidence before the stop.

    ``snapshot``: the thread's state (``aget_state``) before it resumes. The signal lives in
    the process that ran ``retrieve``; a run resumed in a new process with its retrieve done
    (its writes kept in the checkpoint) and its draft not would re-run the draft against a
    fresh signal, drafting its whole budget with the evidence already there. Returns whether
    it was set.
    """
    for task in getattr(snapshot, "tasks", ()):
        found = task.result
        if task.name == "retrieve" and isinstance(found, dict):
            if found.get("retrieval_status") == "ok":  # as retrieve itself sets it
                retrieval_signal(dict(snapshot.values or {})).set()
                return True
    return False


@dataclass
class EvidenceStream:
    """The batches a run's retrieval delivers after its first (``answer_policy="incremental"``).

    ``retrieve`` returns with the first batch and keeps searching in a task that puts each
    later batch's evidence (all relevant chunks so far, in canonical order) on ``queue`` and
    ``None`` when it is done; the answer node takes them from there. ``records`` describes
    every batch as it arrived.
    """

    queue: asyncio.Queue[list[dict[str, Any]] | None] = field(default_factory=asyncio.Queue)
    records: list[dict[str, Any]] = field(default_factory=list)
    delivered: int = 0  # how many of ``records`` retrieve returned with (the rest came later)
    errors: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    ended: bool = False
    partial: bool = False  # later batches failed, missed the budget or ranked nothing relevant

    async def next(self) -> list[dict[str, Any]] | None:
        """The next batch's evidence; None once the stream ended (then at every call)."""
        if self.ended:
            return None
        more = await self.queue.get()
        self.ended = more is None
        return more


_STREAMS: OrderedDict[str, EvidenceStream] = OrderedDict()


def open_evidence_stream(state: dict[str, Any]) -> EvidenceStream:
    """A new evidence stream for this run."""
    key = str(state.get("run_id") or "")
    with _LOCK:
        stream = _STREAMS[key] = EvidenceStream()
        while len(_STREAMS) > _MAX:
            _STREAMS.popitem(last=False)
        return stream


def hand_back_evidence_stream(state: dict[str, Any], stream: EvidenceStream) -> None:
    """Put a stream an answer node took back, for the next one (a refine that failed)."""
    with _LOCK:
        _STREAMS[str(state.get("run_id") or "")] = stream


def evidence_stream(state: dict[str, Any]) -> EvidenceStream | None:
    """This run's evidence stream, taken (an answer node consumes it once); None if absent."""
    with _LOCK:
        return _STREAMS.pop(str(state.get("run_id") or ""), None)


def cancel_search_behind(state: dict[str, Any]) -> None:
    """Stop the search behind a run cancelled before an answer node took its stream.

    (Its draft was still running.) The search for the later batches stops, and the run's
    stream and signal leave the process's tables.
    """
    stream = evidence_stream(state)
    if stream is not None and not stream.ended and stream.task is not None:
        stream.task.cancel()
    discard_signal(state)
