"""Streaming a chat model under a budget, and custom stream events."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import logging
import math
import random
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langgraph.config import get_stream_writer

from specrag.graph.services import is_local
from specrag.models.options import DecodeOptions

log = logging.getLogger(__name__)

# Extra wall-clock allowed past a budget before an unresponsive local model call is abandoned
# (local models stop themselves at the budget; this only catches a hung decode thread). A
# remote call has no loop of its own that stops it: it is cut at its budget exactly.
GRACE_S = 0.5


def now() -> float:
    """Clock used for all timings."""
    return time.perf_counter()


# perf_counter readings mean nothing in another process: marks carry this process's clock id,
# so a run resumed elsewhere (``--resume``) measures and budgets from its own restart.
CLOCK_ID = random.random()


KEEP_INVOCATIONS = 16384  # invocations remembered (their run controls held, ids never reused)
_INVOCATIONS: collections.OrderedDict[int, tuple[Any, str]] = collections.OrderedDict()
_INVOCATIONS_LOCK = threading.Lock()


def invocation() -> str:
    """A name of the graph invocation (``ainvoke``/``astream`` call) this code runs in.

    LangGraph gives each invocation a run control of its own, shared by all its nodes (and
    the tasks and threads they start with their context); outside a graph run: "".
    """
    try:
        from langgraph.runtime import get_runtime

        control = get_runtime().control
    except Exception:  # noqa: BLE001 - outside a graph run
        return ""
    if control is None:
        return ""
    with _INVOCATIONS_LOCK:
        entry = _INVOCATIONS.get(id(control))
        if entry is None or entry[0] is not control:  # an id of a control freed since
            entry = _INVOCATIONS[id(control)] = (control, uuid.uuid4().hex[:12])
            while len(_INVOCATIONS) > KEEP_INVOCATIONS:
                _INVOCATIONS.popitem(last=False)
        _INVOCATIONS.move_to_end(id(control))  # a long run outlives the newer ones it sees
        return entry[1]


def clock() -> str:
    """Whose clock marks are live: this process's, in this invocation of the graph.

    A run resumed in the process that ran it (a server, Studio), perhaps minutes later, finds
    the marks of the invocation that stopped, and a replay or fork of a checkpoint (Studio's
    time travel; ``ainvoke(None, config)`` with a ``checkpoint_id``) those of the run it
    replays: neither are live, so its nodes time and budget from their own start.
    """
    try:
        from langgraph.config import get_config

        replayed = (get_config().get("metadata") or {}).get("checkpoint_id") or ""
    except Exception:  # noqa: BLE001 - outside a graph run
        replayed = ""
    return f"{CLOCK_ID}|{replayed}|{invocation()}"


def live_marks(state: dict[str, Any]) -> dict[str, Any]:
    """The run's clock marks if this process wrote them in this invocation, else none."""
    marks = state.get("marks") or {}
    return marks if marks.get("clock") == clock() else {}


def resumed_origin(state: dict[str, Any], start: float) -> dict[str, Any]:
    """``{"marks": ...}`` making ``start`` the run's origin where this process has none.

    A run resumed in a new process: the first nodes it runs (draft, retrieve, fallback)
    time it from their start, so total_s covers what the resumed run did.
    """
    if "origin" in live_marks(state):
        return {}
    return {"marks": {"origin": start, "clock": clock()}}


REPEATED = ("batch", "revise")  # events a node sends many times: listed, not merged


def emit(event: dict[str, Any], traced: bool = True) -> None:
    """Send a ``stream_mode="custom"`` event and record it as the node run's trace metadata.

    A repeated event (a later batch, a retraction) is appended to the run's
    ``<event>_events`` list, so one does not overwrite the last; ``traced=False`` sends the
    stream event only (from a task that outlives its node, whose run is already posted).
    Both are no-ops outside a graph run / without tracing, and never raise.
    """
    try:
        get_stream_writer()(event)
    except Exception:  # noqa: BLE001 - no writer outside a graph run
        pass
    if not traced:
        return
    fields = {k: v for k, v in event.items() if k != "event"}
    if (name := event.get("event")) in REPEATED:
        trace({f"{name}_events": [fields]}, extend=True)
    else:
        trace(fields)


def trace(metadata: dict[str, Any], extend: bool = False) -> None:
    """Add ``metadata`` to the current node run's trace (``extend``: lists are appended to).

    A no-op without tracing; never raises.
    """
    try:
        from langsmith.run_helpers import get_current_run_tree

        run = get_current_run_tree()
        if run is None:
            return
        for key, value in metadata.items():
            if extend and isinstance(value, list):
                run.metadata[key] = [*(run.metadata.get(key) or []), *value]
            else:
                run.metadata[key] = value
    except Exception:  # noqa: BLE001 - tracing must never fail a run
        pass


@dataclass
class Streamed:
    """Result of one budgeted model call."""

    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0  # clock reading when the call started
    ttft_s: float | None = None  # seconds from the call to its first non-empty token
    elapsed_s: float = 0.0
    timed_out: bool = False  # the budget ended the call (text may be partial)
    stopped: bool = False  # ended early by the stop event
    tokens: int = 0
    revisions: list[dict[str, Any]] = field(default_factory=list)  # retractions (incremental)

    @property
    def confidence(self) -> float | None:
        """exp(mean token log-prob): the geometric mean of the token probabilities."""
        if not self.logprobs:
            return None
        return math.exp(sum(self.logprobs) / len(self.logprobs))


# A remote chat model's own fields for the context's settings, by the names integrations use
REMOTE_FIELDS = {
    "temperature": ("temperature",),
    "max_new_tokens": ("max_tokens", "max_output_tokens", "max_completion_tokens"),
    "seed": ("seed",),
}


def remote_seed(seed: int) -> int:
    """``seed`` as a remote API takes it: below 2**31; a smaller one is sent as it is.

    A provider's seed field may be a signed 32- or 64-bit integer; ``seed`` goes up to
    2**64-1, and one past the field failed every answer call on the same bad request.
    """
    return seed if 0 <= seed < 2**31 else seed % 2**31


def with_remote_settings(
    model: BaseChatModel, options: DecodeOptions, logprobs: bool = False
) -> BaseChatModel:
    """A copy of a remote (``provider:model``) chat model with the stage's settings.

    Temperature, token limit and seed, set on the fields its class declares; others are left
    to the provider's defaults (a field it does not have would be refused by its API).
    ``logprobs``: asked for where the class has the field (a draft's confidence comes from
    them). Not its retries: an OpenAI-family class builds its SDK client, retries included,
    once when it is made; a copy's ``max_retries`` would change nothing.
    """
    fields = getattr(type(model), "model_fields", {})
    update: dict[str, Any] = {}
    for option, names in REMOTE_FIELDS.items():
        value = getattr(options, option)
        name = next((n for n in names if n in fields), None)
        if value is not None and name is not None:
            update[name] = remote_seed(value) if option == "seed" else value
    if logprobs and "logprobs" in fields:
        update["logprobs"] = True
    return model.model_copy(update=update) if update else model


# remote models that refused a request for log-probabilities (asked for no more, per process)
_NO_LOGPROBS: set[str] = set()


def model_key(model: BaseChatModel) -> str:
    """A remote chat model's class and model name (what refused log-probabilities)."""
    name = getattr(model, "model_name", None) or getattr(model, "model", None) or ""
    return f"{type(model).__name__}:{name}"


def rough_tokens(text: str) -> int:
    """About how many tokens ``text`` is: its words and punctuation marks.

    A lower bound for a BPE tokenizer's count on English text: a remote model without
    log-probabilities or a usage count is counted so, not by its chunks of several tokens.
    """
    return len(re.findall(r"\w+|[^\w\s]", text))


def answer_tokens(usage: dict[str, Any]) -> int:
    """The text tokens a remote call's usage counts (its hidden reasoning tokens left out).

    A provider sends several tokens per chunk: counted by chunks, a good remote draft read
    as "too short" for ``min_draft_tokens``. 0 where the usage has no count.
    """
    total = usage.get("output_tokens")
    if not isinstance(total, int) or isinstance(total, bool):
        return 0
    reasoning = (usage.get("output_token_details") or {}).get("reasoning") or 0
    return max(0, total - (reasoning if isinstance(reasoning, int) else 0))


def first_stop(text: str, stops: tuple[str, ...], since: int = 0) -> int | None:
    """Where the first of ``stops`` starts in ``text`` (None: nowhere).

    Only a match that ends at or after ``since`` (the text before it was looked at already)
    is searched for, so a stream costs one look per chunk.
    """
    if not stops:
        return None
    start = max(0, since - max(map(len, stops)) + 1)
    found = [i for i in (text.find(stop, start) for stop in stops if stop) if i >= 0]
    return min(found) if found else None


STOP_POLL_S = 0.02  # how often a remote stream's stop event is looked at between chunks


async def until_stopped(work: Coroutine[Any, Any, None], stopped: Callable[[], bool]) -> bool:
    """Run ``work``; cancel it once ``stopped()`` (looked at every :data:`STOP_POLL_S`).

    True when it was stopped so. A cancellation from outside (a budget) cancels ``work`` too.
    """
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            if stopped():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return True
            await asyncio.wait({task}, timeout=STOP_POLL_S)
        task.result()  # its own error, if any
        return False
    finally:  # cancelled from outside (a budget): the task's end is not awaited, so its
        # error (in the stream's clean-up, or one it had just raised) is retrieved, not logged
        if not task.done():
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        elif not task.cancelled():
            task.exception()


def steps_on_the_shared_pool(model: Any) -> bool:
    """Whether LangChain's ``astream`` would run ``model`` on the event loop's shared pool.

    A chat model with a synchronous stream only (``_stream``; or no stream and no native
    ``_agenerate``) is stepped there, one ``next`` per job: a call that hangs holds a thread
    of that pool (cores + 4) for good, and after a few every later run waited for one in its
    first thread hop (a model's warm-up), with no budget to end the wait - no answer, no
    message (a review, 2026-12-07). Such a model streams on a thread of its own instead;
    one wrapped (``bind``, ``with_config``, ``with_retry``, ``with_fallbacks``) is judged by
    the model it wraps (the first, for fallbacks).
    """
    from langchain_core.runnables import RunnableWithFallbacks
    from langchain_core.runnables.base import RunnableBindingBase

    while isinstance(model, (RunnableBindingBase, RunnableWithFallbacks)):  # with_retry too
        model = model.bound if isinstance(model, RunnableBindingBase) else model.runnable
    if not isinstance(model, BaseChatModel):
        return False
    cls = type(model)
    if cls._astream is not BaseChatModel._astream:
        return False
    if cls._stream is not BaseChatModel._stream:
        return True
    return cls._agenerate is BaseChatModel._agenerate


async def stream_in_own_thread(
    model: BaseChatModel, messages: list[BaseMessage], config: Any, **kwargs: Any
) -> AsyncIterator[Any]:
    """``model.stream(...)``'s chunks, stepped on a daemon thread of its own.

    In step with the reader, as LangChain steps it: the next chunk is asked for once the
    reader wants it, so a stream closed early (a stop cut, the budget's end) is closed at the
    chunk the reader read last. The caller's context variables (tracing) go with it. A call
    that never returns strands that thread alone, which never holds up the process's exit.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue()
    wanted = threading.Semaphore(0)  # one release per chunk the reader asks for
    closed = threading.Event()
    end = object()
    context = contextvars.copy_context()

    def put(ok: bool, item: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (ok, item))
        except RuntimeError:  # the loop closed meanwhile: nobody reads
            closed.set()

    def work() -> None:
        try:
            chunks = model.stream(messages, config=config, **kwargs)
            try:
                while True:
                    wanted.acquire()
                    if closed.is_set():
                        break
                    chunk = next(chunks, end)
                    put(True, chunk)
                    if chunk is end:
                        break
            finally:
                close = getattr(chunks, "close", None)  # a generator: its provider's stream
                if close is not None:
                    close()
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            put(False, exc)

    threading.Thread(
        target=context.run, args=(work,), name="specrag-model-stream", daemon=True
    ).start()
    try:
        while True:
            wanted.release()
            ok, item = await queue.get()
            if not ok:
                raise item
            if item is end:
                return
            yield item
    finally:
        closed.set()
        wanted.release()  # a thread waiting to be asked sees it is closed


async def stream_model(
    model: BaseChatModel,
    messages: list[BaseMessage],
    *,
    budget_s: float,
    tags: list[str],
    options: DecodeOptions | None = None,
    stop_event: threading.Event | None = None,
    min_tokens: int = 0,
    confidence: bool = False,
) -> Streamed:
    """Stream ``model`` for at most ``budget_s`` seconds; never raises on timeout.

    ``confidence``: a remote model is asked for log-probabilities (a draft's confidence); one
    that refuses them before its first text is asked again without, within the budget left,
    and never asked for them again in this process.

    Local models get ``max_time`` (and the stop event) in their :class:`DecodeOptions`, so
    their decode loop - prefill included - stops itself; other models are cut off by
    ``asyncio.timeout`` and stopped by the stop event within :data:`STOP_POLL_S`, whether
    or not a chunk arrives (once ``min_tokens`` came).
    """
    out = Streamed()
    start = out.started = now()
    local = is_local(model)
    kwargs: dict[str, Any] = {}
    if local:
        kwargs["options"] = dataclasses.replace(
            options or DecodeOptions(),
            max_time=budget_s,
            stop_event=stop_event,
            min_tokens=min_tokens,
        )
    ask_logprobs = (
        confidence
        and not local
        and "logprobs" in getattr(type(model), "model_fields", {})
        and model_key(model) not in _NO_LOGPROBS
    )
    given = model
    if not local:  # its stop sequences are cut here, not sent: OpenAI, Azure and Bedrock
        # refuse more than 4 (HTTP 400: every call failed), some models any
        model = with_remote_settings(model, options or DecodeOptions(), ask_logprobs)
    stops = tuple(options.stop) if options is not None and not local else ()
    config = {"tags": tags, "metadata": {"specrag_stage": tags[0]}}
    # the graph node streaming (a revise event names it: whose text it cuts)
    node = next((t for t in reversed(tags) if not t.startswith("langsmith:")), tags[0])
    event = None if local else stop_event  # a local decode polls the event itself

    def stopping() -> bool:
        return event is not None and event.is_set() and out.tokens >= min_tokens

    stop_cut = False  # a remote model's stop sequence ended the text here
    # where each counted token starts in the text, and whether it brought a log-prob: a stop
    # cut keeps the tokens (and log-probs) that start before it, not the whole last chunk's
    starts: list[tuple[int, bool]] = []

    async def consume() -> None:
        # closed as the loop ends (a stop cut, the stop event): a provider's stream is let go
        # at once, not when it is collected
        chunks: Any = (
            stream_in_own_thread(model, messages, config, **kwargs)
            if steps_on_the_shared_pool(model)
            else model.astream(messages, config=config, **kwargs)  # type: ignore[arg-type]
        )
        async with contextlib.aclosing(chunks):
            await read(chunks)

    async def read(chunks: Any) -> None:
        nonlocal stop_cut
        async for chunk in chunks:
            text = chunk.text if isinstance(chunk.text, str) else str(chunk.content)
            meta = chunk.response_metadata or {}
            for revision in meta.get("revisions") or []:  # new evidence retracted text
                out.text = out.text[: revision["keep"]]
                out.tokens = revision["kept_tokens"]
                out.logprobs = out.logprobs[: revision["kept_tokens"]]
                out.revisions.append({**revision, "at_s": round(now() - start, 4)})
                emit({"event": "revise", "node": node, **out.revisions[-1]})
            if text and out.ttft_s is None:
                out.ttft_s = now() - start
            at = len(out.text)
            out.text += text
            cut = first_stop(out.text, stops, at) if text else None
            lps = (meta.get("logprobs") or {}).get("content") or []
            out.logprobs.extend(float(x["logprob"]) for x in lps if "logprob" in x)
            # local models report a log-prob per token; others count text chunks
            out.tokens += len(lps) if (lps or local) else (1 if text else 0)
            for x in lps if not local else ():
                starts.append((at, "logprob" in x))
                at += len(x.get("token") or "") if isinstance(x.get("token"), str) else 0
            if text and not lps and not local:
                starts.append((at, False))
            for key, value in meta.items():
                if key not in ("logprobs", "revisions"):
                    out.metadata[key] = value
            if chunk.usage_metadata:
                out.metadata["usage"] = dict(chunk.usage_metadata)
            if cut is not None:  # a remote model's stop sequence: the text ends before it
                dropped, out.text = out.text[cut:], out.text[:cut]
                kept = [has_lp for at, has_lp in starts if at < cut]
                out.tokens = len(kept)
                out.logprobs = out.logprobs[: sum(kept)]
                out.metadata["finish_reason"] = "stop"
                stop_cut = True
                emit(
                    {
                        "event": "revise",
                        "node": node,
                        "keep": cut,
                        "kept_tokens": out.tokens,
                        "dropped_text": dropped,
                        "why": "stop sequence",
                        "at_s": round(now() - start, 4),
                    }
                )
                break
            if stopping():  # at once after the chunk that came (no wait for the next poll)
                out.stopped = True
                break

    budget = asyncio.timeout(budget_s + GRACE_S if local else budget_s)
    try:
        async with budget:
            if event is None:
                await consume()
            else:  # a remote stream may send nothing for a while: stop it between chunks
                out.stopped = await until_stopped(consume(), stopping) or out.stopped
    except TimeoutError:
        if not budget.expired():  # the model's own (a socket's read timeout): its error
            raise
        out.timed_out = True
        if local and "decoding" not in out.metadata:  # a step ran past the grace: the last
            # chunk, with the decode's stats, is lost; what is known is kept (a review: a
            # RAPID answer's stats read {"truncated": true} and nothing else)
            out.metadata["decoding"] = {"new_tokens": out.tokens, "finish_reason": "time"}
            out.metadata["finish_reason"] = "time"
    except Exception as exc:
        # a refusal of log-probabilities only (a 429 or a dropped connection is the call's
        # error: it must not switch them off for the rest of the process)
        if out.text or not ask_logprobs or "logprob" not in str(exc).lower():
            raise
        _NO_LOGPROBS.add(model_key(given))  # refused, say: asked once more without them
        log.info("%s: no log-probabilities (asking without them)", model_key(given))
        return await stream_model(
            given,
            messages,
            budget_s=max(0.0, budget_s - (now() - start)),
            tags=tags,
            options=options,
            stop_event=stop_event,
            min_tokens=min_tokens,
        )
    if not local and not out.logprobs:  # no count per token: the usage's, else the text's
        counted = [out.tokens, rough_tokens(out.text)]
        if not stop_cut:  # a usage count covers the text past a stop cut here too
            counted.append(answer_tokens(out.metadata.get("usage") or {}))
        out.tokens = max(counted)
    retracted = int((out.metadata.get("decoding") or {}).get("retracted_tokens") or 0)
    if retracted:  # streamed before a stop sequence was recognised: not part of the text
        out.logprobs = out.logprobs[: len(out.logprobs) - retracted]
        out.tokens = max(0, out.tokens - retracted)
    out.elapsed_s = now() - start
    reason = out.metadata.get("finish_reason")
    if reason == "time":
        out.timed_out = True
    elif reason == "stop_event":
        out.stopped = True
    out.text = out.text.strip()
    return out
