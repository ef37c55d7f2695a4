"""The collaborators nodes call: chat models, the retriever, the RAPID model.

Defaults use the embedded local models; tests and applications pass their own
:class:`Services` to :func:`specrag.graph.builder.build_graph`.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel

from specrag.errors import short_number
from specrag.graph.context import SpecRagContext
from specrag.indexing.document_search import index_document, search_document
from specrag.indexing.documents import Chunk
from specrag.indexing.store import Batch, VectorIndex, check_local, check_recorded_model
from specrag.models.chat import LocalChatBase
from specrag.models.loading import load_embeddings, load_lm
from specrag.models.registry import chat_model_from_spec, local_model_name
from specrag.paths import default_index_dir

ChatFactory = Callable[[str, SpecRagContext], BaseChatModel]
Retriever = Callable[[str, str | None, SpecRagContext], list[Chunk]]
BatchRetriever = Callable[[str, str | None, SpecRagContext], Iterator[Batch]]
RapidFactory = Callable[[SpecRagContext], BaseChatModel]


def default_chat_model(spec: str, ctx: SpecRagContext) -> BaseChatModel:
    """Chat model for ``spec`` on the context's device and dtype.

    The answer model gets the context's drafter as a token proposer when both are local and
    differ (the cost model in :class:`ChatLocalLM` still decides whether it runs).
    """
    params: dict[str, object] = {}
    target, drafter = local_model_name(spec), local_model_name(ctx.draft_spec)
    if spec == ctx.answer_spec and target and drafter and drafter != target:
        params = {
            "drafter_model": drafter,
            "drafter_max_cost_ratio": ctx.drafter_max_cost_ratio,
            "drafter_after_tokens": ctx.drafter_after_tokens,
            "drafter_join_factor": ctx.drafter_join_factor,
            "drafter_pay_check": ctx.drafter_pay_check,
            "drafter_confidence": ctx.drafter_confidence,
            "drafter_vocab": ctx.drafter_vocab,
            "drafter_dtype": ctx.draft_dtype,
        }
    dtype = ctx.draft_dtype if spec == ctx.draft_spec else ctx.dtype  # same model: ctx.dtype
    return chat_model_from_spec(spec, device=ctx.device, dtype=dtype, **params)


_INDEXES: dict[tuple[str, str, str], VectorIndex] = {}  # (url or directory, collection, model)
_INDEX_LOCK = threading.Lock()


SEARCH_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "specrag_search_deadline", default=None
)
"""When the running search's budget ends (``time.monotonic``; set by ``retrieve``)."""
BUSY_MARGIN_S = 0.1  # a wait for the index lock gives up this long before the budget ends


def open_index(ctx: SpecRagContext) -> VectorIndex:
    """The context's persistent index (one client per directory and collection).

    Waits at most ``retrieval_timeout_s`` for another thread opening an index, and within a
    search gives up just before its budget ends, so the run is told the index was busy: a
    store that hangs while it opens would otherwise gather one stuck thread per run behind it
    (a run's budget ends its wait, not its thread) until a server's thread pool is full.
    """
    directory = str(Path(ctx.index_dir).expanduser() if ctx.index_dir else default_index_dir())
    key = (ctx.index_url or directory, ctx.collection, ctx.embedding_model)
    if (opened := _INDEXES.get(key)) is not None:  # open already: no wait behind another
        return opened  # run's opening (a hung server's) of another index
    wait = ctx.retrieval_timeout_s
    if (deadline := SEARCH_DEADLINE.get()) is not None:
        wait = min(wait, max(0.0, deadline - time.monotonic() - BUSY_MARGIN_S))
    if not _INDEX_LOCK.acquire(timeout=wait):
        raise TimeoutError(
            f"the index is busy: another run was still opening one after {short_number(wait)}s"
        )
    try:
        if key not in _INDEXES:
            check_local(Path(directory), ctx.collection, ctx.index_url)  # before the model loads
            check_recorded_model(directory, ctx.collection, ctx.index_url, ctx.embedding_model)
            _INDEXES[key] = VectorIndex(
                directory,
                load_embeddings(ctx.embedding_model),
                ctx.collection,
                url=ctx.index_url,
                embedding_model=ctx.embedding_model,
            )
        return _INDEXES[key]
    finally:
        _INDEX_LOCK.release()


@lru_cache(maxsize=4)
def _token_length(model_name: str, device: str, dtype: str) -> Callable[[str], int]:
    tokenizer = load_lm(model_name, device, dtype).tokenizer
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def answer_token_length(ctx: SpecRagContext) -> Callable[[str], int]:
    """Token counter of the answer model (whitespace words for remote models)."""
    name = local_model_name(ctx.answer_spec)
    if name is not None:
        return _token_length(name, ctx.device, ctx.dtype)
    return lambda text: len(text.split())


def answer_tokenizer_key(ctx: SpecRagContext) -> str:
    """What :func:`answer_token_length` counts with: a document's chunks are cached under it."""
    return local_model_name(ctx.answer_spec) or "whitespace words"


def default_retriever(question: str, document: str | None, ctx: SpecRagContext) -> list[Chunk]:
    """Search the document when one is given, else the persistent index."""
    if document:
        return search_document(
            document,
            question,
            embeddings=load_embeddings(ctx.embedding_model),
            token_length=answer_token_length(ctx),
            chunk_tokens=ctx.rapid_chunk_tokens,
            token_budget=ctx.rapid_drafter_tokens,
            tokenizer_key=answer_tokenizer_key(ctx),
        )
    return open_index(ctx).search(question, ctx.top_k, ctx.retrieval)


def default_document_tokens(ctx: SpecRagContext, document: str) -> int:
    """Length of a document in answer-model tokens (decides the RAPID route)."""
    return answer_token_length(ctx)(document)


def default_index_document(ctx: SpecRagContext, document: str) -> None:
    """Chunk and embed a document now (cached), so retrieval only searches it."""
    index_document(
        document,
        embeddings=load_embeddings(ctx.embedding_model),
        token_length=answer_token_length(ctx),
        chunk_tokens=ctx.rapid_chunk_tokens,
        tokenizer_key=answer_tokenizer_key(ctx),
    )


class RapidUnavailable(ValueError):
    """RAPID cannot run with these settings (a remote answer model): the gate says why."""


def default_rapid_model(ctx: SpecRagContext) -> BaseChatModel:
    """A :class:`ChatRapid`: the answer model reads the document, the drafter the chunks.

    The drafter is the context's draft model when it is local (e.g. the pair's 0.5B); a remote
    draft model cannot draft token by token, so the answer model drafts for itself then.
    """
    from specrag.models.rapid_chat import ChatRapid

    name = local_model_name(ctx.answer_spec)
    if name is None:
        raise RapidUnavailable(f"RAPID needs a local answer model, not {ctx.answer_spec!r}")
    return ChatRapid(
        target_model=name,
        drafter_model=local_model_name(ctx.draft_spec) or name,
        device=ctx.device,
        dtype=ctx.dtype,
        drafter_dtype=ctx.draft_dtype,
        temperature=ctx.refine_temperature,
        max_new_tokens=ctx.answer_max_tokens,
        gamma=ctx.rapid_gamma,
        transfer=ctx.rapid_transfer,
        eta=ctx.rapid_eta,
        min_draft_confidence=ctx.rapid_drafter_confidence,
        drafter_vocab=ctx.drafter_vocab,
        # the drafter's own search, where the run's found nothing: the run's settings
        embedding_model=ctx.embedding_model,
        chunk_tokens=ctx.rapid_chunk_tokens,
        drafter_tokens=ctx.rapid_drafter_tokens,
        prefix_cache_bytes=ctx.prefix_cache_mib * 2**20,
        prefix_cache_disk_bytes=ctx.prefix_cache_disk_mib * 2**20,
    )


def warm_model(model: BaseChatModel) -> None:
    """Load a local model before its time budget starts (no-op for remote models)."""
    load = getattr(model, "load", None)
    if callable(load):
        load()


@dataclass
class Services:
    """What the nodes depend on; swap any part for tests or other backends."""

    chat_model: ChatFactory = default_chat_model
    retriever: Retriever = default_retriever
    rapid_model: RapidFactory = default_rapid_model
    warm: Callable[[BaseChatModel], None] = warm_model
    document_tokens: Callable[[SpecRagContext, str], int] = default_document_tokens
    index_document_now: Callable[[SpecRagContext, str], None] = default_index_document
    batch_retriever: BatchRetriever | None = None  # None: the index's own batches

    def retrieve_batches(
        self, query: str, document: str | None, ctx: SpecRagContext
    ) -> Iterator[Batch]:
        """Evidence as batches, most relevant first.

        The index's best dense hit, then the fused rest; a document search or a custom
        ``retriever`` is one batch.
        """
        if self.batch_retriever is not None:
            yield from self.batch_retriever(query, document, ctx)
        elif self.retriever is default_retriever and not document:
            yield from open_index(ctx).search_batches(query, ctx.top_k, ctx.retrieval)
        else:
            yield Batch("document" if document else "search", self.retriever(query, document, ctx))

    def index_document(self, ctx: SpecRagContext, document: str) -> None:
        """Index the run's document outside the retrieval budget (default retriever only)."""
        if self.retriever is default_retriever:
            self.index_document_now(ctx, document)

    def warm_retriever(self, ctx: SpecRagContext, document: str | None) -> None:
        """Load the embedding model outside the retrieval budget.

        Opening the index stays inside the budget: a locked or slow store must end in the
        fallback route, not stall the run.
        """
        if self.retriever is default_retriever:
            load_embeddings(ctx.embedding_model)
            if document:
                answer_token_length(ctx)


def is_local(model: Any) -> bool:
    """True for models that accept specrag's per-call decoding arguments."""
    return isinstance(model, LocalChatBase)
