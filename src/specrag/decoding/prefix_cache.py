"""Reusing a long document's KV cache across questions - and across processes.

Prompts are laid out document-first, so every question about the same document shares the
token prefix ``[chat head + document]``. The first question pays the prefill; later ones clone
the cached prefix and prefill only the question. Entries are keyed by model identity and a hash
of the prefix tokens, and bounded by total bytes (least recently used goes first; an entry
larger than the whole budget is not kept, a budget of 0 keeps nothing). In memory an entry
lives on its model's device (GPU memory on CUDA), beside the copy the running answer extends.

With ``disk_dir`` the entries also persist on disk (one file per entry, written atomically in a
background thread that the interpreter waits for at exit; LRU-bounded by bytes), so a repeated
question in a NEW process (each ``specrag ask`` call is one) skips the document prefill too.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specrag.decoding.state import LMState, kv_shapes

log = logging.getLogger(__name__)


TMP = ".tmp"  # a file being written is <entry>.kv.tmp<pid>.<thread>
# one disk write at a time in a process: two writers of one entry (a partial prefix, then the
# whole one) checked the file's length, then replaced it in either order - the shorter one
# could win
_DISK_WRITES = threading.Lock()


def _holds_at_least(path: Path, n_tokens: int) -> bool:
    """Whether the entry at ``path`` holds ``n_tokens`` tokens or more (unreadable: no)."""
    if not path.is_file():
        return False
    try:  # mmap: only the token list is read, not the (hundreds of MB of) tensors
        old = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return len(old["tokens"]) >= n_tokens
    except Exception:  # noqa: BLE001 - unreadable: overwrite it
        return False


def prefix_key(model_key: str, prefix: list[int]) -> str:
    """Cache key of a token prefix for one model."""
    digest = hashlib.sha256(",".join(map(str, prefix)).encode()).hexdigest()
    return f"{model_key}:{len(prefix)}:{digest}"


def kv_checksum(tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    """CRC-32 of a saved prefix: its tokens, each tensor's dtype, shape and bytes.

    PyTorch's zip reader checks no CRC: without this, flipped bits in a file's tensors would
    load as a hit and change the answer (~0.2 s per 400 MB; the prefill it saves takes ~15 s).
    """
    crc = zlib.crc32(",".join(map(str, tokens)).encode())
    for pair in kv:
        for tensor in pair:
            crc = zlib.crc32(f"{tensor.dtype}{tuple(tensor.shape)}".encode(), crc)
            data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            crc = zlib.crc32(data.data, crc)
    return crc


def _copy(state: LMState, key: str) -> LMState | None:
    """A clone of ``state``, or None where the device has no room for one.

    Entries live on the model's device: a GPU that a long document's KV nearly fills can
    refuse the copy. A cache never fails a run: the prefix is not kept, or the hit is a miss.
    """
    try:
        return state.clone()
    except torch.OutOfMemoryError:
        log.warning("prefix cache: no device memory to copy %s; not cached", key[:60])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


class PrefixCache:
    """LRU of prefilled :class:`LMState` prefixes, bounded in bytes; optionally on disk too."""

    def __init__(
        self,
        max_bytes: int = 4 * 2**30,
        disk_dir: Path | str | Callable[[], Path] | None = None,
        disk_max_bytes: int = 8 * 2**30,
    ) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, LMState] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.disk_hits = 0
        self._disk_dir = disk_dir  # a callable is resolved at use (env may change meanwhile)
        self.disk_max_bytes = disk_max_bytes
        self._writers: list[threading.Thread] = []
        self._exiting = False  # flush_at_exit ran: a later put writes on its own thread

    def limit(self, max_bytes: int, disk_max_bytes: int) -> None:
        """Set both budgets (bytes; 0 = keep nothing there) and evict down to them now."""
        if max_bytes < 0 or disk_max_bytes < 0:
            raise ValueError("prefix cache budgets must be >= 0 bytes")
        if (max_bytes, disk_max_bytes) == (self.max_bytes, self.disk_max_bytes):
            return
        with self._lock:
            self.max_bytes, self.disk_max_bytes = max_bytes, disk_max_bytes
            self._evict()
        try:  # a cache dir this user cannot search (is_dir raises EACCES) never fails a run
            if self.disk_dir is not None and self.disk_dir.is_dir():
                self._prune_disk()
        except OSError as exc:
            log.warning("prefix cache: could not prune %s: %s", self.disk_dir, exc)

    def get(
        self, key: str, model: Any = None, *, memory: int | None = None, disk: int | None = None
    ) -> LMState | None:
        """A private clone of the cached prefix, or None.

        ``model`` lets a miss in memory be served from disk (the state needs its model).
        ``memory``/``disk``: this caller's own bounds (bytes, within the cache's; 0 = it reads
        nothing there): a disk hit is kept in memory only within both.
        """
        entry = None
        if memory != 0:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
        if disk == 0:
            model = None
        if entry is not None:
            if self.disk_dir is not None:  # its file is the most recently used on disk too
                with contextlib.suppress(OSError):  # not on disk, or a read-only cache dir
                    os.utime(self._path(key))
            if (copy := _copy(entry, key)) is not None:
                with self._lock:
                    self.hits += 1
                return copy
            with self._lock:  # no room for a copy on the device: the memory goes back
                self._entries.pop(key, None)
        elif model is not None and (state := self._read(key, model)) is not None:
            with self._lock:
                self.disk_hits += 1
                self.hits += 1
                mem_max = self.max_bytes if memory is None else min(memory, self.max_bytes)
                if state.nbytes() > mem_max:  # not kept in memory: the caller's own
                    return state
                self._entries[key] = state
                self._evict()
            if (copy := _copy(state, key)) is not None:
                return copy
            with self._lock:
                self._entries.pop(key, None)
            return state  # the only copy: the caller's own
        with self._lock:
            self.misses += 1
        return None

    def put(
        self,
        key: str,
        state: LMState,
        *,
        memory: int | None = None,
        disk: int | None = None,
    ) -> None:
        """Keep ``state`` as the prefix of ``key`` (or a start of it), where it fits a budget.

        A clone in memory, its tensors on disk. A partial prefix (a budget stopped its
        prefill) is continued by the next caller. A cache holding more than keys and values
        (linear-attention state) is not saved to disk. ``memory``/``disk``: this caller's own
        bounds (bytes; 0 = keeps nothing there), within the cache's.
        """
        size = state.nbytes() if len(state) else 0  # 0: nothing worth keeping
        mem_max = self.max_bytes if memory is None else min(memory, self.max_bytes)
        disk_max = self.disk_max_bytes if disk is None else min(disk, self.disk_max_bytes)
        keep = 0 < size <= mem_max
        kv = None
        if self.disk_dir is not None and 0 < size <= disk_max:
            try:  # references: a plain cache layer replaces its tensors, never writes in them
                kv = state.kv_tensors()
            except ValueError as exc:
                log.debug("prefix cache: not saving %s: %s", key, exc)
        snapshot = _copy(state, key) if keep else None
        with self._lock:
            if snapshot is not None:
                self._entries[key] = snapshot
                self._entries.move_to_end(key)
                self._evict()
        if kv is not None and self._exiting:  # a thread started now would outlive the
            self._write(key, list(state.tokens), kv)  # flush: killed at exit, it aborts
        elif kv is not None:
            writer = threading.Thread(
                target=self._write,
                args=(key, list(state.tokens), kv),
                name="specrag-prefix-write",
                daemon=True,  # waited for at exit by flush_at_exit; Ctrl-C there abandons it
            )
            writer.start()
            with self._lock:  # two threads' puts at once: neither writer is lost to the flush
                self._writers = [w for w in self._writers if w.is_alive()] + [writer]

    @property
    def disk_dir(self) -> Path | None:
        """The directory entries persist in, or None (memory only)."""
        if callable(self._disk_dir):
            return self._disk_dir()
        return Path(self._disk_dir) if self._disk_dir else None

    def flush(self) -> None:
        """Wait for pending disk writes."""
        with self._lock:
            writers = list(self._writers)
        for writer in writers:
            writer.join()

    def flush_at_exit(self) -> None:
        """:meth:`flush` at interpreter exit.

        Ctrl-C abandons the writes (a writer's temporary file is pruned later) instead of
        printing a traceback. A put after it (a decode the model thread finishes while exit
        waits for it: its atexit handler may run after this one) writes before it returns: a
        writer thread started then was killed inside torch and aborted the process
        ("terminate called without an active exception", exit 134).
        """
        self._exiting = True
        with contextlib.suppress(KeyboardInterrupt):
            self.flush()

    def _evict(self) -> None:
        while self._entries and self.nbytes() > self.max_bytes:
            self._entries.popitem(last=False)

    def _path(self, key: str) -> Path:
        directory = self.disk_dir
        assert directory is not None
        return directory / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".kv")

    def _write(
        self, key: str, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        try:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            with _DISK_WRITES:
                # written before: only a longer partial prefix replaces a shorter one
                if _holds_at_least(path, len(tokens)):
                    os.utime(path)
                    return self._on_disk(key, len(tokens))
                kv = [(k.cpu(), v.cpu()) for k, v in kv]
                tmp = path.with_name(f"{path.name}{TMP}{os.getpid()}.{threading.get_ident()}")
                try:
                    crc = kv_checksum(tokens, kv)
                    torch.save({"key": key, "tokens": tokens, "kv": kv, "crc": crc}, tmp)
                    if tmp.stat().st_size > self.disk_max_bytes:  # the file's own bytes: no room
                        return
                    if not _holds_at_least(path, len(tokens)):  # another process's, meanwhile
                        os.replace(tmp, path)  # atomic: a reader never sees half a file
                finally:
                    tmp.unlink(missing_ok=True)  # a failed write (disk full) leaves nothing
            self._on_disk(key, len(tokens))
            self._prune_disk()
        except Exception as exc:  # noqa: BLE001 - a cache must never fail a run
            log.warning("prefix cache: could not write to %s: %s", self.disk_dir, exc)

    def _on_disk(self, key: str, length: int) -> None:
        """A prefix of ``length`` tokens is on disk: a shorter start in memory must not hide it.

        Dropped once the file is there, not when the write began: a write that gives up (no
        room, a full disk) leaves the start in memory, the only copy then.
        """
        with self._lock:
            kept = self._entries.get(key)
            if kept is not None and len(kept) < length:
                self._entries.pop(key)

    def _read(self, key: str, model: Any) -> LMState | None:
        if self.disk_dir is None:
            return None
        path = self._path(key)
        try:  # is_file too: a folder this user cannot search raises (PermissionError)
            if not path.is_file():
                return None
            inode = path.stat().st_ino
            data = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, MemoryError) as exc:  # pruned meanwhile, or no room now: a miss, kept
            log.info("prefix cache: could not read %s: %s", path.name, exc)
            return None
        except Exception as exc:  # noqa: BLE001 - a damaged file
            self._drop(path, inode, exc)
            return None
        try:  # the model's cache shapes, from a pass of its own: a failure there (device
            kv_shapes(model)  # memory) says nothing of the file, which is kept
        except Exception as exc:  # noqa: BLE001 - a cache must never fail a run
            log.warning("prefix cache: could not check %s: %s", path.name, exc)
            return None
        try:
            if data.get("key") != key:  # its name is this key's hash: a damaged key, removed
                raise ValueError("the key it holds is not its name's")  # (else never rewritten)
            if data.get("crc") != kv_checksum(data["tokens"], data["kv"]):
                raise ValueError(
                    "its checksum does not match (damaged, or written by an older version)"
                )
            LMState.check_kv(model, data["tokens"], data["kv"])
        except Exception as exc:  # noqa: BLE001 - not this model's shapes: a miss, removed
            self._drop(path, inode, exc)
            return None
        try:  # a sound entry that cannot be placed now (device memory) is a miss, and kept
            state = LMState.from_kv(model, data["tokens"], data["kv"])
        except Exception as exc:  # noqa: BLE001 - a cache must never fail a run
            log.warning("prefix cache: could not load %s: %s", path.name, exc)
            return None
        try:
            os.utime(path)  # most recently used
        except OSError:  # pruned by another process meanwhile: the state is still good
            pass
        return state

    @staticmethod
    def _drop(path: Path, inode: int, why: Exception) -> None:
        """Remove an unreadable entry, unless another process has replaced it since."""
        log.warning("prefix cache: dropping unreadable %s: %s", path.name, why)
        with contextlib.suppress(OSError):  # gone, or a read-only cache dir (a miss)
            if path.stat().st_ino == inode:  # a fresh entry written meanwhile stays
                path.unlink()

    def _prune_disk(self) -> None:
        """Remove least recently used files until the directory fits ``disk_max_bytes``."""
        directory = self.disk_dir
        assert directory is not None
        stale = time.time() - 3600  # a writer's temporary file, left by a killed process
        for tmp in directory.glob(f"*.kv{TMP}*"):
            try:
                if tmp.stat().st_mtime < stale:
                    tmp.unlink(missing_ok=True)
            except OSError:  # gone meanwhile, or a read-only directory
                continue
        files = []
        for path in directory.glob("*.kv"):
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.disk_max_bytes:
                break
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # a read-only cache dir: a cache must never fail a run
                log.warning("prefix cache: could not prune %s: %s", path, exc)
                return
            total -= size

    def nbytes(self) -> int:
        """Bytes held in memory by all entries."""
        return sum(e.nbytes() for e in self._entries.values())

    def clear(self) -> None:
        """Drop every entry in memory (disk files stay)."""
        with self._lock:
            self._entries.clear()


def default_disk_dir() -> Path:
    """Where the process-wide cache persists: ``<cache dir>/prefix-kv``."""
    from specrag.paths import cache_dir

    return cache_dir() / "prefix-kv"


DEFAULT_PREFIX_CACHE = PrefixCache(disk_dir=default_disk_dir)
atexit.register(DEFAULT_PREFIX_CACHE.flush_at_exit)
