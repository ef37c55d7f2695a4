"""A run interrupted mid-way resumes from its last checkpoint (SQLite)."""

import time

import pytest
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from specrag import build_graph
from tests.fakes import FakeLogprobChat, ctx, failing_once, services


class Crash(BaseException):
    """Stands in for a process being stopped mid-run (not an Exception: nodes can't catch it)."""


def crash_once(calls: dict[str, int], reply: str = "Paris.") -> FakeLogprobChat:
    """An answer model that stops the process at its first call, then answers ``reply``."""
    return failing_once(Crash(), calls, reply)


async def test_interrupted_run_resumes_without_redoing_retrieval(tmp_path):
    calls = {"retrieve": 0, "answer": 0}
    svc = services(answer=crash_once(calls))
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


async def stop_in_refine(thread: str, inputs: dict) -> None:
    """Run ``inputs`` on ``thread`` (the CLI's SQLite checkpointer) until refine's model stops
    the process."""
    from specrag.persistence import sqlite_checkpointer

    class Crashing(FakeLogprobChat):
        def _stream(self, *a, **k):
            raise Crash()

    svc = services(answer=Crashing(reply="Paris.", calls=[]))
    config = {"configurable": {"thread_id": thread}}
    async with sqlite_checkpointer() as saver:
        graph = build_graph(svc, checkpointer=saver)
        with pytest.raises(Crash):
            await graph.ainvoke(inputs, config=config, context=ctx())


async def test_cli_finds_the_unfinished_run_of_a_thread(tmp_path, monkeypatch):
    """`specrag ask --thread ID --resume` checks for an interrupted run before loading models."""
    from specrag.runner import unfinished_run

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    await stop_in_refine("t-2", {"question": "capital of France?"})
    saved = await unfinished_run("t-2")
    assert saved is not None and saved.nodes == ("refine",)
    assert not saved.has_document  # an index run: the CLI opens the index before resuming
    assert await unfinished_run("t-other") is None


async def test_an_unfinished_document_run_says_it_needs_no_index(tmp_path, monkeypatch):
    """`--resume` of a `--document` run must not ask for an index the run never uses."""
    from specrag.runner import unfinished_run

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    question = {"question": "capital of France?", "document": "Paris is the capital of France."}
    await stop_in_refine("t-doc", question)
    saved = await unfinished_run("t-doc")
    assert saved is not None and saved.has_document


@pytest.mark.parametrize("new_process", [True, False])
async def test_a_resumed_run_whose_refine_fails_times_from_the_resumed_node(
    tmp_path, monkeypatch, new_process
):
    """The marks merge: a resumed refine that failed left the dead process's origin under the
    new clock id, and generate then counted total_s from another process's perf_counter.
    Resumed in the same process (a server, Studio), the first invocation's marks were taken
    as live: total_s counted the pause, and a spent answer budget would end the answer."""
    import specrag.nodes.answer
    import specrag.nodes.prepare
    import specrag.nodes.streaming

    calls = {"answer": 0}

    class CrashThenFail(FakeLogprobChat):
        def _stream(self, *a, **k):
            calls["answer"] += 1
            if calls["answer"] == 1:
                raise Crash()  # the first process stops inside refine
            if calls["answer"] == 2:
                raise RuntimeError("refine broke")  # the resumed refine fails: generate runs
            yield from super()._stream(*a, **k)

    svc = services(answer=CrashThenFail(reply="Paris.", calls=[]))
    config = {"configurable": {"thread_id": "t-clock"}}
    real_now = specrag.nodes.streaming.now
    with monkeypatch.context() as m:  # the first process's clock reads 1,000 s earlier
        m.setattr(specrag.nodes.prepare, "now", lambda: real_now() - 1000.0)
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
            with pytest.raises(Crash):
                await build_graph(svc, checkpointer=saver).ainvoke(
                    {"question": "capital of France?"}, config=config, context=ctx()
                )
    if new_process:
        monkeypatch.setattr(specrag.nodes.streaming, "CLOCK_ID", -1.0)
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
        result = await build_graph(svc, checkpointer=saver).ainvoke(
            None, config=config, context=ctx()
        )
    assert result["route"] == "generate" and result["answer"] == "Paris."
    t = result["timings"]
    assert 0 <= t["ttft_s"] <= t["total_s"] < 100, t  # from the resumed refine's start


async def test_a_replay_in_the_same_process_times_and_budgets_from_its_own_start(monkeypatch):
    """Studio's time travel replays a checkpoint in the process that ran it, perhaps minutes
    later: its nodes read the replayed run's marks as live, so a replay of generate (after a
    failed refine) found its answer budget spent and fell back, and total_s counted the pause
    (a review of the graph, 2026-12-05)."""
    from langgraph.checkpoint.memory import InMemorySaver

    import specrag.nodes.answer
    import specrag.nodes.streaming

    svc = services(answer=failing_once(RuntimeError("refine broke")))
    app = build_graph(svc, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t-replay"}}
    first = await app.ainvoke({"question": "capital of France?"}, config, context=ctx())
    assert first["route"] == "generate"
    before_generate = [s async for s in app.aget_state_history(config) if s.next == ("generate",)]
    real_now = specrag.nodes.streaming.now
    for module in (specrag.nodes.streaming, specrag.nodes.answer):  # 1,000 s later
        monkeypatch.setattr(module, "now", lambda: real_now() + 1000.0)
    replay = await app.ainvoke(None, before_generate[0].config, context=ctx(answer_timeout_s=30.0))
    assert replay["route"] == "generate" and replay["answer"] == "Paris.", replay["reason"]
    assert replay["timings"]["total_s"] < 100, replay["timings"]


def test_what_is_left_of_a_run_says_whether_it_needs_the_index():
    from specrag.runner import Unfinished

    assert Unfinished(("retrieve", "draft"), "").needs_index
    assert Unfinished(("prepare",), "").needs_index
    assert not Unfinished(("refine",), "").needs_index  # past retrieval: evidence is saved
    assert not Unfinished(("retrieve",), "Rollo led the Norse.").needs_index  # its own document


async def test_a_finished_thread_keeps_only_its_latest_checkpoint_and_its_history(tmp_path):
    """Every step checkpoints the whole state; after a finished run the earlier ones go, and
    a follow-up still reads the conversation from the one kept."""
    from langchain_core.messages import HumanMessage

    from specrag.persistence import keep_latest

    answer = FakeLogprobChat(reply="Rollo.", calls=[])
    config = {"configurable": {"thread_id": "t-3"}}

    async def rows(saver, table):
        async with saver.conn.execute(f"SELECT COUNT(*) FROM {table} WHERE thread_id = 't-3'") as c:
            return (await c.fetchone())[0]

    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
        graph = build_graph(services(answer=answer), checkpointer=saver)
        for question in ("Who was the Norse leader?", "When did he die?"):
            await graph.ainvoke({"messages": [HumanMessage(question)]}, config, context=ctx())
            assert await rows(saver, "checkpoints") > 1  # a checkpoint per step
            await keep_latest(saver, "t-3")
            assert await rows(saver, "checkpoints") == 1 and await rows(saver, "writes") == 0
        state = await graph.aget_state(config)
    assert not state.next  # nothing left to resume
    assert [m.type for m in state.values["messages"]] == ["human", "ai", "human", "ai"]
    texts = [str(m.content) for m in answer.calls[-1]]
    assert "Who was the Norse leader?" in texts and "Rollo." in texts  # the history was read


async def test_a_thread_run_through_the_runner_leaves_one_checkpoint(tmp_path, monkeypatch):
    """``run_graph(thread=...)`` (the CLI's ``--thread``) prunes what its finished run wrote:
    one checkpoint, no pending writes; the file otherwise grew by every step of every run."""
    import sqlite3

    from specrag.runner import run_graph

    _graph_of(monkeypatch, services())
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    for question in ("capital of France?", "and its river?"):
        await run_graph(question, ctx(), None, False, thread="t-4")
        with sqlite3.connect(tmp_path / "checkpoints.sqlite") as db:
            for table, kept in (("checkpoints", 1), ("writes", 0)):
                (n,) = db.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE thread_id = 't-4'"
                ).fetchone()
                assert n == kept, (table, n)


async def test_a_resumed_document_run_indexes_its_document_outside_the_retrieval_budget(
    tmp_path, monkeypatch
):
    """A `--document` run stopped in retrieve and resumed in a new process found its document
    unindexed there (prepare had chunked and embedded it in the old process), so the search
    chunked and embedded the whole document inside the 3 s retrieval budget and a long one
    ended in the fallback route. The retrieve node indexes it first, outside the budget."""

    from specrag.graph.services import Services

    order: list[str] = []

    def index_document(self, ctx, document):
        order.append("index")
        time.sleep(1.2)  # embedding a long document: past the 1 s retrieval budget

    monkeypatch.setattr(Services, "index_document", index_document)
    svc = services(answer=FakeLogprobChat(reply="Paris.", calls=[]))
    inner = svc.retriever

    def crash_once(question, document, context):
        order.append("search")
        if order.count("search") == 1:
            raise Crash()  # the first process stops inside retrieve
        return inner(question, document, context)

    svc.retriever = crash_once
    config = {"configurable": {"thread_id": "t-doc-resume"}}
    inputs = {"question": "capital of France?", "document": "Paris is the capital of France."}
    settings = dict(retrieval_timeout_s=1.0, draft_policy="off")
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
        with pytest.raises(Crash):
            await build_graph(svc, checkpointer=saver).ainvoke(
                inputs, config=config, context=ctx(**settings)
            )
    assert order == ["index", "index", "search"]  # prepare's, then retrieve's (a cache hit)
    import specrag.nodes.answer
    import specrag.nodes.streaming

    monkeypatch.setattr(specrag.nodes.streaming, "CLOCK_ID", -1.0)  # a new process
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
        result = await build_graph(svc, checkpointer=saver).ainvoke(
            None, config=config, context=ctx(**settings)
        )
    assert order[3:] == ["index", "search"]  # indexed before the budget's clock started
    assert result["route"] == "generate" and result["answer"] == "Paris.", result["reason"]
    # ... but within the resumed run's total: its origin is the retrieve node's start
    assert result["timings"]["total_s"] >= 1.2 > result["timings"]["retrieve_s"], result["timings"]


@pytest.mark.parametrize("ends_in", ["generate", "fallback"])
async def test_a_run_resumed_before_the_join_times_from_its_first_resumed_node(
    tmp_path, monkeypatch, ends_in
):
    """Only the answer nodes set an origin in the resuming process: a run resumed at
    retrieve reported total_s from the answer node's start (less than retrieve_s), and one
    that ended in fallback a ttft_s of -0.0."""

    import specrag.nodes.answer
    import specrag.nodes.streaming

    searches = []
    svc = services(answer=FakeLogprobChat(reply="Paris.", calls=[]))
    inner = svc.retriever

    def crash_once(question, document, context):
        searches.append(question)
        if len(searches) == 1:
            raise Crash()
        time.sleep(0.3)  # the resumed search takes a while
        if ends_in == "fallback":
            raise RuntimeError("store down")
        return inner(question, document, context)

    svc.retriever = crash_once
    config = {"configurable": {"thread_id": f"t-origin-{ends_in}"}}
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
        with pytest.raises(Crash):
            await build_graph(svc, checkpointer=saver).ainvoke(
                {"question": "capital of France?"}, config=config, context=ctx(draft_policy="off")
            )
    monkeypatch.setattr(specrag.nodes.streaming, "CLOCK_ID", -1.0)  # a new process
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
        result = await build_graph(svc, checkpointer=saver).ainvoke(
            None, config=config, context=ctx(draft_policy="off")
        )
    t = result["timings"]
    assert result["route"] == ends_in
    assert t["total_s"] >= t["retrieve_s"] >= 0.3, t
    assert 0.3 <= t["ttft_s"] <= t["total_s"], t


async def test_a_resumed_incremental_run_says_its_later_batches_were_lost(tmp_path):
    """The search's stream of later batches lives in the process that ran it: a run resumed
    after the first batch answered from it alone and said nothing."""
    import dataclasses

    from tests.fakes import two_batches

    svc = dataclasses.replace(
        services(answer=crash_once({"answer": 0})),
        batch_retriever=two_batches(lambda: time.sleep(0.05)),
    )
    config = {"configurable": {"thread_id": "t-lost"}}
    settings = dict(answer_policy="incremental", incremental_grace_s=0.0, draft_policy="off")
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
        graph = build_graph(svc, checkpointer=saver)
        with pytest.raises(Crash):
            await graph.ainvoke(
                {"question": "capital of France?"}, config=config, context=ctx(**settings)
            )
        result = await graph.ainvoke(None, config=config, context=ctx(**settings))
    assert result["route"] == "generate" and result["answer"] == "Paris."
    assert any("later batches were lost" in e for e in result["errors"]), result["errors"]


@pytest.mark.parametrize("failed", [False, True])
async def test_a_draft_resumed_after_its_retrieve_delivered_stops_at_once(
    failed, tmp_path, monkeypatch
):
    """`--resume` of a run stopped inside the draft after retrieve had delivered evidence: the
    signal lived in the dead process, and the resumed draft ("until_retrieval") drafted its
    whole budget with the evidence already in the checkpoint. A retrieve that had failed
    delivered nothing: the resumed draft is not stopped (the fallback shows it whole)."""
    import threading

    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from specrag.graph import signals
    from specrag.nodes import streaming
    from specrag.runner import run_graph

    until_stopped = streaming.until_stopped
    saved = threading.Event()  # retrieve's writes are in the checkpoint (a sleep raced them)
    drafts = {"n": 0}
    put_writes = AsyncSqliteSaver.aput_writes

    async def put_and_tell(self, config, writes, task_id, task_path=""):
        await put_writes(self, config, writes, task_id, task_path)
        if any(channel == "retrieval_status" for channel, _ in writes):
            saved.set()

    monkeypatch.setattr(AsyncSqliteSaver, "aput_writes", put_and_tell)

    class CrashAfterRetrieval(FakeLogprobChat):
        def _stream(self, *a, **k):
            drafts["n"] += 1
            if drafts["n"] == 1:  # the first process stops inside the draft, after retrieve
                assert saved.wait(30)
                raise Crash()
            yield from super()._stream(*a, **k)

    long_draft = " ".join(["word"] * 20)
    svc = services(
        draft=CrashAfterRetrieval(reply=long_draft, delay_s=0.02, calls=[]),
        retrieve_error=OSError("disk gone") if failed else None,
    )
    _graph_of(monkeypatch, svc)
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    settings = ctx(draft_policy="until_retrieval")

    async def unstoppable(work, stopped):  # a stream the stop cannot end before it dies
        await work
        return False

    monkeypatch.setattr(streaming, "until_stopped", unstoppable)
    with pytest.raises(Crash):
        await run_graph("capital of France?", settings, None, False, thread="t-draft")
    monkeypatch.setattr(streaming, "until_stopped", until_stopped)
    monkeypatch.setattr(signals, "_SIGNALS", type(signals._SIGNALS)())  # a new process
    restored = []
    real_restore = signals.restore_signal
    monkeypatch.setattr(signals, "restore_signal", lambda s: restored.append(real_restore(s)))
    result = await run_graph("", settings, None, False, thread="t-draft")  # --resume
    if failed:
        assert restored == [False] and result["draft"] == long_draft
        assert result["route"] == "fallback"
        return
    assert restored == [True]  # the resumed draft saw the restored signal ...
    assert drafts["n"] <= 2 and len(result["draft"].split()) <= 1, result["draft"]  # at once
    assert result["route"] in ("generate", "refine") and result["answer"] == "Paris."


def _graph_of(monkeypatch, svc):
    """``run_graph`` / ``unfinished_run`` build their graph on ``svc``'s fakes."""
    import importlib

    builder = importlib.import_module("specrag.graph.builder")  # specrag.graph shadows it
    real_build = builder.build_graph
    monkeypatch.setattr(builder, "build_graph", lambda **kw: real_build(svc, **kw))
    return real_build


async def test_two_runs_on_one_thread_take_turns(tmp_path, monkeypatch):
    """A review (2026-12-06): two runs on one thread at once each read the conversation as it
    was when they started; the one that ended last wrote the thread's state (the other's
    question and answer were lost), and the first to end pruned the other's checkpoints. Now
    the second waits for the first: both turns are kept, in order."""
    import asyncio

    from specrag.persistence import sqlite_checkpointer
    from specrag.runner import run_graph

    class Slow(FakeLogprobChat):
        def _stream(self, messages, *a, **k):
            if "SLOW" in messages[-1].content:
                time.sleep(1.0)
            yield from super()._stream(messages, *a, **k)

    svc = services(answer=Slow(reply="Paris.", calls=[]))
    real_build = _graph_of(monkeypatch, svc)
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    await run_graph("first question?", ctx(), None, False, thread="t")
    slow = asyncio.create_task(run_graph("SLOW second question?", ctx(), None, False, thread="t"))
    await asyncio.sleep(0.3)  # inside its answer
    await run_graph("third question?", ctx(), None, False, thread="t")
    assert slow.done()  # the third waited for it
    async with sqlite_checkpointer() as saver:
        state = await real_build(svc, checkpointer=saver).aget_state(
            {"configurable": {"thread_id": "t"}}
        )
    humans = [m.content for m in state.values["messages"] if m.type == "human"]
    assert humans == ["first question?", "SLOW second question?", "third question?"]
    assert len([m for m in state.values["messages"] if m.type == "ai"]) == 3


async def test_a_run_stopped_before_prepare_reports_its_own_document(tmp_path, monkeypatch):
    """A review (2026-12-06): a run stopped before its ``prepare`` reported the run before
    it's document (``run_document``), so ``--resume`` of a question asked without one skipped
    opening the index, and the resumed run opened it inside its retrieval budget."""
    from langchain_core.messages import HumanMessage

    from specrag.persistence import sqlite_checkpointer
    from specrag.runner import unfinished_run

    svc = services()
    stop = {"now": False}

    def warm(model):
        if stop["now"]:
            raise Crash()

    svc.warm = warm
    _graph_of(monkeypatch, svc)
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    config = {"configurable": {"thread_id": "t"}}
    async with sqlite_checkpointer() as saver:
        graph = build_graph(svc, checkpointer=saver)
        await graph.ainvoke(
            {"messages": [HumanMessage("capital of France?")], "document": "Paris is it."},
            config,
            context=ctx(),
        )
        stop["now"] = True
        with pytest.raises(Crash):
            await graph.ainvoke(
                {"messages": [HumanMessage("and of Italy?")]}, config, context=ctx()
            )
    saved = await unfinished_run("t")
    assert saved is not None and "prepare" in saved.nodes
    assert saved.document == "" and saved.needs_index


async def test_pruning_a_finished_thread_leaves_every_other_thread_as_it_was(tmp_path):
    """A mutation review (2026-12-08): ``keep_latest`` with its ``thread_id = ?`` filter
    dropped passed every test (each used one thread per database), yet a run finishing on
    thread B would delete thread A's history and the interrupted run ``--resume`` needs."""
    from langchain_core.messages import HumanMessage

    from specrag.persistence import keep_latest

    async def rows(saver, table, thread):
        query = f"SELECT COUNT(*) FROM {table} WHERE thread_id = ?"
        async with saver.conn.execute(query, (thread,)) as c:
            return (await c.fetchone())[0]

    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.sqlite")) as saver:
        graph = build_graph(services(), checkpointer=saver)
        for thread in ("A", "B"):
            config = {"configurable": {"thread_id": thread}}
            await graph.ainvoke({"messages": [HumanMessage("capital?")]}, config, context=ctx())
        before = {t: await rows(saver, t, "A") for t in ("checkpoints", "writes")}
        assert before["checkpoints"] > 1 and before["writes"] > 0  # something to lose
        await keep_latest(saver, "B")
        assert {t: await rows(saver, t, "A") for t in ("checkpoints", "writes")} == before
        assert await rows(saver, "checkpoints", "B") == 1
        assert await rows(saver, "writes", "B") == 0


async def test_a_run_on_one_thread_does_not_wait_for_a_run_on_another(tmp_path, monkeypatch):
    """A mutation review (2026-12-08): ``thread_lock`` naming its lock file from a constant
    instead of the thread passed every test, yet then ``ask --thread B`` waited for a running
    ``ask --thread A`` and said "thread 'B' is in use by another run"."""
    import asyncio

    from specrag.persistence import thread_lock

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    waited: list[str] = []
    async with thread_lock("A"):
        async with asyncio.timeout(10):  # a lock shared by both would wait here for good
            async with thread_lock("B", lambda: waited.append("B")):
                pass
    assert waited == []
    assert len(list((tmp_path / "locks").iterdir())) == 2  # a lock file per thread
