"""``ChatLocalLM``: a LangChain chat model over a local Hugging Face causal LM.

Thin by design: it adapts messages to the model's chat template, runs
:func:`specrag.decoding.speculative.decode` in a worker thread, and turns tokens into streamed
``AIMessageChunk``s. What it adds over a plain wrapper:

* **real time bounds** - ``max_time`` (seconds) ends the decode loop itself, so a timed-out
  generation stops using the CPU/GPU instead of running on in the background;
* **token log-probabilities** in ``response_metadata["logprobs"]["content"]`` (OpenAI layout:
  ``[{"token", "logprob"}]``), the basis of draft confidence;
* **speculative candidates** - ``speculation="prompt"`` proposes n-grams of the prompt (the
  evidence), ``"draft+prompt"`` also of a ``draft=`` text passed per call; greedy output is
  unchanged, decoding needs fewer forward passes. Decoding statistics go to
  ``response_metadata["decoding"]``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel, generate_from_stream
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field

from specrag.decoding.candidates import NgramProposer
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import DecodeStats, Token, decode
from specrag.decoding.state import LMState
from specrag.models.loading import EMBEDDED_LM, LoadedLM, load_lm
from specrag.models.worker import MODEL_THREAD

Speculation = Literal["none", "prompt", "draft+prompt"]


def to_chat_dicts(messages: list[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages -> ``[{"role", "content"}]`` for a chat template."""
    roles = {"human": "user", "ai": "assistant", "system": "system", "tool": "user"}
    return [{"role": roles.get(m.type, "user"), "content": str(m.text)} for m in messages]


def encode_chat(loaded: LoadedLM, messages: list[BaseMessage]) -> list[int]:
    """Token ids of the chat prompt, generation prompt included."""
    tok = loaded.tokenizer
    dicts = to_chat_dicts(messages)
    if getattr(tok, "chat_template", None):
        enc = tok.apply_chat_template(dicts, add_generation_prompt=True, tokenize=True)
        ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
        return [int(i) for i in ids]
    text = "\n\n".join(f"{d['role']}: {d['content']}" for d in dicts) + "\n\nassistant:"
    return [int(i) for i in tok(text)["input_ids"]]


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
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # incomplete UTF-8 sequence: wait for the next token
            return ""
        delta = text[len(self.emitted) :] if text.startswith(self.emitted) else ""
        self.emitted = text if text.startswith(self.emitted) else self.emitted
        return delta


StopCheck = Callable[[int], "str | None"]


@dataclass
class DecodeJob:
    """Everything :class:`LocalChatBase` needs to stream one local decode."""

    produce: Callable[[StopCheck], Iterator[list[Token]]]  # stepped on the model thread
    tokenizer: Any
    eos_ids: tuple[int, ...]
    input_tokens: int
    metadata: Callable[[], dict[str, Any]]  # called after decoding: response_metadata extras
    finish_reason: Callable[[], str]
    model_name: str = ""
    flatten: bool = False  # also put the decoding statistics at the top of response_metadata


class LocalChatBase(BaseChatModel):
    """Streaming machinery shared by local decoders.

    A worker thread, a time bound, a stop event, log-probabilities per chunk; subclasses
    build a :class:`DecodeJob`.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    max_time: float | None = None

    def _job(self, messages: list[BaseMessage], **kwargs: Any) -> DecodeJob:
        raise NotImplementedError

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        run = _Run(self, self._job(messages, **kwargs), kwargs)
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        run.start(events.put)
        try:
            while True:
                kind, value = events.get()
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
        yield run.final_chunk()

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        # Native async: the decode runs in its own thread and hands tokens to the event loop,
        # so a run waiting for the model (queued behind others) holds no executor thread.
        job = await asyncio.to_thread(self._job, messages, **kwargs)
        run = _Run(self, job, kwargs)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def put(item: tuple[str, Any]) -> None:
            loop.call_soon_threadsafe(events.put_nowait, item)

        run.start(put)
        try:
            while True:
                kind, value = await events.get()
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
        yield run.final_chunk()


class _Run:
    """One decode in flight: its worker thread, stop conditions and chunk building."""

    def __init__(self, owner: LocalChatBase, job: DecodeJob, kwargs: dict[str, Any]) -> None:
        self.job = job
        self.started = time.monotonic()
        max_time = kwargs.get("max_time", owner.max_time)
        self.deadline = self.started + max_time if max_time else None
        self.stop_event: threading.Event | None = kwargs.get("stop_event")
        self.min_tokens = int(kwargs.get("min_tokens", 0))
        self.cancel = threading.Event()
        self.timed_out_waiting = threading.Event()
        self.text = TextStream(job.tokenizer, job.eos_ids)
        self.first_token_s: float | None = None
        self.n_tokens = 0

    def should_stop(self, n: int) -> str | None:
        if self.cancel.is_set():
            return "cancelled"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "time"
        if self.stop_event is not None and self.stop_event.is_set() and n >= self.min_tokens:
            return "stop_event"
        return None

    def start(self, put: Callable[[tuple[str, Any]], None]) -> None:
        """Queue the decode on the model thread; events arrive through ``put``."""

        def begin() -> Iterator[list[Token]] | None:
            if self.cancel.is_set():
                return None
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.timed_out_waiting.set()  # its budget ran out while queued
                return None
            return self.job.produce(self.should_stop)

        def end(exc: BaseException | None) -> None:
            if exc is not None:
                put(("error", exc))
            put(("done", None))

        MODEL_THREAD.run_steps(begin, lambda step: put(("step", step)), end)

    def chunk(self, step: list[Token]) -> ChatGenerationChunk:
        self.n_tokens += len(step)
        if self.first_token_s is None:
            self.first_token_s = time.monotonic() - self.started
        delta = self.text.push([t.id for t in step])
        logprobs = [
            {"token": self.job.tokenizer.decode([t.id]), "logprob": t.logprob}
            for t in step
            if t.id not in self.job.eos_ids
        ]
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content=delta, response_metadata={"logprobs": {"content": logprobs}}
            )
        )

    def final_chunk(self) -> ChatGenerationChunk:
        job = self.job
        finish = "time" if self.timed_out_waiting.is_set() else (job.finish_reason() or "stop")
        decoding = {**job.metadata(), "new_tokens": self.n_tokens}
        decoding["ttft_s"] = (
            round(self.first_token_s, 4) if self.first_token_s is not None else None
        )
        decoding["total_s"] = round(time.monotonic() - self.started, 4)
        usage = UsageMetadata(
            input_tokens=job.input_tokens,
            output_tokens=self.n_tokens,
            total_tokens=job.input_tokens + self.n_tokens,
        )
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=usage,
                response_metadata={
                    "model_name": job.model_name,
                    "finish_reason": finish,
                    "truncated": finish in ("time", "stop_event", "cancelled"),
                    "decoding": decoding,
                    **(decoding if job.flatten else {}),
                },
                chunk_position="last",
            )
        )


class ChatLocalLM(LocalChatBase):
    """A local Hugging Face causal LM as a streaming LangChain chat model.

    Per-call keyword arguments (``model.invoke(msgs, draft=..., max_time=...)``):
    ``draft`` (candidate text for ``speculation="draft+prompt"``), ``speculation``,
    ``max_time``, ``max_new_tokens``, ``temperature``, ``stop_event`` (a ``threading.Event``;
    decoding stops once it is set and ``min_tokens`` tokens exist) and ``min_tokens``.
    """

    model_name: str = Field(default=EMBEDDED_LM, description="embedded, a local path or a hub id")
    device: str = "auto"
    dtype: str = "auto"
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    speculation: Speculation = "prompt"
    max_candidates: int = 8
    seed: int | None = None

    @property
    def _llm_type(self) -> str:
        return "specrag-local-hf"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "device": self.device,
            "dtype": self.dtype,
            "temperature": self.temperature,
            "speculation": self.speculation,
        }

    def load(self) -> LoadedLM:
        """Load the model now (once per process); call before any time budget starts."""
        return load_lm(self.model_name, self.device, self.dtype)

    def _job(self, messages: list[BaseMessage], **kwargs: Any) -> DecodeJob:
        loaded = self.load()
        temperature = float(kwargs.get("temperature", self.temperature))
        max_new = int(kwargs.get("max_new_tokens", self.max_new_tokens))
        prompt = encode_chat(loaded, messages)
        limit = loaded.max_context - 1
        if len(prompt) + max_new > limit:  # keep the chat head and the question end
            keep = max(limit - max_new, 16)
            prompt = prompt[:8] + prompt[-(keep - 8) :]
        sources: dict[str, list[int]] = {}
        draft = kwargs.get("draft")
        speculation = kwargs.get("speculation", self.speculation)
        if speculation == "draft+prompt" and draft:
            sources["draft"] = loaded.tokenizer(draft, add_special_tokens=False)["input_ids"]
        if speculation != "none":
            sources["prompt"] = prompt
        proposer = NgramProposer(sources) if sources else None
        sampler = Sampler(temperature, self.top_p)
        generator = make_generator(loaded.device, sampler, self.seed)
        stats = DecodeStats()

        def produce(should_stop: StopCheck) -> Iterator[list[Token]]:
            lm = LMState(loaded.model, loaded.device)
            yield from decode(
                lm,
                prompt,
                max_new_tokens=max_new,
                sampler=sampler,
                eos_ids=loaded.eos_token_ids,
                proposer=proposer,
                max_candidates=self.max_candidates,
                should_stop=should_stop,
                generator=generator,
                stats=stats,
            )

        return DecodeJob(
            produce=produce,
            tokenizer=loaded.tokenizer,
            eos_ids=loaded.eos_token_ids,
            input_tokens=len(prompt),
            metadata=lambda: {**stats.as_dict(), "speculation": speculation},
            finish_reason=lambda: stats.finish_reason,
            model_name=loaded.name,
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
