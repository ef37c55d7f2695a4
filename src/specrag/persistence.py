"""Durable conversation state for the CLI (``specrag ask --thread ID``): a SQLite checkpointer.

Every step of a run writes a checkpoint of the whole state (its question, evidence, a
``--document``'s text, the conversation so far), so a thread's file would grow by several
copies of all of it per question. Once a run has finished, :func:`keep_latest` drops the
thread's earlier checkpoints: the latest holds the conversation a follow-up needs, and an
interrupted run (the only one ``--resume`` can go on with) is never pruned.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from specrag.errors import DataDirError
from specrag.paths import data_dir

WRITABLE_HINT = " (set SPECRAG_DATA_DIR to a writable folder)"
log = logging.getLogger(__name__)


@asynccontextmanager
async def sqlite_checkpointer(check: bool = False) -> AsyncIterator[Any]:
    """An AsyncSqliteSaver on ``<data dir>/checkpoints.sqlite``, closed on exit.

    A data dir that cannot be made or written, or a file that is not a SQLite database: a
    one-line :class:`DataDirError` when it opens (the file is left as it is). ``check``: its
    pages are checked too (``PRAGMA quick_check``, milliseconds), since opening reads only its
    schema; a file damaged where the check did not look is the same line when a read meets it.
    """
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path = data_dir() / "checkpoints.sqlite"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where the folder should be, a read-only parent
        raise DataDirError(
            f"cannot use the data dir {path.parent}: {exc.strerror or exc}{WRITABLE_HINT}"
        ) from exc
    try:
        # Opened once here first: aiosqlite's own failed open queues its thread's stop without
        # waiting for it, and that thread then finds the event loop closed (a warning, or a
        # traceback at exit). A file SQLite cannot open never reaches aiosqlite.
        conn = sqlite3.connect(path)
        try:
            found = conn.execute("PRAGMA quick_check").fetchall() if check else [("ok",)]
        finally:
            conn.close()
        if found != [("ok",)]:
            raise sqlite3.DatabaseError(f"database disk image is damaged ({found[0][0]})")
    except sqlite3.Error as exc:
        raise _unusable(path, exc) from exc
    async with AsyncExitStack() as stack:
        try:
            saver = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(str(path)))
            await saver.setup()  # reads the file now: a corrupt one is told here, not mid-run
        except sqlite3.Error as exc:
            raise _unusable(path, exc) from exc
        try:
            yield saver
        except sqlite3.DatabaseError as exc:  # damaged pages a read met (a busy database,
            if isinstance(exc, sqlite3.OperationalError):  # OperationalError, is not damage)
                raise
            raise _unusable(path, exc) from exc


def _unusable(path: Path, exc: sqlite3.Error) -> DataDirError:
    if not os.access(path.parent, os.W_OK):  # a read-only folder, file or not
        return DataDirError(
            f"cannot use the data dir {path.parent}: it is not writable{WRITABLE_HINT}"
        )
    return DataDirError(
        f"cannot use the thread checkpoints at {path}: {exc} (move the file aside "
        "to start every thread over)"
    )


async def keep_latest(saver: Any, thread: str) -> None:
    """Drop every checkpoint and pending write of ``thread`` but its latest checkpoint.

    For a thread whose last run finished (nothing left to resume). The SQLite saver has no
    pruning of its own (LangGraph's ``aprune`` is not implemented for it), so this deletes the
    rows itself, under the saver's lock, in one transaction.
    """
    async with saver.lock, saver.conn.cursor() as cur:
        await cur.execute(
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' "
            "ORDER BY checkpoint_id DESC LIMIT 1",
            (thread,),
        )
        row = await cur.fetchone()
        if row is None:
            return
        for table in ("checkpoints", "writes"):
            await cur.execute(
                f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_id != ?",
                (thread, row[0]),
            )
        await saver.conn.commit()


@asynccontextmanager
async def thread_lock(
    thread: str, on_wait: Callable[[], None] | None = None
) -> AsyncIterator[None]:
    """Hold ``thread`` for one run: a second run on it waits until the first has finished.

    Two runs on one thread at once each read the conversation as it was when they started,
    and the one that ended last wrote the thread's state: the other's question and answer
    were lost, and its :func:`keep_latest` deleted the checkpoints of a run still going, so
    an interruption left nothing to ``--resume`` (a review, 2026-12-06). In turn, each run
    reads the one before it. A lock file per thread in the data dir (``locks/``), locked with
    ``flock``: across processes, and across runs in one process (each opens its own file).
    The wait polls, so it ends with Ctrl-C or a cancelled task; ``on_wait`` is called once
    when it starts. None where no lock can be had (no ``fcntl``, a file system without locks).
    """
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    name = hashlib.sha256(thread.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    path = data_dir() / "locks" / f"thread-{name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")  # noqa: SIM115 - held for the run
    except OSError as exc:
        raise DataDirError(
            f"cannot use the data dir {path.parent.parent}: {exc.strerror or exc}{WRITABLE_HINT}"
        ) from exc
    try:
        waited = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited and on_wait is not None:
                    on_wait()
                waited = True
                await asyncio.sleep(0.05)
            except OSError as exc:  # a file system without locks (some NFS, FUSE mounts)
                log.debug("no thread lock at %s: %s", path, exc)
                break
        yield
    finally:
        handle.close()  # unlocks
