"""Retrieval inside one long document (the RAPID drafter's context).

The document is split into token-aware chunks (tokens of the *answer model*, so budgets are
exact), the chunks are embedded once per document (cached by content hash), and a question
selects the top chunks by cosine similarity up to a token budget, put back in document order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from specrag.indexing.documents import Chunk, make_splitter, split_document

DOCUMENT_SOURCE = "document"  # the source of a given document's chunks (the CLI names the file)
_CACHE: OrderedDict[str, tuple[list[Chunk], np.ndarray]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 8


def clear_cache() -> None:
    """Forget every chunked and embedded document (benchmarks time each case cold)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def document_hash(text: str) -> str:
    """Stable content hash of a document."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _embedded_chunks(
    text: str,
    embeddings: Any,
    token_length: Callable[[str], int],
    chunk_tokens: int,
    tokenizer_key: str = "",
) -> tuple[list[Chunk], np.ndarray]:
    # chunk sizes are counted by ``token_length``: another model's tokenizer (the pair after
    # the embedded model in one process) got the first one's chunks, 529 "tokens" for 128
    counter = tokenizer_key or f"counter {id(token_length)}"
    key = f"{document_hash(text)}:{chunk_tokens}:{id(embeddings)}:{counter}"
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    splitter = make_splitter(token_length, chunk_tokens, chunk_tokens // 8)
    chunks = split_document(DOCUMENT_SOURCE, text, splitter)
    vectors = np.asarray(embeddings.embed_documents([c.text for c in chunks]), dtype=np.float32)
    with _CACHE_LOCK:
        _CACHE[key] = (chunks, vectors)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return chunks, vectors


def search_document(
    text: str,
    question: str,
    *,
    embeddings: Any,
    token_length: Callable[[str], int],
    chunk_tokens: int = 128,
    token_budget: int = 768,
    tokenizer_key: str = "",
) -> list[Chunk]:
    """Most similar chunks within ``token_budget`` tokens, in document order, with scores.

    The best chunk is kept even where it alone is longer than the budget. ``tokenizer_key``
    names what ``token_length`` counts with (a model's name): the document's chunks are
    cached under it (without one, under this very counter object).
    """
    chunks, vectors = _embedded_chunks(text, embeddings, token_length, chunk_tokens, tokenizer_key)
    if not chunks:
        return []
    query = np.asarray(embeddings.embed_query(question), dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1) * (np.linalg.norm(query) or 1.0)
    scores = vectors @ query / np.where(norms == 0, 1.0, norms)
    picked: list[Chunk] = []
    used = 0
    for idx in np.argsort(-scores):
        chunk = chunks[int(idx)]
        cost = token_length(chunk.text)
        if picked and used + cost > token_budget:
            continue
        picked.append(dataclasses.replace(chunk, score=float(scores[int(idx)])))
        used += cost
        if used >= token_budget:
            break
    return sorted(picked, key=lambda c: c.position)


def drafter_context(
    text: str,
    question: str,
    embeddings: Any,
    token_length: Callable[[str], int],
    chunk_tokens: int = 128,
    token_budget: int = 768,
    tokenizer_key: str = "",
) -> str:
    """The RAPID drafter's context: the best chunks within the budget, in document order."""
    chunks = search_document(
        text,
        question,
        embeddings=embeddings,
        token_length=token_length,
        chunk_tokens=chunk_tokens,
        token_budget=token_budget,
        tokenizer_key=tokenizer_key,
    )
    return "\n\n".join(c.text for c in chunks)


def index_document(
    text: str,
    *,
    embeddings: Any,
    token_length: Callable[[str], int],
    chunk_tokens: int = 128,
    tokenizer_key: str = "",
) -> int:
    """Chunk and embed ``text`` now (cached by content), so a later search is fast; chunks."""
    chunks, _ = _embedded_chunks(text, embeddings, token_length, chunk_tokens, tokenizer_key)
    return len(chunks)
