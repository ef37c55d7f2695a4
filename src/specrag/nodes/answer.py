"""What the answer nodes share: one budget, one node shape, timings and citations.

``refine``, ``generate`` and ``rapid_generate`` are all built by :func:`make_answer_node`: each
supplies its model and prompt; the budget, the stream, the timings and the error route are the
same. The answer budget (``answer_timeout_s``) starts when the FIRST answer node starts; a
``generate`` that runs after a failed ``refine``/``rapid_generate`` gets what is left of it, so
a run never spends more than one answer budget.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langgraph.runtime import Runtime

from specrag.decoding.incremental import PromptFeed
from specrag.errors import short_error, short_number
from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services, is_local
from specrag.graph.signals import EvidenceStream, evidence_stream, hand_back_evidence_stream
from specrag.graph.state import State
from specrag.indexing.documents import PAGE_MARK
from specrag.models.options import DecodeOptions
from specrag.nodes.streaming import clock, emit, live_marks, now, stream_model, trace

log = logging.getLogger(__name__)


@dataclass
class AnswerCall:
    """One answer node's model, prompt and decode options."""

    model: BaseChatModel
    messages: list[BaseMessage]
    options: DecodeOptions


AnswerBuilder = Callable[[State, SpecRagContext], AnswerCall]


def drafter_messages(
    ctx: SpecRagContext,
    chunks: list[dict[str, Any]],
    make: Callable[[list[dict[str, Any]]], list[BaseMessage]],
) -> tuple[BaseMessage, ...] | None:
    """The prompt a separate drafter reads: ``make`` over the top ``ctx.drafter_evidence`` chunks.

    None (the answer model's own prompt) where that would be every chunk (the default). On
    the pair's long set the top-ranked block alone kept 78-84% of the drafter's accepted
    tokens for 42-47% of its prefill - level end to end with the whole prompt
    (docs/bench/2026-12-05-drafter-top-chunk/).
    """
    n = ctx.drafter_evidence
    return tuple(make(chunks[:n])) if 0 < n < len(chunks) else None


def run_timings(
    state: dict[str, Any], answer_ttft_abs: float | None, fallback_origin: float | None = None
) -> dict[str, float]:
    """total_s and ttft_s of the run, measured from the run's origin (after model loading).

    A run resumed in another process has no origin of this process's clock: it is measured
    from ``fallback_origin`` (the resuming node's start).
    """
    origin = live_marks(state).get("origin", fallback_origin if fallback_origin else now())
    out = {"total_s": round(now() - origin, 4)}
    if answer_ttft_abs is not None:
        out["ttft_s"] = round(answer_ttft_abs - origin, 4)
    return out


def final_reason(state: dict[str, Any], node: str) -> str:
    """The run's reason once ``node`` answers: the gate's, and the failure that led here.

    ``gate's reason; refine: RuntimeError: ... -> generate`` after a failed answer node.
    """
    reason = state.get("reason", "")
    if state.get("answer_error"):
        reason = f"{reason}; {state['answer_error']} -> {node}"
    return str(reason)


def citations(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Numbered citations matching the evidence blocks (``page`` for a PDF page's chunk)."""
    out = []
    for n, c in enumerate(chunks, start=1):
        cite = {"n": n, "id": c.get("id"), "source": c.get("source"), "score": c.get("score")}
        _, mark, page = str(c.get("source") or "").rpartition(PAGE_MARK)
        if mark and page.isdigit():
            cite["page"] = int(page)
        out.append(cite)
    return out


def answer_message(state: State, update: dict[str, Any]) -> dict[str, Any]:
    """``{"messages": [AIMessage]}`` for a run asked through ``messages`` (else ``{}``).

    Citations go to ``additional_kwargs``; route, reason, verified and timings to
    ``response_metadata``, so a chat graph can show them without reading specrag's keys.
    """
    if not state.get("from_messages"):
        return {}
    citations_ = update.get("citations") or []
    meta = {
        "route": update.get("route"),
        "reason": update.get("reason", state.get("reason", "")),
        "verified": update.get("verified"),
        # the whole run's timings (retrieve_s, draft_s, ...), not only this node's: a parent
        # graph sees the message alone
        "timings": {**(state.get("timings") or {}), **(update.get("timings") or {})},
        "citations": citations_,
        "model_name": "specrag",
    }
    message = AIMessage(
        content=update.get("answer", ""),
        additional_kwargs={"citations": citations_},
        response_metadata=meta,
        name="specrag",
    )
    return {"messages": [message]}


# the share of its answer budget a remote answer model (it cannot re-verify) waits for the
# search's later batches; then it answers from the batches so far
REMOTE_WAIT_SHARE = 0.5

# how an error about the search's batches after the first starts (retrieve's and the
# answer node's): the answer node reads it to tell whether the run already says why
LATER_BATCHES = "retrieve: later batches"


def answer_budget(state: State, ctx: SpecRagContext, started: float) -> float:
    """Seconds left of the run's one answer budget (it starts with the first answer node)."""
    first = live_marks(dict(state)).get("answer", started)
    return ctx.answer_timeout_s - (started - first)


async def weave(
    stream: EvidenceStream,
    chunks: list[dict[str, Any]],
    state: State,
    ctx: SpecRagContext,
    build: AnswerBuilder,
    feed: PromptFeed[list[BaseMessage]] | None,
    offered: list[list[dict[str, Any]]] | None = None,
) -> None:
    """Update ``chunks`` to each later batch's evidence; with a feed, offer the new prompt.

    Each offered prompt is fitted to the model's context as a whole-evidence prompt is
    (:func:`fit_evidence`); ``offered`` gets the evidence of each prompt put in the feed, in
    order (``feed.puts``). The feed is closed at the end, whatever ends the weave.
    """
    try:
        while (more := await stream.next()) is not None:
            chunks[:] = more
            if feed is not None:
                whole = build({**state, "chunks": list(chunks)}, ctx)
                call, read = await asyncio.to_thread(
                    fit_evidence, whole, build, state, ctx, list(chunks)
                )
                if offered is not None:
                    offered.append(read)
                feed.put(call.messages)
    finally:
        if feed is not None:
            feed.close()


async def catch_up(stream: EvidenceStream, chunks: list[dict[str, Any]], grace_s: float) -> bool:
    """Take the batches already queued or arriving within ``grace_s`` into ``chunks``.

    True when the stream ended (no batch is left). Run before the first prefill: a batch
    that comes this soon joins the first prompt instead of costing a rebuild (with a local
    store the rest of the search takes milliseconds).
    """
    try:  # batches already queued are taken without waiting, even with no grace at all
        async with asyncio.timeout(grace_s):  # unlike wait_for, never swallows a cancel
            while (more := await stream.next()) is not None:
                chunks[:] = more
            return True
    except TimeoutError:
        return False


def evidence(
    stream: EvidenceStream,
    chunks: list[dict[str, Any]],
    unread: bool = False,
    why: str = "the answer budget ended the answer first",
) -> dict[str, Any]:
    """State keys for the final evidence of an incremental run.

    ``chunks``: the evidence of the last prompt the answer read. A stream that has not ended
    (the answer budget ended the answer while the search went on) is stopped here: the answer
    is final, the batches still to come would change nothing. ``unread``: batches came that
    the answer ended before reading (their prompt was offered, never taken).
    """
    if not stream.ended:
        if stream.task is not None:
            stream.task.cancel()
    if not stream.ended or unread:
        stream.errors.append(f"{LATER_BATCHES} were not woven in: {why}")
    # the later batches' trace: this node's run (retrieve's was posted before they came)
    trace({"batch_events": [dict(r) for r in stream.records[stream.delivered :]]}, extend=True)
    return {
        "chunks": list(chunks),
        "batches": [dict(r) for r in stream.records],
        "evidence_complete": stream.ended and not unread and not stream.partial,
    }


def fit_evidence(
    call: AnswerCall,
    build: AnswerBuilder,
    state: State,
    ctx: SpecRagContext,
    chunks: list[dict[str, Any]],
) -> tuple[AnswerCall, list[dict[str, Any]]]:
    """``call`` with the first chunks of its evidence whose prompt a local model reads whole.

    A prompt past the context (a large ``top_k``) was cut in the middle, so the answer cited
    chunks it never read: the last chunks - the lowest-ranked of a search; a short
    ``--document``'s end - are left out instead (at least one stays; a prompt still too long
    is cut as before). A remote model's prompt is sent as it is.
    """
    fits = getattr(call.model, "prompt_fits", None)
    room = ctx.answer_max_tokens
    if fits is None or len(chunks) <= 1 or fits(call.messages, room):
        return call, chunks
    lo, hi = 1, len(chunks) - 1  # the most chunks that fit: lo fits or is the floor
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(build({**state, "chunks": chunks[:mid]}, ctx).messages, room):
            lo = mid
        else:
            hi = mid - 1
    log.warning(
        "%d of %d evidence chunks left out: with them the answer model (answer limit %d "
        "tokens) would read only part of its prompt",
        len(chunks) - lo,
        len(chunks),
        room,
    )
    return build({**state, "chunks": chunks[:lo]}, ctx), chunks[:lo]


def make_answer_node(node: str, services: Services, build: AnswerBuilder):  # noqa: ANN201
    """An answer node: stream ``build(state, ctx)`` under the shared answer budget.

    On failure it records ``answer_error``; the node's conditional edge routes on it
    (refine / rapid_generate -> generate, generate -> fallback).
    """

    async def answer(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        started = now()
        live = live_marks(dict(state))
        marks = {"answer": live.get("answer", started), "clock": clock()}
        if "origin" not in live:  # resumed elsewhere, or a replay: the marks' origin is void,
            marks["origin"] = started  # and the marks merge: this node's start replaces it
        chunks = list(state.get("chunks") or [])
        stream = None if state.get("evidence_complete", True) else evidence_stream(dict(state))
        lost: list[str] = []
        if stream is None and not state.get("evidence_complete", True):
            said = any(e.startswith(LATER_BATCHES) for e in state.get("errors") or [])
            if not said:  # the search's stream lived in a process that is gone (a resume)
                lost = [
                    f"{LATER_BATCHES} were lost (the run was resumed after the search "
                    "had returned its first batch); answering from the evidence found before"
                ]
        weaving: asyncio.Task[None] | None = None
        waited_out = False  # a remote model's wait for the later batches ended by its share
        feed: PromptFeed[list[BaseMessage]] | None = None
        offered: list[list[dict[str, Any]]] = []  # the evidence of each prompt put in the feed
        read: list[dict[str, Any]] | None = None  # the evidence of a prompt fitted to the model
        try:
            budget = answer_budget(state, ctx, started)
            if budget <= 0:
                raise TimeoutError(f"the answer budget of {ctx.answer_timeout_s}s is spent")
            call = build(state, ctx)
            await asyncio.to_thread(services.warm, call.model)  # loaded in prepare: a no-op
            incremental = False  # later batches are woven in while the answer is decoded
            if stream is not None and is_local(call.model):  # incremental: answer now
                before, waited = list(chunks), now()  # the first batch
                ended = await catch_up(stream, chunks, min(ctx.incremental_grace_s, budget))
                budget -= now() - waited  # the grace is part of the answer budget
                if chunks != before:
                    call = build({**state, "chunks": list(chunks)}, ctx)
                incremental = not ended  # ended: the whole evidence in one prompt
            elif stream is not None:  # a remote model cannot re-verify: wait for the rest,
                waited = now()  # half the answer budget at most (the wait is part of it)
                try:
                    async with asyncio.timeout(budget * REMOTE_WAIT_SHARE):
                        await weave(stream, chunks, state, ctx, build, None)
                except TimeoutError:  # answer from the batches so far; evidence() says so
                    waited_out = True
                budget -= now() - waited
                call = build({**state, "chunks": chunks}, ctx)
            # the (first) prompt fitted to a local model (a failure passes all the evidence
            # on; tokenising the prompt is the budget's time too)
            fitting = now()
            call, fitted = await asyncio.to_thread(
                fit_evidence, call, build, state, ctx, list(chunks)
            )
            budget -= now() - fitting
            read = fitted
            if incremental:
                assert stream is not None
                feed = PromptFeed()
                offered.append(fitted)  # the first prompt's (taken at the start)
                options = dataclasses.replace(call.options, prompt_feed=feed)
                call = dataclasses.replace(call, options=options)
                weaving = asyncio.create_task(
                    weave(stream, chunks, state, ctx, build, feed, offered)
                )
            if budget <= 0:  # the grace, a remote model's wait or the fitting spent it
                raise TimeoutError(f"the answer budget of {ctx.answer_timeout_s}s is spent")
            result = await stream_model(
                call.model,
                call.messages,
                budget_s=budget,
                tags=["answer", node],
                options=call.options,
            )
            if not result.text:
                why = (
                    f"no answer within {short_number(budget)}s"
                    if result.timed_out
                    else "empty answer"
                )
                raise RuntimeError(why)
        except Exception as exc:  # noqa: BLE001 - becomes the error route
            message = f"{node}: {short_error(exc)}"
            # a stream's reader showed this node's text so far: it is told the node failed
            emit({"event": "answer_failed", "node": node, "error": short_error(exc)})
            earlier = state.get("answer_error")  # refine/rapid_generate failed first
            chain = f"{earlier} -> {node}; {message}" if earlier else message
            failed = {
                "answer_error": chain,
                "errors": [message],
                "marks": marks,
                "timings": {"answer_s": round(now() - started, 4)},  # what the attempt took
            }
            if stream is not None:
                if weaving is not None:  # ended before this weave reads the stream
                    weaving.cancel()
                    await asyncio.gather(weaving, return_exceptions=True)
                if node != "generate" and not stream.ended:
                    # generate reads the later batches itself, as they come, within what is
                    # left of the one answer budget (no wait here for the rest of the search)
                    hand_back_evidence_stream(dict(state), stream)
                    return {**failed, "chunks": list(chunks), "evidence_complete": False}
                # an ended search, or after generate: only the fallback's message is left
                failed.update(evidence(stream, chunks, why=f"{node} failed first"))
                failed["errors"] = [*stream.errors, message]
            return failed
        except asyncio.CancelledError:  # the run is cancelled: so is the search behind it
            if stream is not None and not stream.ended and stream.task is not None:
                stream.task.cancel()
            raise
        finally:
            if weaving is not None and not weaving.done():  # the decode ended by its budget
                weaving.cancel()
        unread = False
        if read is not None:  # the evidence that fitted the answer model's context
            chunks = read
        if feed is not None:  # cite what the answer read, not a batch that came after it
            chunks = offered[feed.read_puts]
            unread = feed.puts > feed.read_puts
        decoding = dict(result.metadata.get("decoding") or {})
        if result.timed_out:
            decoding["truncated"] = True
        ttft_abs = result.started + result.ttft_s if result.ttft_s is not None else None
        timings = {
            "answer_s": round(now() - started, 4),
            **run_timings(dict(state), ttft_abs, started),
        }
        if result.ttft_s is not None:  # from the answer call's start (ttft_s: the run's)
            timings["answer_ttft_s"] = round(result.ttft_s, 4)
        reason = final_reason(dict(state), node)
        if result.timed_out:  # said where a reader looks, not only in errors
            reason = f"{reason}; the answer budget cut the answer"
        # the final route and why on this node's trace run too (the gate's says what it chose)
        emit(
            {
                "event": "answered",
                "node": node,
                "route": node,
                "reason": reason,
                **timings,
                "decoding": decoding,
            }
        )
        update: dict[str, Any] = {
            "answer": result.text,
            "answer_error": "",
            "route": node,
            "verified": True,
            "citations": citations(chunks),
            "timings": timings,
            "stats": {node: decoding} if decoding else {},
            "marks": marks,
            "revisions": result.revisions,
        }
        errors: list[str] = []
        if stream is not None:
            why = (
                f"the answer model cannot re-verify, and waited for them {REMOTE_WAIT_SHARE:.0%} "
                f"of what was left of answer_timeout_s={ctx.answer_timeout_s}"
                if waited_out
                else "the answer budget ended the answer first"
                if result.timed_out
                else "the answer ended before them"
            )
            if weaving is not None and weaving.done() and not weaving.cancelled():
                if (failure := weaving.exception()) is not None:  # a later prompt's build
                    why = f"their prompt could not be built: {short_error(failure)}"
            update.update(evidence(stream, chunks, unread, why))
            errors += stream.errors
        elif lost:
            errors += lost
        if result.timed_out:  # the answer is what came in time: say it is cut
            errors.append(
                f"{node}: the answer was cut after {result.tokens} tokens by the answer budget "
                f"(answer_timeout_s={ctx.answer_timeout_s})"
            )
        if errors:
            update["errors"] = errors
        if state.get("answer_error") or result.timed_out:
            update["reason"] = reason
        return {**update, **answer_message(state, update)}

    answer.__name__ = node
    return answer
