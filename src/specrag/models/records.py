"""A JSON file of small records by key: read whole, written atomically (stdlib only).

Used for what the cache dir remembers between processes (timed layout verdicts, GGUF
digests). An unreadable file or a record that is not an object counts as missing (the next
write keeps a copy of such a file aside as ``<name>.damaged-<time>-<random>``, with a
warning; one that cannot be
read now is left as it is); a write goes
to a temporary file first, then is renamed over the old one, so a reader never sees half a
file. Two processes writing at once may drop one's record, which only costs that record's
work again later (a timing, a hash; a converted copy unused for an hour may be pruned and
converted again); a failed write costs the same. (A thread's kept settings,
``<data dir>/threads.json``, are the exception: a lost record there makes ``--resume`` of that
thread start from the defaults and the flags given with it.) A file keeps at most
:attr:`Records.limit` records, the most recently written: keys name a model file's path and
mtime, so every reconverted or moved model adds new keys, and the file would otherwise grow
forever.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def positive(value: object) -> float | None:
    """``value`` as a float if it is a positive finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number if 0 < number < float("inf") else None


def write_json(path: Path, data: Any, **dumps: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (:func:`write_text`).

    ``dumps``: for ``json.dumps`` (``indent`` 1 unless given).
    """
    write_text(path, json.dumps(data, **{"indent": 1, **dumps}))


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a reader never sees half a file."""
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` a temporary file beside ``path``, then rename it over ``path``.

    An error (a folder that cannot be made, a full disk) is raised once the temporary is gone.
    """
    # per process and thread: two threads writing one file (a server's threads.json) never
    # share a temporary
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


class Records:
    """Records by key in the JSON file at ``path`` (created on the first :meth:`put`)."""

    def __init__(self, path: Path, limit: int = 256) -> None:
        self.path = path
        self.limit = limit  # records kept: a write beyond it drops the least recently written

    def _load(self) -> tuple[dict[str, Any] | None, bytes | None]:
        """Every record (None: the file could not be read now), and its bytes if damaged.

        Damaged: read, but not a JSON object. A file that could not be read (no file handle
        left, a disk error, no permission) is not known to be damaged: nothing is written.
        """
        try:
            raw = self.path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # no file (a file as its folder:
            return {}, None  # no records either - the write that follows says why)
        except OSError:
            return None, None
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested too deep
            return {}, raw
        return (data, None) if isinstance(data, dict) else ({}, raw)

    def read(self) -> dict[str, Any]:
        """Every record ({} when the file is missing, unreadable or not a JSON object)."""
        return self._load()[0] or {}

    def get(self, key: str) -> dict[str, Any] | None:
        """The record of ``key`` if there is one and it is a JSON object."""
        found = self.read().get(key)
        return found if isinstance(found, dict) else None

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Record ``record`` under ``key`` (best effort: an OSError only loses the record).

        ``key`` becomes the most recently written record; beyond :attr:`limit` records the
        least recently written are dropped.
        """
        loaded, damaged = self._load()
        if damaged is not None:  # read again: another writer may have started anew since
            loaded, damaged = self._load()
        if loaded is None:  # unreadable now: its records are not written over
            log.warning("%s could not be read now: %r not recorded", self.path, key)
            return
        data = loaded
        if damaged is not None:  # kept aside, not written over: its records may be worth
            # recovering. A copy of the bytes read, not the file moved: a good file another
            # writer put there since is not taken for the damaged one.
            stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
            aside = self.path.with_name(f"{self.path.name}.damaged-{stamp}")
            try:
                with open(aside, "xb") as f:
                    f.write(damaged)
            except OSError as exc:
                log.warning(
                    "%s is damaged and could not be kept aside (%s): %r not recorded",
                    self.path,
                    exc,
                    key,
                )
                return
            log.warning("%s could not be read: kept as %s, a new one started", self.path, aside)
        data.pop(key, None)  # a rewritten key moves to the end: the order is write order
        data[key] = record
        for old in list(data)[: max(0, len(data) - self.limit)]:
            del data[old]
        with contextlib.suppress(OSError):  # best effort: only the record is lost
            write_json(self.path, data)
