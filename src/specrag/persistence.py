"""Durable conversation state for the CLI (``specrag ask --thread ID``): a SQLite checkpointer.

Every step of a run writes a checkpoint of the whole state (its question, evidence, a
``--document``'s text, the conversation so far), so a thread's file would grow by several
copies of all of it per question. Once a run has finished, :func:`keep_latest` drops the
thread's earlier checkpoints: the latest holds the conversation a follow-up needs, and an
interrupted run (the only one ``--resume`` can go on with) is never pruned.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from specrag.errors import DataDirError
from specrag.paths import data_dir

WRITABLE_HINT = " (set SPECRAG_DATA_DIR to a writable folder)"


@asynccontextmanager
async def sqlite_checkpointer() -> AsyncIterator[Any]:
    """An AsyncSqliteSaver on ``<data dir>/checkpoints.sqlite``, closed on exit.

    A data dir that cannot be made or written, or a file that is not a SQLite database: a
    one-line :class:`DataDirError` when it opens (the file is left as it is).
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
        sqlite3.connect(path).close()
    except sqlite3.Error as exc:
        raise _unusable(path, exc) from exc
    async with AsyncExitStack() as stack:
        try:
            saver = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(str(path)))
            await saver.setup()  # reads the file now: a corrupt one is told here, not mid-run
        except sqlite3.Error as exc:
            raise _unusable(path, exc) from exc
        yield saver


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
