"""The machinery every local decoder shares: prompts, streaming, time bounds, the model thread.

:class:`LocalChatBase` streams a :class:`DecodeJob` (built by a subclass: :class:`ChatLocalLM`
or :class:`ChatRapid`) on the model thread and turns its tokens into ``AIMessageChunk``s with
log-probabilities. What it adds over a plain wrapper:

* **real time bounds** - ``max_time`` (seconds) ends the decode loop itself, prefill included,
  so a timed-out generation stops using the CPU/GPU instead of running on in the background;
* **token log-probabilities** in ``response_metadata["logprobs"]["content"]`` (OpenAI layout:
  ``[{"token", "logprob"}]``), the basis of draft confidence;
* a stop event ("retrieval finished") and cancellation when the consumer goes away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel, generate_from_stream
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, field_validator, model_validator

from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import Revise, Step, Token
from specrag.decoding.state import shared_prefix, sync
from specrag.models.loading import LoadedLM
from specrag.models.options import DecodeOptions
from specrag.models.tools import (
    ToolCapture,
    any_valid,
    defuse_dicts,
    partial_start,
    template_messages,
)
from specrag.models.worker import MODEL_THREAD

log = logging.getLogger(__name__)


def to_chat_dicts(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages -> ``[{"role", "content"}]`` for a chat template (no tools)."""
    return template_messages(messages, tools=False)


def special_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's special and added tokens, longest first (what user text must not form)."""
    key = id(tokenizer)
    if key not in _SPECIALS:
        added = list(getattr(tokenizer, "get_added_vocab", dict)())
        added += list(getattr(tokenizer, "all_special_tokens", []))
        _SPECIALS[key] = tuple(sorted(set(added), key=len, reverse=True))
    return _SPECIALS[key]


_SPECIALS: dict[int, tuple[str, ...]] = {}


def encode_chat(
    loaded: LoadedLM,
    messages: list[BaseMessage],
    tools: Sequence[dict[str, Any]] = (),
    forced: str = "",
) -> list[int]:
    """Token ids of the chat prompt, generation prompt included.

    User and tool text is defused against the tokenizer's own special tokens first, so text
    can never become a control token (system prompts are the application's own). ``tools``
    (OpenAI-style schemas) are rendered by the chat template; ``forced`` is text the answer
    must start with (a forced tool call), appended after the generation prompt.
    """
    tok = loaded.tokenizer
    specials = special_tokens(tok)
    dicts = defuse_dicts(template_messages(messages, tools=bool(tools)), specials)
    if getattr(tok, "chat_template", None):
        extra = {"tools": list(tools)} if tools else {}
        enc = apply_template(tok, dicts, tokenize=True, **extra)
        ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
        prompt = [int(i) for i in ids]
    else:
        # the specials its tokenizer puts first (a BOS), none after the generation prompt
        text = plain_transcript(dicts)
        prompt = leading_specials(tok) + [
            int(i) for i in tok(text, add_special_tokens=False)["input_ids"]
        ]
    if forced:
        prompt += [int(i) for i in tok(forced, add_special_tokens=False)["input_ids"]]
    return prompt


def plain_transcript(dicts: Sequence[dict[str, Any]]) -> str:
    """The prompt of a model without a chat template: ``Role: text`` turns, then ``Assistant:``.

    Capitalised as :data:`specrag.prompts.INVENTED_TURNS` names turns: a model that goes on
    with the transcript stops at the turn it invents (lower-case ``user:`` was not caught: a
    review, 2026-12-07).
    """
    turns = (f"{str(d['role']).capitalize()}: {d['content']}" for d in dicts)
    return "\n\n".join(turns) + "\n\nAssistant:"


def leading_specials(tok: Any) -> list[int]:
    """The ids ``tok`` puts before any text by itself (a BOS).

    Parts tokenised with ``add_special_tokens=False`` leave them out.
    """
    bare = [int(i) for i in tok("x", add_special_tokens=False)["input_ids"]]
    full = [int(i) for i in tok("x")["input_ids"]]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start]
    return []


def apply_template(tok: Any, dicts: list[dict[str, Any]], **kwargs: Any) -> Any:
    """``tok.apply_chat_template`` with the generation prompt, for every template.

    Some templates refuse a system turn (Mistral-Instruct v0.1/v0.2 and Gemma raise "roles
    must alternate" / "System role not supported"): on the template's own error the system
    text opens the first user turn instead.
    """
    from jinja2 import TemplateError

    try:
        return tok.apply_chat_template(dicts, add_generation_prompt=True, **kwargs)
    except TemplateError:
        merged = system_in_first_turn(dicts)
        if merged is None:
            raise
        return tok.apply_chat_template(merged, add_generation_prompt=True, **kwargs)


def system_in_first_turn(dicts: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``dicts`` with the system turns' text put before the first user turn's (None: none)."""
    system = [d for d in dicts if d.get("role") == "system"]
    if not system or not all(isinstance(d.get("content"), str) for d in dicts):
        return None
    text = "\n\n".join(str(d["content"]) for d in system)
    rest = [dict(d) for d in dicts if d.get("role") != "system"]
    first = next((d for d in rest if d.get("role") == "user"), None)
    if first is None:
        return [{"role": "user", "content": text}, *rest]
    first["content"] = f"{text}\n\n{first['content']}"
    return rest


MIN_HEAD = 16  # a shorter chat head is reported as none
# a queued decode with a stop event (a draft that retrieval stops) looks at it this often
QUEUED_STOP_POLL_S = 0.02


def chat_head(
    loaded: LoadedLM,
    messages: list[BaseMessage],
    prompt: list[int],
    tools: Sequence[dict[str, Any]] = (),
    forced: str = "",
) -> int:
    """How many tokens of ``prompt`` come before the last message's text: its chat head.

    The head (system turn, earlier turns, the last turn's opening) is what a prompt too long
    for the model keeps whole when its middle is cut. Found from the template alone: the
    prompts of two different one-character last messages agree exactly up to there. 0 where
    it is shorter than :data:`MIN_HEAD` tokens or ``prompt`` does not start with it.
    """
    if not messages:
        return 0
    last = messages[-1]
    probes = [
        encode_chat(
            loaded, [*messages[:-1], last.model_copy(update={"content": text})], tools, forced
        )
        for text in ("a", "b")
    ]
    head = shared_prefix(probes[0], probes[1])
    whole = prompt[:head] == probes[0][:head]
    return head if whole and MIN_HEAD <= head < len(prompt) else 0


class TextStream:
    """Incremental detokenisation that never emits half of a multi-byte character."""

    def __init__(self, tokenizer: Any, skip_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        self.skip = set(skip_ids)
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, ids: list[int]) -> str:
        """Add tokens; return the new text that is now stable."""
        self.ids.extend(i for i in ids if i not in self.skip)
        text = stable_text(self.tokenizer, self.ids)
        # A decoder that rewrites earlier text (a normaliser) cannot take back what was
        # shown: the stream goes on past the length shown (it stopped for good before)
        delta = text[len(self.emitted) :]
        if len(text) >= len(self.emitted):
            self.emitted = text
        return delta


def stable_text(tokenizer: Any, ids: list[int]) -> str:
    """``ids`` as text, less an incomplete UTF-8 sequence at the end.

    That waits for the next token; the text before it is shown now (an answer that ends
    there keeps all but the broken character).
    """
    return decode_text(tokenizer, ids).rstrip("\ufffd")


def decode_text(tokenizer: Any, ids: list[int]) -> str:
    """``ids`` as text, as a stream shows it.

    Without the clean-up of spaces before punctuation, which rewrites text already shown when
    the punctuation comes ("Hello " then "Hello,"); the embedded model's and the pair's
    tokenizers never clean up anyway.
    """
    text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return str(text)


def answer_fit(asked: int, prompt_tokens: int, limit: int) -> int:
    """The answer limit a prompt of ``prompt_tokens`` leaves within ``limit`` tokens.

    An answer limit past the context caps the answer, not the prompt: it takes what the
    prompt leaves, and the prompt keeps at least half the context (a prompt cut to 16 tokens
    for max_new_tokens near the context answered nothing asked). ``asked`` where it fits.
    """
    return max(min(asked, limit - prompt_tokens), min(asked, limit // 2))


StopCheck = Callable[[int], "str | None"]


@dataclass
class DecodeJob:
    """Everything :class:`LocalChatBase` needs to stream one local decode."""

    produce: Callable[[StopCheck], Iterator[Step]]  # stepped on the model thread
    tokenizer: Any
    eos_ids: tuple[int, ...]
    input_tokens: int
    metadata: Callable[[], dict[str, Any]]  # called after decoding: response_metadata extras
    finish_reason: Callable[[], str]
    model_name: str = ""
    flatten: bool = False  # also put the decoding statistics at the top of response_metadata
    tools: tuple[str, ...] = ()  # the bound tools' names: their calls are parsed, not shown
    forced: str = ""  # text the answer was forced to start with (a forced tool call)
    # the device its models run on: a short call lent mid-prefill first waits for the work
    # queued there (a GPU runs ahead of the clock; that time is the decode's own)
    device: torch.device | None = None


class LocalChatBase(BaseChatModel):
    """Streaming machinery shared by local decoders.

    A worker thread, a time bound, a stop event, log-probabilities per chunk; subclasses
    build a :class:`DecodeJob`.
    """

    # a misspelt or foreign argument is an error, not ignored (ChatLocalLM also takes
    # LangChain's usual ``model=`` and ``max_tokens=`` for its fields)
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")
    max_time: float | None = None
    stop: list[str] | None = None  # stop sequences of every call that names none

    @field_validator("max_time")
    @classmethod
    def _a_number(cls, value: float | None) -> float | None:
        """NaN is refused as a call's is (its deadline never came: no limit at all)."""
        if value is not None:
            DecodeOptions(max_time=value)  # the per-call check: one ValueError line
        return value

    # fields that shape no answer (caches and their budgets), left out of the cache key
    _not_identity: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _one_name_each(cls, data: Any) -> Any:
        """A field given under two of its names is one clear error.

        (Pydantic took one and called the other "Extra inputs are not permitted: model".)
        """
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                alias = field.validation_alias
                names = [n for n in getattr(alias, "choices", ()) if isinstance(n, str)]
                given = [n for n in names if n in data]
                if len(given) > 1:
                    raise ValueError(f"{name}: give one of {' or '.join(given)}, not both")
        return data

    def _job(self, messages: list[BaseMessage], options: DecodeOptions) -> DecodeJob:
        raise NotImplementedError

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return _result(list(self._stream(messages, stop, run_manager, **kwargs)))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # ainvoke / abatch through the native async stream: a cancelled caller (a timeout)
        # stops the decode, and a call queued for the model holds no executor thread
        return _result([c async for c in self._astream(messages, stop, run_manager, **kwargs)])

    def _decode_identity(self) -> dict[str, Any]:
        """Every field of the local model's own, for ``_identifying_params``.

        LangChain's cache keys a call by those params: every setting that shapes an answer
        must be among them, or two models with other settings share one entry - ``max_time``
        (a timed-out answer was served to a model without the limit), and what a sampled
        answer's draws depend on (the candidates and drafter settings). All of them, so a new
        field cannot be left out; LangChain's own (callbacks, tags) are not.
        """
        skip = {*BaseChatModel.model_fields, *self._not_identity}
        own = {name: getattr(self, name) for name in type(self).model_fields if name not in skip}
        # LangChain sets "stop" to the call's own (None when it names none) over this one's
        own["model_stop"] = own.pop("stop", None)
        return own

    def _max_new(self, options: DecodeOptions) -> int:
        """The call's answer limit in tokens: its own (0: none), else the model's."""
        limit = getattr(self, "max_new_tokens", 0)
        max_new = limit if options.max_new_tokens is None else options.max_new_tokens
        if max_new < 0:  # a call's own is checked by DecodeOptions; the model's may be set late
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new}")
        return int(max_new)

    def load(self) -> Any:
        """Load the model's weights (once per process); called before a decode's budget starts.

        Nothing here: a model that loads weights overrides it.
        """
        return None

    def _options(self, stop: list[str] | None, kwargs: dict[str, Any]) -> DecodeOptions:
        """One call's decode options.

        Stop sequences: the call's ``stop`` (``[]``: none), else its ``options``', else the
        model's own.
        """
        options = DecodeOptions.from_call(kwargs)
        if stop is not None:  # one string is one stop sequence, not its characters
            stops = (stop,) if isinstance(stop, str) else tuple(stop)
            return dataclasses.replace(options, stop=stops)
        if not options.stop and self.stop:
            return dataclasses.replace(options, stop=tuple(self.stop))
        return options

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        options = self._options(stop, kwargs)
        self.load()  # loading is outside the budget (once per process)
        started = time.monotonic()  # the budget covers building the job (tokenizing) too
        run = _Run(self, self._job(messages, options), options, started)
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        run.start(events.put)
        try:
            while True:
                try:
                    kind, value = events.get(timeout=run.wait_left())
                except queue.Empty:  # its budget ran out while queued
                    if run.give_up_waiting():
                        break
                    continue
                if kind == "error":
                    raise value
                if kind == "done":
                    break
                chunk = run.chunk(value)
                if run_manager and chunk.text:
                    run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk
        finally:
            run.cancel.set()
        last = run.final_chunk()  # its text: what was held for a stop sequence or a tool call
        if run_manager and last.text:
            run_manager.on_llm_new_token(last.text, chunk=last)
        yield last

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        # Native async: the decode runs in its own thread and hands tokens to the event loop,
        # so a run waiting for the model (queued behind others) holds no executor thread.
        options = self._options(stop, kwargs)
        await asyncio.to_thread(self.load)  # loading is outside the budget
        started = time.monotonic()  # the budget covers building the job (tokenizing) too:
        job = await asyncio.to_thread(self._job, messages, options)  # the caller's timeout does
        run = _Run(self, job, options, started)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def put(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # the consumer's event loop is closed: nobody is listening
                run.cancel.set()

        run.start(put)
        try:
            while True:
                try:
                    kind, value = await asyncio.wait_for(events.get(), run.wait_left())
                except TimeoutError:  # its budget ran out while queued
                    if run.give_up_waiting():
                        break
                    continue
                if kind == "error":
                    raise value
                if kind == "done":
                    break
                chunk = run.chunk(value)
                if run_manager and chunk.text:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk
        finally:
            run.cancel.set()
        last = run.final_chunk()
        if run_manager and last.text:
            await run_manager.on_llm_new_token(last.text, chunk=last)
        yield last


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first of ``stops`` found in ``text`` starts (None: none is there)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _result(chunks: list[ChatGenerationChunk]) -> ChatResult:
    """One result of a whole stream of chunks."""
    result = generate_from_stream(iter(chunks))
    if any(c.message.response_metadata.get("revisions") for c in chunks):
        # an incremental answer: the concatenated chunks still hold retracted text
        result.generations[0].message.content = revised_text(chunks)
    return result


def revised_text(chunks: Sequence[ChatGenerationChunk]) -> str:
    """The text a stream of chunks shows once each ``revisions`` retraction is applied."""
    text = ""
    for chunk in chunks:
        for revision in chunk.message.response_metadata.get("revisions") or []:
            text = text[: revision["keep"]]
        text += chunk.text
    return text


class _Run:
    """One decode in flight: its worker thread, stop conditions and chunk building."""

    def __init__(
        self,
        owner: LocalChatBase,
        job: DecodeJob,
        options: DecodeOptions,
        started: float,
    ) -> None:
        self.job = job
        self.started = started  # the call's start: its budget counts from there
        max_time = options.max_time if options.max_time is not None else owner.max_time
        # 0 stops at once (a budget already spent); None: no time limit
        self.deadline = self.started + max_time if max_time is not None else None
        self.stop_event: threading.Event | None = options.stop_event
        self.min_tokens = int(options.min_tokens)
        self.cancel = threading.Event()
        self.timed_out_waiting = threading.Event()
        self.stopped_waiting = threading.Event()  # its stop event ended it before it began
        self.begun = False  # the model thread took the job (under _begin_lock)
        self._begin_lock = threading.Lock()
        self.text = TextStream(job.tokenizer, job.eos_ids)
        self.first_token_s: float | None = None
        self.n_tokens = 0
        self.stops = tuple(s for s in options.stop if s)
        self.held = ""  # text that may be the start of a stop sequence
        self.stop_hit = False
        # Revise steps the model thread has sent that the consumer has not applied yet: until
        # it has, ``stop_hit`` may describe retracted text (ignored by ``should_stop``)
        self.revising = 0
        self._revising_lock = threading.Lock()
        self.starts: list[int] = []  # character where each counted token's text starts
        self.retracted = 0  # tokens streamed before a stop sequence was seen that belong to it
        self.capture = ToolCapture(job.forced, job.tools) if job.tools else None
        self.fed = 0  # characters of answer text fed to ``capture`` (the text's own offsets)
        self.ids: list[int] = []  # every answer token so far (a Revise cuts it)
        self.shown = ""  # the text sent in chunks so far (what a client shows)

    def wait_left(self) -> float | None:
        """How long the consumer may wait for the next event (None: as long as it takes).

        A job still queued (others hold every decode slot, or a long load runs) waits at most
        until its deadline: ``max_time`` was checked only once a slot freed, so a 1 s budget
        returned after 10 s behind four long decodes (a review, 2026-12-07).
        """
        if self.begun:
            return None
        # a stop it may take before its first token (a draft retrieval stops) is polled for
        poll = QUEUED_STOP_POLL_S if self._stoppable_unbegun() else math.inf
        if self.deadline is None or not math.isfinite(self.deadline):
            return None if poll == math.inf else poll  # (an infinite budget: no overflow)
        return max(0.0, min(poll, self.deadline - time.monotonic()))

    def _stoppable_unbegun(self) -> bool:
        """A stop event it obeys before any token (``min_tokens`` 0): it can end while queued."""
        return self.stop_event is not None and self.min_tokens <= 0

    def _stopped_unbegun(self) -> bool:
        """That stop event is set: a job still queued never begins."""
        event = self.stop_event
        return event is not None and self.min_tokens <= 0 and event.is_set()

    def give_up_waiting(self) -> bool:
        """Whether the consumer stops waiting for a job not begun yet (True: it never will).

        At its deadline, or once its stop event is set; one begun stops itself, and one still
        in time waits on (False).
        """
        with self._begin_lock:
            if self.begun:
                return False
            if self._stopped_unbegun():  # e.g. retrieval delivered while the draft queued
                self.stopped_waiting.set()
            elif self.deadline is not None and time.monotonic() >= self.deadline:
                self.timed_out_waiting.set()
            else:
                return False
            self.cancel.set()
            return True

    def should_stop(self, n: int) -> str | None:
        reason = self._stop_reason(n)
        if reason is None:  # asked between prefill slices: others' short calls go on ...
            device = self.job.device
            MODEL_THREAD.run_waiting_calls(before=(lambda: sync(device)) if device else None)
            reason = self._stop_reason(n)  # ... and what they took may have spent the budget
        return reason

    def _stop_reason(self, n: int) -> str | None:
        if self.cancel.is_set() or MODEL_THREAD.closing:
            return "cancelled"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "time"
        if self.stop_event is not None and self.stop_event.is_set() and n >= self.min_tokens:
            return "stop_event"
        if self.stop_hit and not self.revising:
            return "stop_sequence"
        if self.capture is not None and self.capture.done:
            return "tool_call"
        return None

    def start(self, put: Callable[[tuple[str, Any]], None]) -> None:
        """Queue the decode on the model thread; events arrive through ``put``."""

        def begin() -> Iterator[Step] | None:
            with self._begin_lock:
                if self.cancel.is_set():
                    return None
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self.timed_out_waiting.set()  # its budget ran out while queued
                    return None
                if self._stopped_unbegun():  # told to stop while queued: never begins
                    self.stopped_waiting.set()
                    return None
                self.begun = True
            return self.job.produce(self.should_stop)

        def end(exc: BaseException | None) -> None:
            if exc is not None:
                put(("error", exc))
            put(("done", None))

        def on_step(step: Step) -> None:
            if step:  # an empty step: an incremental decode waiting for evidence
                self.sending(step)
                put(("step", step))

        MODEL_THREAD.run_steps(begin, on_step, end)

    def sending(self, step: Step) -> None:
        """On the model thread, before ``step`` goes to the consumer: count a Revise in flight."""
        if isinstance(step, Revise):
            with self._revising_lock:
                self.revising += 1

    def release(self, delta: str) -> str:
        """The part of ``delta`` that can be shown now.

        Text before a stop sequence; a tail that may still become one is held back.
        """
        if not self.stops:
            out, self.held = self.held + delta, ""
            return out
        buf = self.held + delta
        cut = first_stop(buf, self.stops)
        if cut is not None:
            self.stop_hit, self.held = True, ""
            return buf[:cut]
        keep = partial_start(buf, self.stops)
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def revise(self, revise: Revise) -> ChatGenerationChunk:
        """Retract the answer after its first ``revise.keep`` tokens.

        The chunk carries ``response_metadata["revisions"]``: ``keep`` (characters of the
        shown text that stay), the token counts and the retracted text. Stop sequences are
        looked for again in what is kept.
        """
        shown_tokens = self.n_tokens  # the answer's tokens so far (none past a stop sequence)
        del self.ids[revise.keep :]
        del self.starts[revise.keep :]
        self.text.ids = [i for i in self.ids if i not in self.text.skip]
        text = self.text.emitted = stable_text(self.job.tokenizer, self.text.ids)
        cut = first_stop(text, self.stops)
        self.stop_hit = cut is not None
        # kept tokens whose text starts at the stop sequence are not the answer's: the
        # revision's kept_tokens leaves them out, so nothing is retracted at the end
        # (tokens decoded after the stop have no start: they are past it too)
        kept = revise.keep if cut is None else sum(1 for start in self.starts if start < cut)
        recount = self.retracted or kept != shown_tokens  # the consumer's token count changes
        self.n_tokens, self.retracted = kept, 0
        with self._revising_lock:
            self.revising -= 1
        keep = shared_prefix(self.shown, text[:cut])
        if not self.stop_hit:  # a shown end that starts a stop sequence is held back again:
            keep -= partial_start(text[:keep], self.stops)  # what follows may complete it
        dropped_text, self.shown = self.shown[keep:], self.shown[:keep]
        self.held = "" if self.stop_hit else self.text.emitted[keep:]
        revision = {
            "keep": keep,
            "kept_tokens": self.n_tokens,
            # of the answer's tokens (the decoder's count has those past a stop sequence)
            "dropped_tokens": max(0, shown_tokens - kept),
            "dropped_text": dropped_text,
        }
        if not dropped_text and not recount:  # nothing shown changes, nor its token count:
            # the retracted tokens were past a stop sequence (decoded before the decoder stopped)
            return ChatGenerationChunk(message=AIMessageChunk(content=""))
        return ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata={"revisions": [revision]})
        )

    def chunk(self, step: Step) -> ChatGenerationChunk:
        if isinstance(step, Revise):
            return self.revise(step)
        self.ids.extend(t.id for t in step)
        out = self._chunk(step)
        self.shown += out.text
        return out

    def _chunk(self, step: list[Token]) -> ChatGenerationChunk:
        if self.stop_hit:  # tokens decoded after a stop sequence are dropped
            return ChatGenerationChunk(message=AIMessageChunk(content=""))
        if self.first_token_s is None:
            self.first_token_s = time.monotonic() - self.started
        if self.stops or self.capture is not None:  # where each token's text starts, to cut
            # at a stop sequence or a tool call's end later
            ids = list(self.text.ids)  # (a character split over tokens: from its start, not
            for token in step:  # one past it, where the broken character's U+FFFD ends)
                self.starts.append(len(stable_text(self.job.tokenizer, ids)))
                if token.id not in self.text.skip:
                    ids.append(token.id)
        shown_before = len(self.text.emitted) - len(self.held)
        delta = self.release(self.text.push([t.id for t in step]))
        if self.capture is not None:
            self.fed += len(delta)
            delta = self.capture.feed(delta)
        logprobs = [
            {"token": self.job.tokenizer.decode([t.id]), "logprob": t.logprob}
            for t in step
            if t.id not in self.job.eos_ids
        ]
        self.n_tokens += len(step)
        if self.stop_hit:  # tokens whose text starts at or after the cut are not the answer's
            cut = shown_before + len(delta)
            after = sum(1 for start in self.starts if start >= cut)
            in_step = min(after, len(step))
            # the log-probs leave the end token out: drop those of the step's other tokens
            # past the cut (an accepted block can end "... text with the stop", end token)
            past = [t for t in step[len(step) - in_step :] if t.id not in self.job.eos_ids]
            logprobs = logprobs[: max(0, len(logprobs) - len(past))]
            self.retracted = after - in_step  # counted in earlier chunks
            self.n_tokens -= after
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content=delta, response_metadata={"logprobs": {"content": logprobs}}
            )
        )

    def _cut_at_the_call(self) -> None:
        """Leave the tokens decoded past a complete tool call out of the answer's counts.

        The model thread stops once the consumer's capture has seen the call's end, a step or
        (a slow consumer) many after it, and a verify pass accepts several tokens at once:
        those tokens are not the answer's (its content is cut there too), so ``output_tokens``
        and the log-probs stop at the call, as a one-token decode would (a review, 2026-12-07:
        36, 52 or 120 output tokens for one 26-token call). ``decoded_tokens`` keeps the rest.
        """
        assert self.capture is not None
        end = self.capture.call_end()
        if end is None:
            return
        cut = self.fed - (len(self.capture.captured) - end)
        # the tokens still counted are the first n_tokens (a stop sequence's cut left out the
        # rest, and ``starts`` stopped there): of those, the ones past the call go too
        counted = min(self.n_tokens, len(self.starts))
        past = [i for i in range(counted) if self.starts[i] >= cut]
        eos = self.job.eos_ids
        self.retracted += sum(1 for i in past if self.ids[i] not in eos)  # their log-probs sent
        self.n_tokens -= len(past)

    def final_chunk(self) -> ChatGenerationChunk:
        job = self.job
        finish = "time" if self.timed_out_waiting.is_set() else (job.finish_reason() or "stop")
        if self.stopped_waiting.is_set():
            finish = "stop_event"
        if self.stop_hit:
            finish = "stop_sequence"
        tail, self.held = ("" if self.stop_hit else self.held), ""
        calls: list[Any] = []
        if self.capture is not None:  # the text held for a stop sequence goes through it
            self.fed += len(tail)  # too, before its own held text (was after it)
            tail = self.capture.feed(tail)
            self._cut_at_the_call()
            rest, calls = self.capture.finish()
            tail += rest
            # a whole call (its object complete), whatever stopped the decode at its end;
            # a call a limit, the budget or a stop sequence cut keeps that reason
            if any_valid(calls) and (finish in ("stop", "tool_call") or self.capture.done):
                finish = "tool_calls"
            elif finish == "tool_call":  # a broken call's block ended: no call to make
                finish = "stop"
        self.shown += tail
        meta = job.metadata()
        decoding = {**meta, "new_tokens": self.n_tokens}
        if self.timed_out_waiting.is_set() or self.stopped_waiting.is_set():  # it never ran:
            decoding["finish_reason"] = finish  # say why here too
        if meta.get("new_tokens", self.n_tokens) != self.n_tokens:
            # the decoder ran on past a stop sequence or a tool call (it stops between
            # steps): tokens_from
            # and the pass counts count those tokens too
            decoding["decoded_tokens"] = meta["new_tokens"]
        if self.retracted:  # consumers drop the last N log-probs they were sent
            decoding["retracted_tokens"] = self.retracted
        decoding["ttft_s"] = (
            round(self.first_token_s, 4) if self.first_token_s is not None else None
        )
        decoding["total_s"] = round(time.monotonic() - self.started, 4)
        # the prompt the answer stands on (an incremental answer rebuilt on a later one counted
        # its first)
        read = meta.get("prompt_tokens")
        input_tokens = read if isinstance(read, int) and read > 0 else job.input_tokens
        usage = UsageMetadata(
            input_tokens=input_tokens,
            output_tokens=self.n_tokens,
            total_tokens=input_tokens + self.n_tokens,
        )
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content=tail,
                tool_call_chunks=calls,
                usage_metadata=usage,
                response_metadata={
                    **(decoding if job.flatten else {}),  # first: never over the fields below
                    "model_name": job.model_name,
                    "finish_reason": finish,
                    "truncated": finish in ("time", "stop_event", "cancelled"),
                    "decoding": decoding,
                },
                chunk_position="last",
            )
        )


def make_generator(
    device: torch.device, sampler: Sampler, seed: int | None
) -> torch.Generator | None:
    """A seeded generator for sampling (None when greedy)."""
    if sampler.greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else int(time.time_ns() % 2**31))
    return generator
