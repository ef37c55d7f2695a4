"""The persistent vector index: embedded Chroma (langchain-chroma) with content-hash ids.

Indexing is idempotent and crash-safe: every chunk id is a hash of its source and text, so a
re-run adds only what is missing and deletes chunks whose source text changed or vanished. A
run killed half-way leaves chunks that a re-run keeps (same id) or completes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from specrag.errors import IndexError_, first_line
from specrag.indexing.documents import Chunk, make_splitter, split_document
from specrag.indexing.lexical import LexicalIndex, fingerprint, rrf

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_COLLECTION = "specrag"
EMBED_BATCH = 64
WRITE_BATCH = 1000  # ids per Chroma update/delete call (its own limit is ~5,000 locally)
EMBEDDING_KEY = "specrag:embedding_model"  # collection metadata: the model that built it


def embedding_stamp(name: str) -> str:
    """How a collection records its embedding model.

    ``embedded`` as itself (whatever folders the current directory holds: the name is what
    ``load_embeddings`` reads), the bundled model's folder as ``embedded`` too, another local
    folder as its absolute path (``./minilm`` from another directory is the same model), any
    other name (a hub id) as given.
    """
    from specrag.models.loading import EMBEDDED_LM, embedded_embeddings_path

    if name == EMBEDDED_LM:
        return name
    local = Path(name).expanduser()
    if not local.is_dir():
        return name
    real = local.resolve()
    try:
        bundled = embedded_embeddings_path().resolve()
    except Exception:  # noqa: BLE001 - not installed: no folder is the bundled one
        bundled = None
    return EMBEDDED_LM if real == bundled else str(real)


_TOLD_GONE: set[tuple[str, str, str]] = set()  # (collection, recorded folder, model used)


def check_embedding_stamp(built_with: str | None, using: str, collection: str, where: str) -> None:
    """Refuse to open a collection built with another embedding model (one-line error).

    Not checked: a collection with no record (made before 2026-12-05), or one whose recorded
    folder is gone (a moved model: a warning, since the names cannot be compared).
    """
    if not built_with or built_with == using:
        return
    if Path(built_with).is_absolute() and not Path(built_with).exists():
        if (told := (collection, built_with, using)) in _TOLD_GONE:
            return  # said once per process (an index run checks before and as it opens)
        _TOLD_GONE.add(told)
        log.warning(
            "collection %r was built with the embedding model at %s, which is gone; using %s "
            "as if it were the same model",
            collection,
            built_with,
            using,
        )
        return
    raise IndexError_(
        f"collection {collection!r} at {where} was built with embedding model {built_with!r}, "
        f"not {using!r} (the index records the model's name or folder): use --set "
        f"embedding_model={built_with} or another --set collection=NAME"
    )


_OPENED_IN: int | None = None  # the process that opened a local Chroma index first
FORKED = (
    "this process was forked from one that had opened the local index, and Chroma's local "
    "client hangs after a fork: open the index after forking (a server that preloads in its "
    "parent: specrag.preload(ctx, index=False)), or serve it with `chroma run` and set "
    "index_url"
)


def _not_forked() -> None:
    """Refuse Chroma's local client in a child forked after the parent opened one.

    Its Rust runtime does not survive ``fork``: the child's first call (an inherited client's
    or a new one's) hung forever holding the GIL, so no budget could end the run.
    """
    if _OPENED_IN is not None and _OPENED_IN != os.getpid():
        raise IndexError_(FORKED)


def local_client(path: str) -> Any:
    """``chromadb.PersistentClient(path)``, refused where :func:`_not_forked` says."""
    global _OPENED_IN
    _not_forked()
    import chromadb

    client = chromadb.PersistentClient(path=path)
    _OPENED_IN = _OPENED_IN or os.getpid()
    return client


def _plain_collection(where: str, collection: str, url: str) -> Any:
    """The Chroma collection, opened without an embedding model (nothing loads, none made).

    A server that does not answer is one-line ``IndexError_`` (:func:`connect`); whatever
    else fails is raised as Chroma raises it.
    """
    client = connect(url) if url else local_client(where)
    return client.get_collection(collection, embedding_function=None)


def _sources_in(got: Any) -> set[str]:
    """The sources named in a Chroma ``get(include=["metadatas"])`` result."""
    return {str(m.get("source")) for m in got["metadatas"] or [] if m}


def stored_sources(directory: str | Path, collection: str, url: str) -> set[str]:
    """The sources an index holds, read without its embedding model (``--forget``'s check).

    No such collection: one-line ``IndexError_``.
    """
    where = url or str(Path(directory).expanduser())
    try:
        found = _plain_collection(where, collection, url)
    except IndexError_:
        raise
    except Exception as exc:  # noqa: BLE001 - chromadb raises NotFoundError or ValueError
        from chromadb.errors import NotFoundError

        missing = isinstance(exc, NotFoundError) or "does not exist" in str(exc)
        if not missing:  # a read-only or locked database is no missing collection
            raise IndexError_(cannot_open(where, exc)) from exc
        raise IndexError_(f"no collection {collection!r} at {where}: {first_line(exc)}") from exc
    return _sources_in(found.get(include=["metadatas"]))


def cannot_open(where: str, exc: BaseException) -> str:
    """The line for an index that could not be opened, with the way out of a read-only one."""
    line = f"cannot open index at {where}: {first_line(exc)}"
    if "readonly database" in line:  # Chroma opens its database for writing, even to search
        line += " (Chroma writes to its index folder even to search: copy the index to a "
        line += "writable folder and pass --index-dir)"
    return line


def local_index_at(directory: str | Path) -> bool:
    """A local (embedded Chroma) index is in ``directory``; looking never creates one."""
    return (Path(directory).expanduser() / "chroma.sqlite3").is_file()


def check_recorded_model(
    directory: str | Path, collection: str, url: str, embedding_model: str
) -> None:
    """:func:`check_embedding_stamp` before the embedding model loads (a one-line error).

    A hub id that is not cached here took a minute of download retries before the index
    said it was built with another model. No index or no such collection yet is left to
    opening the index (which makes it); a store that cannot be read is one-line
    ``IndexError_`` with Chroma's reason (a second open of a corrupt file in this process
    fails with an unrelated ``AttributeError``: Chroma keeps the broken client).
    """
    from chromadb.errors import NotFoundError

    from specrag.models.loading import check_embedding_path

    check_embedding_path(embedding_model)  # a path that is not there: said as such
    where = url or str(Path(directory).expanduser())
    if not url and not local_index_at(where):
        return
    try:
        recorded = (_plain_collection(where, collection, url).metadata or {}).get(EMBEDDING_KEY)
    except NotFoundError:  # a new collection: opening the index makes it
        return
    except IndexError_:  # a server that does not answer: one line
        raise
    except Exception as exc:  # noqa: BLE001 - chromadb's InternalError and the like
        raise IndexError_(cannot_open(where, exc)) from exc
    check_embedding_stamp(recorded, embedding_stamp(embedding_model), collection, where)


Progress = Callable[[float], None]  # the documents done so far (a share of the current one)


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass
class IndexReport:
    """What one indexing run changed."""

    files: int = 0
    chunks_total: int = 0  # the chunks of this run's files
    chunks_added: int = 0
    chunks_removed: int = 0
    sources_removed: list[str] = field(default_factory=list)
    index_chunks: int | None = None  # the whole index's chunks after the run (None: unknown)


COLLECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,510}[A-Za-z0-9]")  # Chroma's rule
# A local index keeps reach-<name>.json and bm25-<name>~tmp<pid>.<thread id> beside it: a
# file name holds at most 255 bytes
LOCAL_NAME_MAX = 200


def _require_collection(client: Any, collection: str, where: str, option: str) -> None:
    names = {getattr(c, "name", c) for c in client.list_collections()}
    if collection not in names:
        known = ", ".join(sorted(map(str, names))) or "none"
        raise IndexError_(
            f"no collection {collection!r} {where} (collections: {known}): run "
            f"`specrag index PATH {option} --set collection={collection}` first"
        )


def parse_url(url: str) -> tuple[str, int, bool]:
    """``(host, port, ssl)`` of a Chroma server's ``http(s)://HOST:PORT``.

    Anything else is a one-line ``IndexError_``: a path, a query, a fragment or a user name
    too (the client would drop them and talk to the server's root without credentials).
    """
    from urllib.parse import urlparse

    bad = f"bad --index-url {url!r}: use http://HOST:PORT of a `chroma run` server"
    try:
        parsed = urlparse(url)  # ValueError: a bracketed host left open ('http://[::1')
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise IndexError_(bad)
        extra = [
            what
            for what, there in (
                ("a path", parsed.path not in ("", "/")),
                ("a query", bool(parsed.query or parsed.params)),
                ("a fragment", bool(parsed.fragment)),
                ("a user name or password", "@" in parsed.netloc),
            )
            if there
        ]
        if extra:
            raise IndexError_(f"{bad} ({' and '.join(extra)} cannot be used)")
        port = parsed.port or (443 if parsed.scheme == "https" else 8000)
    except ValueError:  # that, or a port that is not a number, or over 65535
        raise IndexError_(bad) from None
    return parsed.hostname, port, parsed.scheme == "https"


def connect(url: str) -> Any:
    """A client of the Chroma server at ``url`` (``http(s)://host:port``), checked to answer.

    A malformed URL or a server that does not answer is a one-line ``IndexError_``.
    """
    import chromadb

    host, port, ssl = parse_url(url)
    try:
        client = chromadb.HttpClient(host=host, port=port, ssl=ssl)
        client.heartbeat()
    except Exception as exc:  # noqa: BLE001 - connection errors come in many types
        raise IndexError_(f"cannot reach the Chroma server at {url}: {first_line(exc)}") from exc
    return client


def check_local(directory: Path, collection: str, url: str | None, create: bool = False) -> None:
    """The checks of an index to open that need no client and no embedding model.

    A bad collection name, a malformed ``url``, or (without ``url``) no index in
    ``directory`` to open: one-line :class:`IndexError_` - run before the embedding model
    loads, so the commonest first mistake (``ask`` before any ``index``) is told at once.
    """
    if not COLLECTION_NAME.fullmatch(collection) or ".." in collection:
        raise IndexError_(
            f"bad collection name {collection!r}: 3-512 letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit"
        )
    if not url and len(collection) > LOCAL_NAME_MAX:  # Chroma takes 512; the file system not
        raise IndexError_(
            f"bad collection name {collection[:20]}... ({len(collection)} characters): at most "
            f"{LOCAL_NAME_MAX} in a local index, whose files beside it are named after it"
        )
    if url:
        parse_url(url)  # its form; whether a server answers is told when it is opened
    where = Path(directory).expanduser()
    if not url:  # the nearest part of the path that exists must be a folder
        there = next((p for p in (where, *where.parents) if p.exists()), None)
        if there is not None and not there.is_dir():
            raise IndexError_(
                f"cannot use {where} as the index folder: {there} is not a folder "
                "(--index-dir, or SPECRAG_DATA_DIR)"
            )
    if not url and not create and not local_index_at(where):
        raise IndexError_(f"no index at {where}: run `specrag index PATH` or `specrag demo` first")


class VectorIndex:
    """A Chroma collection of chunks from named sources."""

    def __init__(
        self,
        directory: str | Path,
        embeddings: Any,
        collection: str = DEFAULT_COLLECTION,
        *,
        create: bool = False,
        url: str = "",
        embedding_model: str | None = None,
    ) -> None:
        """Open the collection in ``directory`` (embedded Chroma), or on a Chroma server.

        ``url``: ``chroma run --path DIR --port N``'s address; one index shared by processes
        and hosts. ``embedding_model``: the name ``embeddings`` was loaded from; a collection
        it creates records it, and one that recorded another model is refused (one-line
        ``IndexError_``): vectors of two models must not share an index. Collections made
        before the record (or with no name given) are not checked.
        """
        self.directory = Path(directory).expanduser()
        self.collection_name = collection
        self.url = url
        self._lexical: LexicalIndex | None = None
        self._lexical_lock = threading.Lock()  # one rebuild at a time (searches run in threads)
        # the database's write stamp when the BM25 side was last checked (a local index): the
        # same stamp skips listing every id again (31 ms a search at 20,000 chunks, under the
        # lock); this object's own writes clear it
        self._lexical_written: tuple[tuple[int, int], ...] | None = None
        self._reopen_lock = threading.Lock()  # one reopen at a time (:meth:`_fresh`)
        check_local(self.directory, collection, url, create)
        client = connect(url) if url else None
        if client is not None and not create:
            try:
                _require_collection(
                    client, collection, f"on the Chroma server at {url}", f"--index-url {url}"
                )
            except IndexError_:
                raise
            except Exception as exc:  # noqa: BLE001 - a server that fails after its heartbeat
                raise IndexError_(
                    f"cannot list the collections at {url}: {first_line(exc)}"
                ) from exc

        where = url or str(self.directory)
        try:
            stamp = {EMBEDDING_KEY: embedding_stamp(embedding_model)} if embedding_model else {}
            self._embeddings, self._stamp = embeddings, stamp
            if client is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                # opening must not create an empty collection of a typo's name
                self._attach_checked(local_client(where), where, require=not create)
            else:
                self._attach_checked(client, where, require=False)  # required above
        except IndexError_:
            raise
        except (sqlite3.DatabaseError, Exception) as exc:  # noqa: BLE001
            raise IndexError_(cannot_open(where, exc)) from exc
        self._seen = self._written()

    def _attach_checked(self, client: Any, where: str, require: bool) -> None:
        """:meth:`_attach`, checked as an index opened is.

        The collection must be there (``require``: a local index's), and built with this
        embedding model (vectors of two models must not share an index).
        """
        if require:
            _require_collection(
                client, self.collection_name, f"in the index at {where}", f"--index-dir {where}"
            )
        self._attach(client)
        self._collection.count()
        if self._stamp:
            built_with = (self._collection.metadata or {}).get(EMBEDDING_KEY)
            check_embedding_stamp(
                built_with, self._stamp[EMBEDDING_KEY], self.collection_name, where
            )

    def _attach(self, client: Any) -> None:
        """Use ``client``'s collection of this name (made if missing, as ``create`` allows)."""
        from langchain_chroma import Chroma

        self._client = client
        self._store = Chroma(
            collection_name=self.collection_name,
            embedding_function=self._embeddings,
            collection_metadata={"hnsw:space": "cosine", **self._stamp},  # kept if it exists
            client=client,
        )

    @property
    def store(self) -> Any:
        """The LangChain Chroma store (refused in a child forked after a local index opened)."""
        if not self.url:
            _not_forked()
        return self._store

    @property
    def _collection(self) -> Any:
        return self.store._collection

    # --- another process's writes to a local index ----------------------------------------
    def _written(self) -> tuple[tuple[int, int], ...]:
        """When and how much a local index's database was last written (by any process)."""
        if self.url:
            return ()  # a server is one process: its clients see every write
        out = []
        for name in ("chroma.sqlite3", "chroma.sqlite3-wal"):
            with contextlib.suppress(OSError):
                st = (self.directory / name).stat()
                out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _fresh(self) -> None:
        """Reopen a local index another process wrote since this object last looked.

        Chroma keeps one in-memory vector index per path and process, read once: after an
        ``index`` run in another process, a long-lived one (Studio, an agent) missed the new
        chunks in dense search, and hybrid search failed on them ("Error finding id": the
        lexical side reads the database, which has them).
        """
        if self.url or self._written() == self._seen:
            return
        with self._reopen_lock:
            if self._written() != self._seen:  # not reopened by another search meanwhile
                self._reopen()

    def _reopen(self) -> None:
        """A new Chroma system for this path (its vector index read from disk again).

        Checked as :meth:`__init__` checks an index it opens: an index deleted meanwhile is not
        made again (an empty one, whose searches found nothing: "no index at ..." instead),
        nor is a collection dropped meanwhile; one rebuilt with another embedding model is
        refused (its vectors and this process's queries would not compare).
        """
        from chromadb.api.shared_system_client import SharedSystemClient

        where = str(self.directory)
        if not local_index_at(self.directory):
            raise IndexError_(
                f"no index at {where} (deleted while open): run `specrag index PATH` or "
                "`specrag demo` first"
            )
        # Chroma's own cache of systems, by path: only ``clear_system_cache`` (every path's)
        # is public. This path's is dropped, not stopped: other objects may still use it.
        identifier = getattr(self._client, "_identifier", str(self.directory))
        with SharedSystemClient._refcount_lock:
            SharedSystemClient._identifier_to_system.pop(identifier, None)
            SharedSystemClient._identifier_to_refcount.pop(identifier, None)
        self._attach_checked(local_client(where), where, require=True)
        self._seen = self._written()
        log.info("the index at %s was written by another process: reopened", self.directory)

    def count(self) -> int:
        """Number of chunks stored."""
        return int(self._collection.count())

    def ids_for_source(self, source: str) -> set[str]:
        """Ids of the chunks currently stored for ``source``."""
        got = self._collection.get(where={"source": source}, include=[])
        return set(got["ids"])

    def sources(self) -> set[str]:
        """All sources present in the index."""
        return _sources_in(self._collection.get(include=["metadatas"]))

    def upsert_source(
        self, source: str, chunks: Sequence[Chunk], progress: Progress | None = None
    ) -> tuple[int, int]:
        """Make the stored chunks of ``source`` exactly ``chunks``. Returns (added, removed).

        A chunk kept from before (same text, same id) takes its new position in the source:
        text inserted above it moves it down. ``progress`` is told the share of the new chunks
        embedded so far after each batch (a long file's bar moves while it is embedded).
        """
        wanted = {c.id: c for c in chunks}
        got = self._collection.get(where={"source": source}, include=["metadatas"])
        stored = dict(zip(got["ids"], got["metadatas"] or [{}] * len(got["ids"]), strict=True))
        existing = set(stored)
        # New chunks first, stale ones last: an interrupted or failed run (Ctrl-C, a full
        # disk, an embedding error) leaves the source's old chunks beside some new ones, never
        # a source half gone; the next run finishes the job.
        missing = [c for c in chunks if c.id not in existing]
        self._lexical_written = None  # written now: the BM25 side lists the ids again
        embedded = 0
        for batch in _batches(missing, EMBED_BATCH):
            self.store.add_texts(
                texts=[c.text for c in batch],
                metadatas=[{"source": c.source, "position": c.position} for c in batch],
                ids=[c.id for c in batch],
            )
            embedded += len(batch)
            if progress:
                progress(embedded / len(missing))
        moved = [
            c
            for c in chunks
            if c.id in stored and (stored[c.id] or {}).get("position") != c.position
        ]
        for batch in _batches(moved, WRITE_BATCH):  # a long file's chunks all move
            self._collection.update(
                ids=[c.id for c in batch],
                metadatas=[{**(stored[c.id] or {}), "position": c.position} for c in batch],
            )
        stale = sorted(existing - wanted.keys())
        self._delete(stale)  # (last: it notes this object's writes as seen)
        return len(missing), len(stale)

    def _delete(self, ids: Sequence[str]) -> None:
        """Delete chunks by id, in batches Chroma accepts."""
        self._lexical_written = None
        for batch in _batches(ids, WRITE_BATCH):
            self._collection.delete(ids=list(batch))
        self._seen = self._written()  # this object's own writes: nothing to reopen for

    def remove_source(self, source: str) -> int:
        """Delete every chunk of ``source``."""
        ids = sorted(self.ids_for_source(source))
        self._delete(ids)
        return len(ids)

    # --- what named paths reached through links (pruned once no longer reached) ----------
    def _reach_path(self) -> Path:  # a local index's (a server's index keeps none)
        return self.directory / f"reach-{self.collection_name}.json"

    def reach(self) -> dict[str, list[str]] | None:
        """The record of what each indexed path reached through links out of itself.

        None when there is none (an index made before the record) or it cannot be read (a
        warning).
        """
        path = self._reach_path()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring the unreadable link record %s: %s", path, exc)
            return None
        if not isinstance(data, dict) or not all(
            isinstance(v, list) and all(isinstance(e, str) for e in v) for v in data.values()
        ):
            log.warning("ignoring the link record %s: not a map of paths to lists", path)
            return None
        return {str(k): list(v) for k, v in data.items()}

    def save_reach(self, reach: dict[str, list[str]]) -> None:
        """Write the link record atomically (a read-only location: a warning, no record)."""
        from specrag.models.records import write_json

        path = self._reach_path()
        try:
            write_json(path, reach, sort_keys=True)
        except OSError as exc:
            log.warning("could not save the link record at %s: %s", path, exc)

    # --- lexical (BM25) and hybrid search --------------------------------------------------
    def _lexical_dir(self) -> Path:
        if not self.url:
            return self.directory / f"bm25-{self.collection_name}"
        from specrag.paths import cache_dir

        digest = hashlib.sha256(f"{self.url}|{self.collection_name}".encode()).hexdigest()[:16]
        return cache_dir() / "bm25" / digest

    def lexical(self) -> LexicalIndex:
        """The BM25 index of this collection, rebuilt when the collection's chunks changed."""
        with self._lexical_lock:
            return self._lexical_now()

    def _lexical_now(self) -> LexicalIndex:
        written = None if self.url else self._written()  # read before the ids: a write after
        if self._lexical is not None and written and written == self._lexical_written:
            return self._lexical  # ... it is seen next time
        # a stamp younger than the file system's time resolution may hide a later write of
        # the same size in the same tick (git's "racy" rule): not kept, the ids listed again
        if written and time.time_ns() - max(mtime for mtime, _ in written) < 2_000_000_000:
            written = None
        ids = [str(i) for i in self._collection.get(include=[])["ids"]]
        key = fingerprint(ids)
        if self._lexical is not None and self._lexical.key == key:
            self._lexical_written = written
            return self._lexical
        path = self._lexical_dir()
        loaded = LexicalIndex.load(path)
        if loaded is None or loaded.key != key:
            got: Any = self._collection.get(include=["documents"])
            loaded = LexicalIndex.build(
                [str(i) for i in got["ids"]], [str(d or "") for d in got["documents"] or []]
            )
            try:
                loaded.save(path)
            except OSError as exc:  # read-only location: keep it in memory only
                log.warning("could not persist the BM25 index at %s: %s", path, exc)
        self._lexical, self._lexical_written = loaded, written
        return loaded

    def refresh_lexical(self) -> None:
        """Bring the BM25 index in step with the collection now (after indexing/pruning)."""
        self.lexical()

    @staticmethod
    def _chunk(cid: Any, text: Any, meta: Any, score: float) -> Chunk:
        meta = meta or {}
        return Chunk(
            id=str(cid),
            source=str(meta.get("source", "")),
            text=str(text or ""),
            position=int(meta.get("position", 0) or 0),
            score=float(score),
        )

    def _by_id(self, ids: list[str], query_vec: list[float]) -> dict[str, Chunk]:
        """Chunks by id, scored by cosine similarity to ``query_vec`` (like dense hits)."""
        if not ids:
            return {}
        got: Any = self._collection.get(ids=ids, include=["documents", "metadatas", "embeddings"])
        out = {}
        for cid, doc, meta, emb in zip(
            got["ids"], got["documents"], got["metadatas"], got["embeddings"], strict=True
        ):
            score = 0.0
            if emb is not None:
                dot = sum(a * b for a, b in zip(query_vec, emb, strict=True))
                norm = (sum(a * a for a in query_vec) * sum(b * b for b in emb)) ** 0.5
                score = dot / norm if norm else 0.0
            out[str(cid)] = self._chunk(cid, doc, meta, score)
        return out

    def _dense(self, query_vec: list[float], k: int) -> list[Chunk]:
        hits = self.store.similarity_search_by_vector_with_relevance_scores(query_vec, k=k)
        return [  # Chroma returns cosine distances: similarity = 1 - distance
            self._chunk(doc.id, doc.page_content, doc.metadata, 1.0 - float(distance))
            for doc, distance in hits
        ]

    def search(self, query: str, k: int, mode: str = "dense") -> list[Chunk]:
        """Top-``k`` chunks, best first: the evidence after the last of :meth:`search_batches`."""
        evidence: list[Chunk] = []
        for batch in self.search_batches(query, k, mode):
            evidence = batch.after(evidence)
        return evidence

    def search_batches(self, query: str, k: int, mode: str = "dense") -> Iterator[Batch]:
        """Top-``k`` chunks as batches, most relevant first, each scored by cosine similarity.

        ``mode``: ``dense`` (embeddings), ``bm25`` (lexical), or ``hybrid``: both rankings
        (``max(10, 3k)`` deep) fused by reciprocal rank fusion; the query is embedded once.
        Batch 1 is the best hit of the first ranking (dense; bm25 alone: lexical), ready
        before the fusion; batch 2 the rest of the top ``k``. A hybrid batch 2 carries the
        fused ranking as the new evidence order (it may rank batch 1's hit lower, or drop it).
        """
        if mode not in ("dense", "bm25", "hybrid"):
            raise ValueError(f"unknown retrieval mode {mode!r} (dense, bm25, hybrid)")
        self._fresh()
        if self.count() == 0:
            return
        query_vec = self.store.embeddings.embed_query(query)  # type: ignore[union-attr]
        if mode == "bm25":
            lexical = [cid for cid, _ in self.lexical().search(query, k)]
            chunks = self._by_id(lexical, query_vec)
            ranked = [chunks[c] for c in lexical if c in chunks]
            yield from _first_then_rest("bm25", ranked)
            return
        depth = max(10, 3 * k) if mode == "hybrid" else k
        dense = self._dense(query_vec, depth)
        if mode == "dense" or not dense:
            yield from _first_then_rest("dense", dense[:k])
            return
        yield Batch("dense", dense[:1])
        lexical = [cid for cid, _ in self.lexical().search(query, depth)]
        fused = [cid for cid, _ in rrf([[c.id for c in dense], lexical])]
        known = {c.id: c for c in dense}
        known.update(self._by_id([c for c in fused[:k] if c not in known], query_vec))
        ranked = [known[c] for c in fused[:k] if c in known]
        yield Batch("hybrid", [c for c in ranked if c.id != dense[0].id], ranked)


@dataclass
class Batch:
    """Chunks a search delivers together; ``source`` names the ranking they come from.

    ``ranked``: the whole evidence in its new order when this batch re-ranks what came
    before (fusion); None when its chunks simply follow the earlier ones.
    """

    source: str
    chunks: list[Chunk]
    ranked: list[Chunk] | None = None

    def after(self, evidence: list[Chunk]) -> list[Chunk]:
        """The evidence once this batch has arrived (``evidence``: what came before)."""
        if self.ranked is not None:
            return list(self.ranked)
        seen = {c.id for c in evidence}
        return evidence + [c for c in self.chunks if c.id not in seen]


def _first_then_rest(source: str, ranked: list[Chunk]) -> Iterator[Batch]:
    """A ranking as two batches: its best hit, then the rest."""
    if ranked:
        yield Batch(source, ranked[:1])
    if ranked[1:]:
        yield Batch(source, ranked[1:])


def index_documents(
    index: VectorIndex,
    documents: Iterable[tuple[str, str]],
    *,
    token_length: Callable[[str], int],
    chunk_tokens: int = 200,
    overlap_tokens: int = 30,
    progress: Progress | None = None,
) -> IndexReport:
    """Index ``(source, text)`` pairs: chunk, embed what is new, drop what is stale."""
    splitter = make_splitter(token_length, chunk_tokens, overlap_tokens)
    report = IndexReport()
    for source, text in documents:
        chunks = split_document(source, text, splitter)
        done = report.files
        within = None if progress is None else lambda share: progress(done + share)
        added, removed = index.upsert_source(source, chunks, within)
        report.files += 1
        report.chunks_total += len(chunks)
        report.chunks_added += added
        report.chunks_removed += removed
        if progress:
            progress(report.files)  # a whole number: the bar's count reads it
    return report
