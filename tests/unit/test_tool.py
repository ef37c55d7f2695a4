import json

from specrag import build_graph, make_specrag_tool
from tests.fakes import ctx, services


async def test_tool_runs_graph_and_returns_answer_with_sources():
    tool = make_specrag_tool(ctx(), graph=build_graph(services()))
    out = json.loads(await tool.ainvoke({"question": "What is the capital of France?"}))
    assert out["answer"] == "Paris." and out["route"] == "refine"
    assert out["sources"] == ["doc.txt"] and out["verified"] is True


def test_context_rejects_bad_values():
    import pytest

    from specrag.errors import InputError
    from specrag.graph.context import SpecRagContext

    with pytest.raises(InputError):
        SpecRagContext(top_k=0)
    with pytest.raises(InputError, match="unknown config key"):
        SpecRagContext.from_overrides({"bogus": "1"})
    assert SpecRagContext.from_overrides({"top_k": "5"}).top_k == 5


def test_tool_sync_invoke_runs_the_async_graph():
    # issue 9 #3: graph.invoke on async-only nodes raised, so tool.invoke always failed
    tool = make_specrag_tool(ctx(), graph=build_graph(services()))
    out = json.loads(tool.invoke({"question": "What is the capital of France?"}))
    assert out["answer"] == "Paris." and out["route"] == "refine"


async def test_tool_sync_invoke_works_inside_a_running_event_loop():
    # as in Jupyter: a loop is running in this thread while the sync API is called
    tool = make_specrag_tool(ctx(), graph=build_graph(services()))
    out = json.loads(tool.invoke({"question": "What is the capital of France?"}))
    assert out["answer"] == "Paris." and out["sources"] == ["doc.txt"]


def test_every_setting_is_validated_with_a_one_line_error():
    # issue 9 #9: every Literal and numeric range of SpecRagContext is checked in one place
    import dataclasses
    import typing

    import pytest

    from specrag.errors import InputError
    from specrag.graph.context import SpecRagContext

    with pytest.raises(InputError, match=r"rapid_transfer='foo' \(allowed: shift, mixture, none\)"):
        SpecRagContext(rapid_transfer="foo")
    hints = typing.get_type_hints(SpecRagContext)
    literals = [f for f in dataclasses.fields(SpecRagContext) if typing.get_origin(hints[f.name])]
    assert {f.name for f in literals} >= {"draft_policy", "refine_mode", "speculation"}
    for f in literals:
        with pytest.raises(InputError) as info:
            SpecRagContext(**{f.name: "bogus"})
        message = str(info.value)
        assert f.name in message and "allowed" in message and "\n" not in message
    ranged = [f for f in dataclasses.fields(SpecRagContext) if {"ge", "gt"} & set(f.metadata)]
    assert len(ranged) >= 15
    for f in ranged:
        low = f.metadata.get("ge", f.metadata.get("gt"))
        bad = low - 1 if "ge" in f.metadata else low
        bad = int(bad) if isinstance(f.default, int) else float(bad)
        with pytest.raises(InputError, match=f"{f.name}="):
            SpecRagContext(**{f.name: bad})
    with pytest.raises(InputError, match="confidence_threshold=1.5"):
        SpecRagContext(confidence_threshold=1.5)
    with pytest.raises(InputError, match="top_k='3'"):
        SpecRagContext(top_k="3")
    with pytest.raises(InputError, match="expected a number"):
        SpecRagContext.from_overrides({"rapid_eta": "strong"})


def test_a_context_from_a_json_client_is_refused_in_one_line_not_a_python_error():
    """A review (2026-12-07): Studio and JSON clients build the context from a dict: an int
    too large for a float raised OverflowError, a NUL byte in a path ValueError."""
    import pytest

    from specrag.errors import InputError
    from specrag.graph.context import SpecRagContext

    with pytest.raises(InputError, match="expected a finite number"):
        SpecRagContext(retrieval_timeout_s=10**400)
    with pytest.raises(InputError, match="index_dir .*: embedded null byte"):
        SpecRagContext.from_overrides({"index_dir": "\x00bad"})
    with pytest.raises(InputError, match="embedding_model"):
        SpecRagContext(embedding_model="./x\x00")


def test_text_output_is_the_answer_then_its_sources():
    from specrag.tools import format_text

    verified = {
        "answer": "Rollo.",
        "verified": True,
        "citations": [{"source": "a.md"}, {"source": "b.md"}],
    }
    assert format_text(verified) == "Rollo. [sources: a.md, b.md]"
    unverified = {"answer": "Maybe Rollo.", "verified": False, "reason": "retrieval timed out"}
    assert format_text(unverified) == "Maybe Rollo. [unverified: retrieval timed out]"
    said = {**unverified, "answer": "Unverified (no supporting evidence was found): Rollo."}
    assert format_text(said) == f"{said['answer']} [why: retrieval timed out]"  # not twice


def test_text_output_names_the_failed_search_before_a_failed_draft():
    """A review (2026-12-07): with the draft and the search both failed, the line named the
    draft's error (first in ``errors``) and lost the search's, which says what to run."""
    from specrag.tools import format_text

    failed = {
        "answer": "I could not find evidence for this.",
        "verified": False,
        "reason": "retrieval failed",
        "errors": ["draft: RuntimeError: model exploded", "retrieve: run `specrag index PATH`"],
    }
    assert format_text(failed) == (
        "I could not find evidence for this. [unverified: retrieval failed; "
        "retrieve: run `specrag index PATH`]"
    )


async def test_tool_tells_its_agent_why_a_question_is_refused():
    """An agent that sends an empty or over-long question reads why, not a "verified" answer
    to nothing (the graph answered both before: route generate, verified true)."""
    from langchain_core.messages import AIMessage, HumanMessage

    from specrag.errors import InputError

    svc = services()
    tool = make_specrag_tool(ctx(max_question_chars=10), graph=build_graph(svc), output="text")
    assert await tool.ainvoke({"question": "   "}) == "specrag: error: the question is empty"
    assert tool.invoke({"question": "x" * 50}) == (
        "specrag: error: the question is 50 characters long (max 10)"
    )
    # under output="json" (the default) the error is JSON too: it was the plain line
    tool = make_specrag_tool(ctx(max_question_chars=10), graph=build_graph(svc))
    assert json.loads(await tool.ainvoke({"question": "   "})) == {
        "error": "specrag: error: the question is empty"
    }
    graph = build_graph(svc)
    long = [AIMessage("hi"), HumanMessage("y" * 11)]  # the chat interface is checked too
    try:
        await graph.ainvoke({"messages": long}, context=ctx(max_question_chars=10))
    except InputError as exc:
        assert str(exc) == "the question is 11 characters long (max 10)"
    else:
        raise AssertionError("an over-long question in messages was answered")


async def test_a_graph_that_fails_gives_its_agent_a_line_not_an_exception():
    """Only InputError was caught: any other failure (a graph with a checkpointer and no
    thread_id, a broken setting) reached the agent's ToolNode, which re-raises it and ends
    the agent's run."""

    class Broken:
        async def ainvoke(self, *a, **k):
            raise KeyError("pairs")

    tool = make_specrag_tool(ctx(), graph=Broken(), output="text")
    assert await tool.ainvoke({"question": "q"}) == "specrag: error: KeyError: 'pairs'"
    assert tool.invoke({"question": "q"}) == "specrag: error: KeyError: 'pairs'"


def test_a_sync_call_that_fails_is_not_chained_to_a_missing_event_loop(caplog):
    """The sync path ran the graph inside ``except RuntimeError`` (no running loop): every
    failure was chained to it, and a message-less one read "TimeoutError (RuntimeError: no
    running event loop)"; the warning carried that traceback too."""

    class Times:
        async def ainvoke(self, *a, **k):
            raise TimeoutError()

    tool = make_specrag_tool(ctx(), graph=Times(), output="text")
    assert tool.invoke({"question": "q"}) == "specrag: error: TimeoutError"
    assert "event loop" not in caplog.text and "Traceback" not in caplog.text


async def test_an_agents_tool_call_that_fails_is_a_tool_message_with_status_error():
    """A refused question or a failed run came back to the agent as a ToolMessage with
    status "success" whose text said "specrag: error: ...": an agent framework that reads
    the status saw a result."""
    tool = make_specrag_tool(ctx(max_question_chars=10), graph=build_graph(services()))
    call = {"type": "tool_call", "id": "c1", "name": tool.name, "args": {"question": "   "}}
    message = await tool.ainvoke(call)
    assert message.status == "error"
    assert json.loads(message.content) == {"error": "specrag: error: the question is empty"}
    call["args"] = {"question": "Who?"}
    message = await tool.ainvoke(call)
    assert message.status == "success" and "Paris" in message.content


def test_a_context_stays_as_checked():
    """A field changed after construction skipped every check (`ctx.models = "pairs"` raised
    a KeyError deep in a run); model names are not checked here, since a graph's own
    services may know more of them than the registry."""
    import dataclasses

    import pytest

    from specrag.errors import InputError
    from specrag.graph.context import SpecRagContext

    ctx = SpecRagContext()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.models = "pairs"
    with pytest.raises(InputError):
        dataclasses.replace(ctx, models="pairs")  # the way to change one: checked again


async def test_a_remote_model_gets_the_stages_temperature_limit_seed_and_stops():
    """`provider:model` models streamed with their construction defaults: draft_temperature,
    answer_max_tokens, seed and the stop sequences reached only local models. The stops are
    applied here, not sent (OpenAI takes at most 4; test_stop_sequences)."""
    from typing import Any

    from langchain_core.messages import HumanMessage

    from specrag.models.options import DecodeOptions
    from specrag.nodes.streaming import stream_model
    from tests.fakes import FakeLogprobChat

    seen: list[dict[str, Any]] = []

    class Remote(FakeLogprobChat):
        temperature: float = 0.7
        max_tokens: int | None = None
        seed: int | None = None

        def _stream(self, messages, stop=None, run_manager=None, **kwargs):
            seen.append(
                {"t": self.temperature, "n": self.max_tokens, "seed": self.seed, "stop": stop}
            )
            yield from super()._stream(messages, stop, run_manager, **kwargs)

    model = Remote(reply="Paris.\n\nQuestion: more?")
    opts = DecodeOptions(temperature=0.0, max_new_tokens=12, seed=7, stop=("\n\n",))
    out = await stream_model(model, [HumanMessage("q")], budget_s=5, tags=["draft"], options=opts)
    assert out.text == "Paris."
    assert seen == [{"t": 0.0, "n": 12, "seed": 7, "stop": None}]
    assert model.temperature == 0.7  # a copy carries them: the shared model is unchanged
    await stream_model(
        FakeLogprobChat(reply="x"), [HumanMessage("q")], budget_s=5, tags=["a"], options=opts
    )  # a model without those fields streams as it is


async def test_an_unverified_answer_says_what_failed_and_sources_are_named_once():
    """A missing index gave the agent "retrieval failed" and nothing of its cause (the graph's
    errors held `run specrag index PATH`); a file's three chunks listed the file three times."""
    from specrag.tools import format_result, format_text

    svc = services(retrieve_error=OSError("no index at /x: run `specrag index PATH`"))
    out = json.loads(await make_specrag_tool(ctx(), graph=build_graph(svc)).ainvoke("q?"))
    assert out["verified"] is False and out["route"] == "fallback"
    assert any("run `specrag index PATH`" in e for e in out["errors"]), out
    line = await make_specrag_tool(ctx(), graph=build_graph(svc), output="text").ainvoke("q?")
    assert line.endswith("retrieval failed (OSError: no index at /x: run `specrag index PATH`)]"), (
        line
    )  # the reason names the search's error (2026-12-07), not said twice

    cited = {
        "answer": "Rollo.",
        "verified": True,
        "citations": [{"source": s} for s in ("a.md", "b.pdf#page=2", "a.md", "b.pdf#page=2")],
    }
    assert json.loads(format_result(cited))["sources"] == ["a.md", "b.pdf#page=2"]
    assert format_text(cited) == "Rollo. [sources: a.md, b.pdf#page=2]"


def test_the_public_names_type_check_as_documented(tmp_path):
    """`graph.ainvoke(..., context=SpecRagContext(...))`, the README's first call, failed
    mypy: the compiled graph's context type was None; a dict context for the tool was refused
    by its annotation; the errors a run raises were not exported."""
    import subprocess
    import sys

    import specrag

    assert issubclass(specrag.InputError, specrag.SpecRagError)
    user = tmp_path / "user.py"
    user.write_text(
        "from specrag import SpecRagContext, build_graph, graph, make_specrag_tool, preload\n"
        "async def main() -> str:\n"
        "    ctx = SpecRagContext(top_k=3)\n"
        "    out = await graph.ainvoke({'question': 'q'}, context=ctx)\n"
        "    async for _ in build_graph().astream({'question': 'q'}, context=ctx):\n"
        "        pass\n"
        "    make_specrag_tool({'top_k': 3})\n"
        "    preload({'top_k': 3}, quiet=True)\n"
        "    return str(out['answer'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(user)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout


def test_ctrl_c_in_a_sync_call_unwinds_the_run_quietly(caplog):
    """Ctrl-C during `tool.invoke` (no running loop) left the run's other tasks pending: the
    private loop closed their async generators under them and destroyed them, printing pages
    of "already running" / "Task was destroyed" tracebacks around the KeyboardInterrupt (a
    review, 2026-12-06). They are cancelled and unwound first, as `asyncio.run` does."""
    import asyncio

    import pytest

    from specrag.tools import _run_on_own_loop

    unwound = []

    async def tokens():
        try:
            while True:
                yield "tok"
                await asyncio.sleep(0.01)
        finally:
            unwound.append("generator")

    async def stream():
        try:
            async for _ in tokens():
                pass
        finally:
            unwound.append("task")

    async def run():
        asyncio.get_running_loop().create_task(stream())
        await asyncio.sleep(0.05)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run_on_own_loop(run())
    assert sorted(unwound) == ["generator", "task"]
    assert not [r for r in caplog.records if r.name == "asyncio"]


def test_a_task_failing_as_the_run_unwinds_is_logged_not_lost(caplog):
    """`asyncio.run` hands such an error to the loop's exception handler; the tool's loop
    gathered it with return_exceptions=True and dropped it (a review)."""
    import asyncio
    import logging

    import pytest

    from specrag.tools import _run_on_own_loop

    async def stuck():
        try:
            await asyncio.sleep(10)
        finally:
            raise ValueError("the cleanup failed")

    async def run():
        asyncio.get_running_loop().create_task(stuck())
        await asyncio.sleep(0.01)
        raise KeyboardInterrupt

    with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(KeyboardInterrupt):
        _run_on_own_loop(run())
    assert any("the cleanup failed" in str(r.exc_info) for r in caplog.records if r.exc_info)


def test_ctrl_c_in_a_sync_call_from_inside_a_running_loop_cancels_the_run():
    """Inside a running loop (Jupyter) the sync call's helper thread was waited for in a
    pool's `with`: Ctrl-C surfaced only when the whole run had ended (a review, 2026-12-07:
    5 s of a 5 s run). Now the run is cancelled and the KeyboardInterrupt comes at once."""
    import _thread
    import asyncio
    import threading
    import time

    import pytest

    seen = []
    running = threading.Event()  # Ctrl-C once the run is under way (not before its start)

    class Slow:
        async def ainvoke(self, *args, **kwargs):
            running.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            return {"answer": "late"}

    tool = make_specrag_tool(ctx(), graph=Slow(), output="text")

    def interrupt() -> None:
        if running.wait(20):
            _thread.interrupt_main()

    async def call():
        threading.Thread(target=interrupt, daemon=True).start()
        tool.invoke({"question": "q"})

    start = time.monotonic()
    loop = asyncio.new_event_loop()  # no SIGINT handler of asyncio.run's: as in a kernel
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(call())
    finally:
        loop.close()
    assert time.monotonic() - start < 10
    assert seen == ["cancelled"]


def test_bad_tool_arguments_are_one_line_in_the_tool_format():
    """`{"query": ...}` (what small models write) or a number as the question raised a
    multi-line pydantic ValidationError from a direct call (a review, 2026-12-07)."""

    class Graph:
        async def ainvoke(self, *args, **kwargs):
            return {"answer": "x", "verified": True, "citations": [{"source": "s"}]}

    text = make_specrag_tool(ctx(), graph=Graph(), output="text")
    line = text.invoke({"query": "Norse leader"})
    assert line.startswith("specrag: error: the tool takes") and "question" in line
    assert "\n" not in line
    as_json = make_specrag_tool(ctx(), graph=Graph())
    error = json.loads(as_json.invoke({"question": 5}))["error"]
    assert error.startswith("specrag: error:") and "valid string" in error
    assert text.invoke({"question": "q"}) == "x [sources: s]"


def test_a_context_of_the_wrong_type_is_refused_when_the_tool_is_made():
    """A string context was taken, then every call failed on an attribute; `[]` read as the
    defaults (a review, 2026-12-07)."""
    import pytest

    for wrong in ("top_k=3", 5, []):
        with pytest.raises(TypeError, match="context must be a SpecRagContext or a dict"):
            make_specrag_tool(wrong, graph=object())


async def test_an_unreadable_result_is_the_tools_error_line():
    """A custom graph's result that is no dict escaped as a raw AttributeError."""

    class Odd:
        async def ainvoke(self, *args, **kwargs):
            return ["not", "a", "dict"]

    out = json.loads(await make_specrag_tool(ctx(), graph=Odd()).ainvoke({"question": "q"}))
    assert out["error"].startswith("specrag: error: the run's result is unreadable")
