"""``prepare``: start a clean run - load models, reset the run state, index a document.

* **Loading** (first run in a process only) happens here, before the run's origin, and is
  reported as ``load_s``: no stage timing or budget includes it.
* **A clean run state**: on a thread (a checkpointer), state persists between runs. Each new
  question starts from fresh run keys (errors, timings, stats, route, draft, ...); the input
  ``document`` is moved to ``run_document`` and cleared, so the next question on the thread
  does not inherit it. The checkpoints keep the thread's history for ``--resume``.
* **The question**: the ``question`` key, or with the chat interface the last human message of
  ``messages`` (earlier turns become ``history`` for the prompts, bounded by tokens). An empty
  or over-long one raises a one-line :class:`~specrag.errors.InputError` before any model
  loads.
* **A long document** is chunked and embedded here (``document_index_s``), outside the
  retrieval budget, which then only covers the search.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from langgraph.runtime import Runtime
from langgraph.types import Overwrite

from specrag.errors import InputError, short_error, short_number
from specrag.graph.context import SpecRagContext, validate_question
from specrag.graph.services import RapidUnavailable, Services
from specrag.graph.state import State
from specrag.models.loading import WORK_STOP
from specrag.nodes.streaming import clock, emit, now

log = logging.getLogger(__name__)


T = TypeVar("T")


async def in_own_thread(fn: Callable[[], T], name: str = "specrag-search") -> T:
    """``fn()`` on a daemon thread of its own (the caller's context variables: tracing).

    For a search, which may never return (a store that accepts a connection and never
    answers): the run's budget ends the wait, not the thread. On the event loop's shared pool
    (cores + 4 threads) a few such runs would strand every thread, and each later run would
    wait forever in its first ``to_thread`` (model warm-ups), with no budget to end it; a
    daemon thread also never holds up the process's exit. A waiter that gives up (cancelled:
    Ctrl-C, a caller's timeout) sets :data:`~specrag.models.loading.WORK_STOP` in ``fn``'s
    context: long work (embedding a document) stops at its next step.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()
    stop = threading.Event()
    context.run(WORK_STOP.set, stop)

    def settle(ok: bool, value: Any) -> None:
        if not done.done():  # the waiter may have gone (its budget ended)
            done.set_result(value) if ok else done.set_exception(value)

    def work() -> None:
        try:
            result: Any = context.run(fn)
            ok = True
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            result, ok = exc, False
        try:
            loop.call_soon_threadsafe(settle, ok, result)
        except RuntimeError:  # the loop closed meanwhile: nobody waits
            pass

    threading.Thread(target=work, name=name, daemon=True).start()
    try:
        return await done
    finally:
        stop.set()  # done, or given up on: either way no step of it is wanted any more


async def quietly(
    work: Callable[[], Any], errors: list[str] | None = None, stoppable: bool = False
) -> Any:
    """Run blocking ``work`` in a thread; None if it raised.

    The node that needs the part reports its failure; where none would (``errors`` given),
    it is recorded there. Warming a part ahead of its node (prepare; retrieve indexing a
    resumed run's document) goes through here. ``stoppable`` (embedding a document): on a
    thread of its own that a cancelled run stops between two batches (Ctrl-C waited for the
    whole document, minutes for a large one, and ``asyncio.run`` for the pool's thread).
    """
    try:
        if stoppable:
            return await in_own_thread(work, "specrag-document")
        return await asyncio.to_thread(work)
    except Exception as exc:  # noqa: BLE001
        log.debug("%s (left to the node that needs it)", exc)
        if errors is not None:
            errors.append(f"prepare: {short_error(exc)}")
        return None


def _last_human(state: State) -> Any:
    """The chat interface's question: ``messages``' last message if a human's, else None.

    None too when this run's input is a new ``question`` (one other than the question the
    thread's previous run took, ``question_taken``): a human message a failed run left
    unanswered at the end of ``messages`` is not asked again in its place.
    """
    messages = state.get("messages") or []
    if not messages or messages[-1].type != "human":
        return None
    question = state.get("question") or ""
    taken = state.get("question_taken")
    if question and taken is None:  # no run of the thread got past prepare since the key came
        # in: a thread an older specrag answered has answers, and its question is not new
        new = not any(m.type == "ai" for m in messages)
    else:
        new = bool(question) and question != taken
    return None if new else messages[-1]


def asked(state: State) -> str:
    """The question as given: the last human message of ``messages``, else ``question``."""
    human = _last_human(state)
    return str(human.text).strip() if human is not None else state.get("question", "")


def history(state: State, ctx: SpecRagContext, count: Callable[[str], int]) -> list[dict[str, str]]:
    """The earlier turns the prompts get when the question came from ``messages``.

    The human/AI turns before the last human message (text only; tool traffic left out),
    newest kept first, up to ``history_tokens``; none for a ``question`` key.
    """
    if _last_human(state) is None:
        return []
    turns = [
        {"role": "user" if m.type == "human" else "assistant", "content": str(m.text).strip()}
        for m in (state.get("messages") or [])[:-1]
        if m.type in ("human", "ai") and str(m.text).strip()
    ]
    kept: list[dict[str, str]] = []
    used = 0
    for turn in reversed(turns):
        cost = count(turn["content"]) + 4  # + the turn's chat-template tags
        if used + cost > ctx.history_tokens:
            break
        kept.insert(0, turn)
        used += cost
    return kept


def check_document_size(document: str) -> None:
    """Refuse a ``document`` past ``SPECRAG_MAX_FILE_MIB`` (the limit on a ``--document`` file).

    A graph client (``langgraph dev``) posted any size: its tokenizing and embedding ran
    outside every budget, holding up the other runs' model thread (a review, 2026-12-07).
    """
    if not document:  # a question alone: a bad SPECRAG_MAX_FILE_MIB is no concern of it
        return
    from specrag.indexing.documents import MAX_FILE_MIB_ENV, max_file_bytes

    limit = max_file_bytes()
    if len(document) * 4 <= limit:  # UTF-8: at most 4 bytes a character
        return
    size = len(document.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise InputError(
            f"the document is too large: {short_number(size / 2**20)} MiB, past the "
            f"{short_number(limit / 2**20)} MiB limit (split it, or raise {MAX_FILE_MIB_ENV})"
        )


def make_prepare(services: Services):  # noqa: ANN201
    """Build the prepare node."""

    async def prepare(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        # an empty or over-long question is the caller's error, not a run: one clear line,
        # before any model loads (the graph raises it; the tool returns it to its agent)
        question = validate_question(asked(state), ctx.max_question_chars)
        document = state.get("document") or ""
        if not isinstance(document, str):  # a JSON client's bytes or number
            raise InputError(f"the document must be text, not {type(document).__name__}")
        if document and not document.strip():  # it would replace the index with nothing
            raise InputError("the document is empty (only white space)")
        check_document_size(document)
        t0 = now()
        # A part that cannot load (bad model path, missing index) is not an error HERE: the
        # node that needs it meets the same failure and takes its documented route.
        await quietly(lambda: services.warm(services.chat_model(ctx.answer_spec, ctx)))
        if ctx.drafter_runs and ctx.draft_spec != ctx.answer_spec:
            await quietly(lambda: services.warm(services.chat_model(ctx.draft_spec, ctx)))
        await quietly(lambda: services.warm_retriever(ctx, document or None))
        origin = now()
        timings = {"load_s": round(origin - t0, 4)}
        document_tokens = 0
        rapid_unavailable = ""
        errors: list[str] = []
        if document:
            n_tokens = await quietly(lambda: services.document_tokens(ctx, document), errors)
            if n_tokens is None and errors:  # say why the long-document route was not taken
                errors[-1] += " (the document's length is unknown: RAPID not considered)"
            document_tokens = int(n_tokens or 0)
            if document_tokens > ctx.long_document_tokens:
                try:  # a remote answer model cannot read the document token by token
                    rapid = await asyncio.to_thread(services.rapid_model, ctx)
                except RapidUnavailable as exc:  # the gate says why, takes serial RAG's routes
                    rapid_unavailable = short_error(exc)
                except Exception as exc:  # noqa: BLE001 - rapid_generate's error route says it
                    log.debug("%s (left to rapid_generate)", exc)
                else:
                    await quietly(lambda: services.warm(rapid))
                origin = now()
                timings["load_s"] = round(origin - t0, 4)
            start = now()
            await quietly(lambda: services.index_document(ctx, document), stoppable=True)
            timings["document_index_s"] = round(now() - start, 4)

        def count(text: str) -> int:  # history turns, in answer-model tokens
            try:
                return services.document_tokens(ctx, text)
            except Exception:  # noqa: BLE001 - a remote answer model: count words
                return len(text.split())

        seed = ctx.seed if ctx.seed >= 0 else random.SystemRandom().randrange(2**31)
        # counting loads the answer model's tokenizer the first time: off the event loop
        chat = _last_human(state) is not None
        turns = await asyncio.to_thread(history, state, ctx, count) if chat else []
        emit({"event": "prepared", "seed": seed, **timings})
        return {
            "question": question,
            "question_taken": question,
            "query": question,
            "history": turns,
            "from_messages": chat,
            "run_id": uuid.uuid4().hex,
            "document": "",
            "run_document": document,
            "document_tokens": document_tokens,
            "rapid_unavailable": rapid_unavailable,
            "seed": seed,
            "marks": Overwrite({"origin": origin, "clock": clock()}),
            "timings": Overwrite(timings),
            "stats": Overwrite({}),
            "errors": Overwrite(errors),
            "answer": "",
            "answer_error": "",
            "route": "",
            "reason": "",
            "verified": False,
            "draft": "",
            "draft_confidence": None,
            "draft_status": "off",
            "draft_tokens": 0,
            "draft_truncated": False,
            "chunks": [],
            "citations": [],
            "batches": [],
            "revisions": [],
            "evidence_complete": True,
        }

    return prepare
