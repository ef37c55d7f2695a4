"""Durable conversation state for the CLI (``specrag ask --thread ID``): a SQLite checkpointer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from specrag.paths import data_dir


@asynccontextmanager
async def sqlite_checkpointer() -> AsyncIterator[Any]:
    """An AsyncSqliteSaver on ``<data dir>/checkpoints.sqlite``, closed on exit."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path = data_dir() / "checkpoints.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        yield saver
