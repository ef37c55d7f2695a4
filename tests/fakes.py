"""Fake collaborators for offline tests: chat models that carry log-probabilities."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel, generate_from_stream
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult

from specrag.graph.context import SpecRagContext
from specrag.graph.services import Services
from specrag.indexing.documents import Chunk
from specrag.indexing.store import Batch

HANG_S = 60.0  # how long a hung fake waits for its event at most (a run no budget cut)


class FakeLogprobChat(BaseChatModel):
    """Streams ``reply`` word by word, each with ``logprob`` (None: no log-probs)."""

    reply: str = "Paris is the capital of France."
    logprob: float | None = -0.05
    delay_s: float = 0.0  # per word
    hold: Any = None  # a threading.Event: the reply waits for it (a hung model, released later)
    fail: bool = False
    finish_reason: str = ""  # on the last chunk, as chat APIs report it ("length": its limit)
    calls: list[list[BaseMessage]] = []

    @property
    def _llm_type(self) -> str:
        return "fake-logprob"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        self.calls.append(messages)
        if self.fail:
            raise RuntimeError("model exploded")
        if self.hold is not None:
            self.hold.wait(HANG_S)
        words = self.reply.split(" ")
        for i, word in enumerate(words):
            if self.delay_s:
                time.sleep(self.delay_s)
            text = word if i == 0 else " " + word
            meta: dict[str, Any] = {}
            if self.logprob is not None:
                meta = {"logprobs": {"content": [{"token": text, "logprob": self.logprob}]}}
            if self.finish_reason and i == len(words) - 1:
                meta["finish_reason"] = self.finish_reason
            chunk = ChatGenerationChunk(
                message=AIMessageChunk(content=text, response_metadata=meta)
            )
            if run_manager:
                run_manager.on_llm_new_token(text, chunk=chunk)
            yield chunk


def failing_once(
    error: BaseException, calls: dict[str, int] | None = None, reply: str = "Paris."
) -> FakeLogprobChat:
    """A model that raises ``error`` at its first call, then answers ``reply``.

    ``calls["answer"]`` counts its calls where a test reads them.
    """
    count = calls if calls is not None else {"answer": 0}

    class FailingOnce(FakeLogprobChat):
        def _stream(self, *a: Any, **k: Any) -> Iterator[ChatGenerationChunk]:
            count["answer"] = count.get("answer", 0) + 1
            if count["answer"] == 1:
                raise error
            yield from super()._stream(*a, **k)

    return FailingOnce(reply=reply, calls=[])


def chunk(text: str, score: float = 0.8, source: str = "doc.txt", n: int = 0) -> Chunk:
    return Chunk(id=f"id{n}", source=source, text=text, position=n, score=score)


def services(
    draft: BaseChatModel | None = None,
    answer: BaseChatModel | None = None,
    chunks: list[Chunk] | None = None,
    retrieve_delay_s: float = 0.0,
    retrieve_hold: threading.Event | None = None,
    retrieve_error: Exception | None = None,
) -> Services:
    draft = draft or FakeLogprobChat(calls=[])
    answer = answer or FakeLogprobChat(reply="Paris.", calls=[])
    found = chunks if chunks is not None else [chunk("Paris is the capital of France.")]

    def chat_model(spec: str, ctx: SpecRagContext) -> BaseChatModel:
        return draft if spec == "fake:draft" else answer

    def retriever(question: str, document: str | None, ctx: SpecRagContext) -> list[Chunk]:
        if retrieve_delay_s:
            time.sleep(retrieve_delay_s)
        if retrieve_hold is not None:  # a hung search (a threading.Event, released later)
            retrieve_hold.wait(HANG_S)
        if retrieve_error:
            raise retrieve_error
        return found

    return Services(
        chat_model=chat_model,
        retriever=retriever,
        rapid_model=lambda ctx: answer,
        warm=lambda model: None,
    )


def ctx(**kw: Any) -> SpecRagContext:
    # fake models answer at once: a generous draft budget, so that no route here depends on
    # how busy the machine is (tests of the draft timeout set their own)
    base = dict(
        draft_model="fake:draft",
        answer_model="fake:answer",
        draft_policy="complete",
        draft_timeout_s=30.0,
    )
    base.update(kw)
    return SpecRagContext(**base)


FIRST = chunk("Paris is the capital.", n=0)  # the first batch's evidence
REST = chunk("France's capital: Paris.", n=1)  # a later batch's, ranked above it


def two_batches(wait: Callable[[], Any]) -> Callable[..., Iterator[Batch]]:
    """A search whose first batch is FIRST and whose second, after ``wait()``, re-ranks
    REST above it (``answer_policy="incremental"`` weaves it in)."""

    def batches(query: str, document: str | None, ctx: SpecRagContext) -> Iterator[Batch]:
        yield Batch("dense", [FIRST])
        wait()
        yield Batch("hybrid", [REST], [REST, FIRST])

    return batches
