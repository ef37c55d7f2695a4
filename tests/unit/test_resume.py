"""A run interrupted mid-way resumes from its last checkpoint (SQLite)."""

import pytest
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from specrag import build_graph
from tests.fakes import FakeLogprobChat, ctx, services


class Crash(BaseException):
    """Stands in for a process being stopped mid-run (not an Exception: nodes can't catch it)."""


async def test_interrupted_run_resumes_without_redoing_retrieval(tmp_path):
    calls = {"retrieve": 0, "answer": 0}

    class CrashOnce(FakeLogprobChat):
        def _stream(self, *a, **k):
            calls["answer"] += 1
            if calls["answer"] == 1:
                raise Crash()
            yield from super()._stream(*a, **k)

    svc = services(answer=CrashOnce(reply="Paris.", calls=[]))
    inner = svc.retriever

    def counting(question, document, context):
        calls["retrieve"] += 1
        return inner(question, document, context)

    svc.retriever = counting
    config = {"configurable": {"thread_id": "t-1"}}
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
        graph = build_graph(svc, checkpointer=saver)
        with pytest.raises(Crash):
            await graph.ainvoke({"question": "capital of France?"}, config=config, context=ctx())
        state = await graph.aget_state(config)
        assert state.next == ("refine",)  # stopped inside refine, after the gate
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
        graph = build_graph(svc, checkpointer=saver)  # a new process would do the same
        result = await graph.ainvoke(None, config=config, context=ctx())
    assert result["answer"] == "Paris." and result["route"] == "refine"
    assert calls["retrieve"] == 1  # retrieval was not repeated


async def test_cli_finds_the_unfinished_run_of_a_thread(tmp_path, monkeypatch):
    """`specrag ask --thread ID --resume` checks for an interrupted run before loading models."""
    from specrag.persistence import sqlite_checkpointer
    from specrag.runner import unfinished_run

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))

    class Crashing(FakeLogprobChat):
        def _stream(self, *a, **k):
            raise Crash()

    svc = services(answer=Crashing(reply="Paris.", calls=[]))
    config = {"configurable": {"thread_id": "t-2"}}
    async with sqlite_checkpointer() as saver:
        graph = build_graph(svc, checkpointer=saver)
        with pytest.raises(Crash):
            await graph.ainvoke({"question": "capital of France?"}, config=config, context=ctx())
    assert await unfinished_run("t-2") == ("refine",)
    assert await unfinished_run("t-other") is None
