"""Durable conversation state for the CLI (``specrag ask --thread ID``): a SQLite checkpointer."""

from __future__ import annotations

from typing import Any

from specrag.paths import data_dir


async def sqlite_checkpointer() -> Any:
    """An AsyncSqliteSaver on ``<data dir>/checkpoints.sqlite``."""
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path = data_dir() / "checkpoints.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = await aiosqlite.connect(str(path))
    return AsyncSqliteSaver(conn)
