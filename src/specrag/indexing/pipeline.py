"""Indexing entry points used by the CLI and the demo."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from specrag.errors import InputError
from specrag.indexing.documents import (
    HIDDEN,
    PAGE_MARK,
    SUPPORTED_SUFFIXES,
    UNREADABLE,
    Skipped,
    Unreadable,
    collect_files_report,
    describe_skipped,
    folder_prefix,
    link_path,
    max_file_bytes,
    named_path,
    no_text_hint,
    read_records,
    source_name,
)
from specrag.indexing.store import (
    IndexReport,
    VectorIndex,
    check_local,
    check_recorded_model,
    index_documents,
)
from specrag.models.loading import EMBEDDED_LM, embedded_embeddings_path, load_embeddings
from specrag.paths import cache_dir

CHUNK_TOKENS = 200  # all-MiniLM-L6-v2 reads at most 256 word pieces
OVERLAP_TOKENS = 30
UNKNOWN_CHARS_PER_TOKEN = 4  # an unknown token counts as its text's characters / 4


@lru_cache(maxsize=2)
def embedding_token_length(name: str = EMBEDDED_LM) -> Callable[[str], int]:
    """Token counter of the embedding model (chunks must fit its window).

    An unknown token counts one per ``UNKNOWN_CHARS_PER_TOKEN`` characters of the text it
    stands for: the tokenizer reads a run it has no pieces for (a 192,000-character hex line,
    a Thai word) as one unknown token, and a whole file became one chunk - cut in the middle
    by the answer model. Text without unknown tokens counts as before.
    """
    from transformers import AutoTokenizer

    if name == EMBEDDED_LM:
        path = str(embedded_embeddings_path())
    else:  # a local folder as load_embeddings reads it ("~/models/minilm"), else a hub id
        local = Path(name).expanduser()
        path = str(local) if local.exists() else name
    tok = AutoTokenizer.from_pretrained(path)
    unknown = tok.unk_token_id

    def length(text: str) -> int:
        got = tok(text, add_special_tokens=False, return_offsets_mapping=unknown is not None)
        ids = got["input_ids"]
        if unknown is None or unknown not in ids:
            return len(ids)
        spans = got["offset_mapping"]
        return len(ids) + sum(
            max(0, math.ceil((end - start) / UNKNOWN_CHARS_PER_TOKEN) - 1)
            for i, (start, end) in zip(ids, spans, strict=True)
            if i == unknown
        )

    return length


log = logging.getLogger(__name__)

_HELD: dict[str, int] = {}  # lock files this process holds, and how deep (re-entered)
_HELD_GUARD = threading.RLock()  # one writer thread at a time in a process, as across them


@contextlib.contextmanager
def writing_lock(
    directory: Path, collection: str, url: str = "", on_wait: Callable[[], None] | None = None
) -> Iterator[None]:
    """Hold the local index's writer lock for ``collection`` (re-entrant in a process).

    Two ``specrag index`` runs on one index at once undid each other's work: the one that
    ended last pruned a file the other had just added, and put back the old text of a file
    the other had re-indexed (both said they succeeded); two creating a new index at once
    failed one ("table collections already exists"). The lock covers reading the files
    through pruning. ``on_wait`` is called once when another process holds it (the caller
    says so); the wait then lasts until that process ends its run. The lock file lies in the
    cache dir: other users' and other machines' runs are not seen. Writers in one process
    take turns too (one thread at a time). None where no lock can be had: a Chroma server's
    index (``url``), a platform without ``fcntl``, a cache dir that refuses the lock file or
    a file system without locks.
    """
    with _HELD_GUARD:  # re-entrant: a thread that holds it may enter again
        held = _locked(directory, collection, url, on_wait)
        try:
            yield
        finally:
            if held is not None:
                _release(held)


def _lock_path(directory: Path, collection: str) -> Path:
    """The lock file of ``collection`` in the index at ``directory`` (named by its real path)."""
    index_path = Path(directory).expanduser().resolve()
    name = hashlib.sha256(f"{index_path}\0{collection}".encode()).hexdigest()[:24]
    return cache_dir() / "locks" / f"index-{name}.lock"


def _locked(directory: Path, collection: str, url: str, on_wait: Callable[[], None] | None) -> Any:
    """The open lock file, locked (this process's count raised); None where there is none."""
    try:
        import fcntl
    except ImportError:  # Windows
        return None
    if url:
        return None
    path = _lock_path(directory, collection)
    key = str(path)
    if _HELD.get(key):  # this process holds it already (the CLI, then index_records)
        _HELD[key] += 1
        return key
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")  # noqa: SIM115 - held until _release
    except OSError as exc:
        log.debug("no writer lock at %s: %s", path, exc)
        return None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)  # Ctrl-C ends the wait
    except OSError as exc:  # a file system without locks (some NFS, FUSE mounts)
        handle.close()
        log.debug("no writer lock at %s: %s", path, exc)
        return None
    except BaseException:
        handle.close()
        raise
    _HELD[key] = 1
    return (key, handle)


def _release(held: Any) -> None:
    """Undo one :func:`_locked` (the last one unlocks and closes the file)."""
    import fcntl

    if isinstance(held, str):  # re-entered
        _HELD[held] -= 1
        return
    key, handle = held
    _HELD.pop(key, None)
    try:
        fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        handle.close()


def open_for_writing(
    directory: Path, collection: str, embedding_model: str, url: str = ""
) -> VectorIndex:
    """Open (creating if needed) an index for indexing (on the Chroma server at ``url``)."""
    check_local(directory, collection, url, create=True)  # a bad name: before the model loads
    check_recorded_model(directory, collection, url, embedding_model)  # another model's index
    return VectorIndex(
        directory,
        load_embeddings(embedding_model),
        collection,
        create=True,
        url=url,
        embedding_model=embedding_model,
    )


@dataclass
class Loaded:
    """What ``specrag index`` read: records, the files they came from, and what it skipped."""

    records: list[tuple[str, str]]
    files: list[str]
    skipped: list[Skipped] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    """The real paths of the folders walked (a linked folder's target among them)."""
    reach: dict[str, list[str]] = field(default_factory=dict)
    """Per named path, what it reached through links out of itself (:func:`index_records`)."""
    reach_incomplete: list[str] = field(default_factory=list)
    """The named folders whose walk could not read all (they keep what they reached)."""
    lapsed: list[tuple[Skipped, InputError]] = field(default_factory=list)
    """Files named explicitly that hold no text now (binary or empty), with their error
    (``load_files(lapsed_ok=True)``; :func:`lapsed_sources` prunes them if indexed)."""

    def __iter__(self) -> Iterator[tuple[str, str]]:
        """The records (so ``index_records(load_files(paths), ...)`` keeps working)."""
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)


def load_files(paths: Iterable[str], empty_ok: bool = False, lapsed_ok: bool = False) -> Loaded:
    """Read every file first, so a bad input fails before the index is touched.

    A file named explicitly must be readable (one-line ``InputError``); a file found in a
    folder that is unreadable, empty or of another type is skipped and reported instead.
    No text at all is :func:`no_text` unless ``empty_ok`` (a re-index of folders whose files
    were all deleted or replaced must still prune them). With ``lapsed_ok`` a named file that
    is read but holds no text now (binary content, empty) is kept in ``lapsed`` with its error,
    not raised: the caller prunes what the index holds of it (:func:`lapsed_sources`).
    """
    paths = list(paths)
    max_file_bytes()  # a bad SPECRAG_MAX_FILE_MIB fails the run, not each file (no pruning)
    found = collect_files_report(paths)
    named = {Path(p).expanduser().resolve() for p in paths if not Path(p).expanduser().is_dir()}
    out = Loaded([], [], found.skipped, found.folders, found.reach, found.incomplete)
    files = found.files
    owner: dict[str, Path] = {}  # source -> the file read under it
    for f in files:
        try:
            records = [(source, text) for source, text in read_records(f) if text.strip()]
            # two names, one source: a name that is not UTF-8 (``a\xff.txt``, its byte shown
            # as \xNN) reads as a UTF-8 name spelt so; indexed, one replaced the other
            if clash := next((s for s, _ in records if owner.get(s, f) != f), None):
                raise Unreadable(
                    f"its name reads as the source of {owner[clash]} ({clash}): rename one: {f}"
                )
        except InputError as exc:
            if f in named and (isinstance(exc, Unreadable) or not lapsed_ok):
                raise
            why = f"{UNREADABLE}: {exc}" if isinstance(exc, Unreadable) else str(exc)
            why = why.removesuffix(f": {f}")  # the entry names the path already
            if f in named:
                out.lapsed.append((Skipped(str(f), why), exc))
            else:
                out.skipped.append(Skipped(str(f), why))
            continue
        if not records:
            hint = no_text_hint(f)  # one line: was a warning ("none of its pages has no
            # text", which said the opposite) beside the error
            empty = f"empty (no text; {hint})" if hint else "empty (no text)"
            if f in named:
                error = InputError(f"no text in {f}" + (f" ({hint})" if hint else ""))
                if not lapsed_ok:
                    raise error
                out.lapsed.append((Skipped(str(f), empty), error))
                continue
            out.skipped.append(Skipped(str(f), empty))
            continue
        out.records.extend(records)
        out.files.append(str(f))
        owner.update((source, f) for source, _ in records)
    if not out.records and not empty_ok:
        raise no_text(out.skipped)
    return out


def lapsed_sources(loaded: Loaded, held: set[str]) -> tuple[list[str], list[Skipped]]:
    """What the index (``held``: its sources) holds of ``loaded``'s lapsed named files.

    Returns the entries to remove (:func:`forget_entries`: the file's source, a PDF's pages)
    and a skipped entry per file saying so. A lapsed file the index holds nothing of is its
    own error (``not a text file``, ``no text in``), as before: a file named by mistake.
    """
    gone: list[str] = []
    skipped: list[Skipped] = []
    for entry, error in loaded.lapsed:
        try:
            gone += forget_entries([entry.path], held)
        except InputError:
            raise error from None
        skipped.append(Skipped(entry.path, f"{entry.reason}: removed from the index"))
    return gone, skipped


def no_text(skipped: list[Skipped]) -> InputError:
    """The error of an ``index`` run that found no text to index (and nothing to prune)."""
    shown = describe_skipped(skipped, 3)
    why = f" (skipped {len(skipped)}: {shown})" if skipped else ""
    kinds = "/".join(SUPPORTED_SUFFIXES)
    return InputError(f"no {kinds} text found in the given paths{why}")


def kept_paths(skipped: Iterable[Skipped], paths: Iterable[str] = ()) -> list[str]:
    """The skipped files and folders that are still there (unreadable, hidden), as sources.

    A re-index keeps their indexed sources instead of pruning them as gone. A hidden entry is
    named as it is, not as what it links to (``.latest -> v2`` must not keep ``v2``'s vanished
    files), and one that is also among the named ``paths`` (walked there) keeps nothing.
    """
    named = {str(Path(p).expanduser().resolve()) for p in paths}
    out = []
    for s in skipped:
        if not s.still_there:
            continue
        path = Path(s.path).expanduser()
        if s.reason == HIDDEN:
            path = path.parent.resolve() / path.name
            if str(path) in named or str(path.resolve()) in named:
                continue
        else:  # an unreadable file is indexed under its real path
            path = path.resolve()
        out.append(source_name(path))
    return out


def prune_prefixes(paths: Iterable[str], folders: Iterable[str] = ()) -> list[str]:
    """Source prefixes whose sources a re-index of ``paths`` replaces.

    A folder's files (those gone from it are dropped), and a named PDF's pages (``x.pdf#page=``:
    pages it no longer has, or that lost their text, are dropped). A named text file is one
    source, replaced whole. ``folders``: the real folders the walk entered (:class:`Loaded`),
    so files reached through a link out of a named folder are pruned when gone too.
    """
    out = []
    for p in paths:
        path = Path(p).expanduser()
        if path.is_dir():
            out.append(folder_prefix(path.resolve()))
        elif path.suffix.lower() == ".pdf":
            out.append(f"{source_name(path.resolve())}{PAGE_MARK}")
    for real in folders:
        prefix = folder_prefix(real)
        if not prefix.startswith(tuple(out)):
            out.append(prefix)
    return out


def forget_entries(paths: Iterable[str], held: set[str]) -> list[str]:
    """What the index (``held``: its sources) holds of ``paths``, gone from disk or not.

    Per path (``~`` expanded, links followed as far as they lead), its source as a file (and
    its PDF pages) and its prefix as a folder. A path of which the index holds nothing is a
    one-line ``InputError``, before anything is removed: a typo never removes.
    """
    out = []
    for p in paths:
        real = os.path.realpath(named_path(p))
        found = []
        for entry in (source_name(real), folder_prefix(real)):  # a file (and pages), a folder
            holds = _Held([entry])
            if any(source in holds for source in held):
                found.append(entry)
        if not found:
            raise InputError(
                f"the index holds nothing of {p} (looked for as source {source_name(real)})"
            )
        named = named_path(p)
        if named.is_symlink():  # a named link's record goes too (:func:`collect_files_report`;
            link = link_path(named)  # a folder's or a file's: a broken link is neither now)
            found += [folder_prefix(link), source_name(link)]
        out += found
    return out


def _depth(source: str, prefixes: Iterable[str]) -> int:
    """Length of the longest of ``prefixes`` that ``source`` lies under (0: none).

    A page prefix (``x.pdf#page=``) holds only the pages of that PDF (``x.pdf#page=2``), not
    a file named ``x.pdf#page=2.md`` beside it.
    """
    best = 0
    for prefix in prefixes:
        if not source.startswith(prefix):
            continue
        if prefix.endswith(PAGE_MARK) and not source[len(prefix) :].isdigit():
            continue
        best = max(best, len(prefix))
    return best


BEFORE_RECORD = ""  # the link record's key of the sources indexed before it began


class _Held:
    """Sources held by record entries: a source, its PDF pages, all under a folder prefix."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.exact: set[str] = set()
        self.folders: set[str] = set()
        for entry in entries:
            (self.folders if entry.endswith(os.sep) else self.exact).add(entry)

    def __bool__(self) -> bool:
        return bool(self.exact or self.folders)

    def __contains__(self, source: str) -> bool:
        if source in self.exact:
            return True
        base, mark, page = source.rpartition(PAGE_MARK)
        if mark and page.isdigit() and base in self.exact:
            return True
        cut = source.find(os.sep)
        while cut != -1 and self.folders:  # each folder the source lies in, shallowest first
            if source[: cut + 1] in self.folders:
                return True
            cut = source.find(os.sep, cut + 1)
        return False


@dataclass
class _LinkPlan:
    """What a run's links no longer reach (``unlinked``), what stays held, the new record."""

    unlinked: _Held
    held: _Held
    record: dict[str, list[str]]
    now: dict[str, list[str]]  # this run's keys
    dropped: set[str]  # keys of folders named under one this run walked: its walk covers them


def _plan_links(
    recorded: Mapping[str, Sequence[str]],
    reach: Mapping[str, Sequence[str]],
    incomplete: Iterable[str],
    forgotten: Iterable[str] = (),
) -> _LinkPlan:
    """Compare this run's reach with the record (see :func:`index_records`)."""
    now = {key: sorted(entries) for key, entries in reach.items()}
    for key in incomplete:  # a walk that could not read all keeps what it reached before
        now[key] = sorted({*now.get(key, []), *recorded.get(key, [])})
    walked = [key for key in now if key.endswith(os.sep)]
    gone = _Held(forgotten)
    dropped = {
        key
        for key in recorded
        if key
        and key not in now
        and (
            # a named link under a walked folder is not covered by that walk where the walk
            # skips it (a hidden link): its record stays while the link is there
            (
                any(key.startswith(folder) for folder in walked)
                and not os.path.islink(key.rstrip(os.sep))
            )
            or key in gone
        )
    }
    record = {k: list(v) for k, v in {**recorded, **now}.items() if k not in dropped}
    still = {e for entries in now.values() for e in entries}
    before = [e for key in [*now, *dropped] for e in recorded.get(key, [])]
    unlinked = _Held(e for e in before if e not in still)
    held = _Held([*(k for k in record if k), *(e for v in record.values() for e in v)])
    return _LinkPlan(unlinked, held, record, now, dropped)


def index_records(
    records: list[tuple[str, str]],
    directory: Path,
    *,
    collection: str = "specrag",
    embedding_model: str = EMBEDDED_LM,
    progress: Callable[[float], None] | None = None,
    prune_roots: Iterable[str] = (),
    keep: Iterable[str] = (),
    url: str = "",
    index: VectorIndex | None = None,
    reach: Mapping[str, Sequence[str]] | None = None,
    reach_incomplete: Iterable[str] = (),
    gone: Iterable[str] = (),
) -> IndexReport:
    """Index ``(source, text)`` records.

    Sources that start with a ``prune_roots`` prefix (:func:`prune_prefixes`) and are not
    among the records are dropped, but for those of the files and folders in ``keep``
    (:func:`kept_paths`, sources: there, but not read this time), which stay as they were
    indexed - unless a named folder deeper than the kept one holds them (it was walked).
    ``index``: the index already opened with :func:`open_for_writing` (else opened here).

    ``reach`` (:attr:`Loaded.reach`): what each named path reached through links out of
    itself this time (``reach_incomplete``: named folders whose walk could not read all, which
    keep what they reached before). What one reached last time (the index's record) and no
    longer does - a link removed or pointed elsewhere - is dropped too, but for what a path of
    another run holds or reaches (indexed in its own right), and for what the index held
    before its record began (who indexed it, and why, is not known). The record is read just
    before pruning and saved after it (merged with one another run saved meanwhile), so a run
    cut short leaves it for the next one. A Chroma server's index keeps no record (it would be
    one machine's): nothing is pruned for links there.

    ``gone`` (:func:`forget_entries`): sources (their PDF pages too) and folder prefixes to
    forget (``specrag index --forget``): what the index holds of them is dropped, and so is
    what they reached through links (unless held otherwise). Runs under the index's writer
    lock (:func:`writing_lock`).
    """
    with writing_lock(directory, collection, url):
        return _index_records(
            records,
            directory,
            collection=collection,
            embedding_model=embedding_model,
            progress=progress,
            prune_roots=prune_roots,
            keep=keep,
            url=url,
            index=index,
            reach=reach,
            reach_incomplete=reach_incomplete,
            gone=gone,
        )


def _index_records(
    records: list[tuple[str, str]],
    directory: Path,
    *,
    collection: str,
    embedding_model: str,
    progress: Callable[[float], None] | None,
    prune_roots: Iterable[str],
    keep: Iterable[str],
    url: str,
    index: VectorIndex | None,
    reach: Mapping[str, Sequence[str]] | None,
    reach_incomplete: Iterable[str],
    gone: Iterable[str],
) -> IndexReport:
    if index is None:
        index = open_for_writing(directory, collection, embedding_model, url)
    if index.url:
        reach = None
    roots = list(prune_roots)
    kept = set(keep)  # sources, as kept_paths names them
    kept_prefixes = [k + end for k in kept for end in (os.sep, PAGE_MARK)]
    first: dict[str, list[str]] = {}
    if reach is not None:
        recorded = index.reach()
        if recorded is None:  # the record begins: what is there stays
            before = sorted(index.sources())
            first = {BEFORE_RECORD: before} if before else {}
        # saved before any text is written: a run cut short must not leave what it wrote to be
        # taken for "there before the record" (held for good, its links never pruned), and
        # with what this run reaches, so that one cut short after a link was added leaves its
        # target for the next run to prune once the link goes (the final record, saved after
        # pruning, replaces this one)
        base = first if recorded is None else recorded
        grown = {
            **base,
            **{key: sorted({*base.get(key, []), *entries}) for key, entries in reach.items()},
        }
        if recorded is None or grown != base:
            index.save_reach(grown)
    report = index_documents(  # new text first: an interrupted run loses nothing
        index,
        records,
        token_length=embedding_token_length(embedding_model),
        chunk_tokens=CHUNK_TOKENS,
        overlap_tokens=OVERLAP_TOKENS,
        progress=progress,
    )
    plan = None
    if reach is not None:
        recorded = index.reach()
        plan = _plan_links(first if recorded is None else recorded, reach, reach_incomplete, gone)
    removed: list[str] = []
    pruned = 0  # chunks of sources no longer there (a renamed file's old name)
    forgotten = _Held(gone)
    if roots or (plan and plan.unlinked) or forgotten:
        present = {source for source, _ in records}
        # what a forgotten path reached through links before the path's own sources: a run
        # cut short between them is finished by the same `--forget` again, which finds the
        # path in the index still (it found nothing of it, and the targets stayed for good)
        for source in sorted(index.sources(), key=lambda source: (source in forgotten, source)):
            if source in present or source in kept:
                continue
            # under a named (or walked) folder, and not under a deeper folder left unread
            root = _depth(source, roots)
            deeper_kept = _depth(source, kept_prefixes)
            if (
                (root and root > deeper_kept)
                or source in forgotten
                or (
                    plan and not deeper_kept and source in plan.unlinked and source not in plan.held
                )
            ):
                pruned += index.remove_source(source)
                removed.append(source)
    if plan is not None:  # on top of what another run may have saved meanwhile
        latest = index.reach()
        base = plan.record if latest is None else {**latest, **plan.now}
        final = {k: v for k, v in base.items() if k not in plan.dropped}
        if BEFORE_RECORD in final:
            dropped_now = set(removed)
            final[BEFORE_RECORD] = [s for s in final[BEFORE_RECORD] if s not in dropped_now]
            if not final[BEFORE_RECORD]:
                del final[BEFORE_RECORD]
        if final != latest:
            index.save_reach(final)
    report.sources_removed = removed
    report.chunks_removed += pruned
    report.index_chunks = index.count()
    index.refresh_lexical()  # BM25 in step with what was just indexed or pruned
    return report
