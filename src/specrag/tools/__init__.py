"""specrag as a tool for LangChain agents."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import threading
from typing import Any, Literal

from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, Field, ValidationError

from specrag.errors import InputError, short_error
from specrag.graph.context import SpecRagContext

log = logging.getLogger(__name__)


class AskInput(BaseModel):
    """Arguments of the specrag tool."""

    question: str = Field(description="A self-contained question about the indexed documents.")


def sources(result: dict[str, Any]) -> list[str]:
    """The cited sources, each once, in citation order.

    A file's chunks cite it many times; a PDF page's source names its page (``x.pdf#page=3``).
    """
    return list(dict.fromkeys(str(c.get("source")) for c in result.get("citations") or []))


def why(result: dict[str, Any]) -> str:
    """Why an answer is unverified: the route's reason, then a failed step's first error.

    A missing index read "retrieval failed" alone; its error says what to run. A failed
    draft never makes an answer unverified (the draft is what an unverified answer shows), so
    its error comes last: with the draft and the search both failed, the line named the
    draft's error and lost the search's "run `specrag index PATH`" (a review, 2026-12-07).
    """
    reason = str(result.get("reason") or "no evidence")
    said = [str(e) for e in result.get("errors") or []]  # "node: error": said if its error is
    errors = [e for e in said if e not in reason and e.split(": ", 1)[-1] not in reason]
    errors.sort(key=lambda e: e.startswith("draft:"))  # stable: the rest keep their order
    return f"{reason}; {errors[0]}" if errors else reason


def format_text(result: dict[str, Any]) -> str:
    """The tool's answer as text: the answer, then its sources (or why it is unverified).

    The answer keeps its own line breaks (a list stays a list); what follows it is one line.

    Small local agent models copy this line, citations included, where they paraphrase JSON
    and drop the sources (measured with the pair's 1.5B: tests/pair/test_agent.py).
    """
    answer = str(result.get("answer", "")).strip()
    cited = sources(result)
    if result.get("verified") and cited:
        return f"{answer} [sources: {', '.join(cited)}]"
    if answer.lower().startswith("unverified"):  # the answer says so already: only why
        return f"{answer} [why: {why(result)}]"
    return f"{answer} [unverified: {why(result)}]"


def format_result(result: dict[str, Any]) -> str:
    """The tool's answer: JSON with answer, verified, route, reason, sources and errors."""
    return json.dumps(
        {
            "answer": result.get("answer", ""),
            "verified": result.get("verified", False),
            "route": result.get("route", ""),
            "reason": result.get("reason", ""),
            "sources": sources(result),
            "errors": [str(e) for e in result.get("errors") or []],
        },
        ensure_ascii=False,
    )


def _run_on_own_loop(coro: Any, loop: asyncio.AbstractEventLoop | None = None) -> Any:
    """Run ``coro`` on a private event loop, closed WITHOUT waiting for its worker threads.

    ``asyncio.run`` would wait for every leftover ``to_thread`` worker (e.g. a retrieval stuck
    on a locked store after its budget ended), so the tool could block past every budget.
    Its tasks are cancelled and awaited first, as ``asyncio.run`` does: after Ctrl-C the run's
    task was left pending, and closing its async generators under it printed pages of
    "already running" / "Task was destroyed" tracebacks around the KeyboardInterrupt.
    ``loop``: a new loop made by the caller (who may cancel ``coro``'s task on it).
    """
    loop = loop or asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            _cancel_tasks(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()  # shuts its default executor down with wait=False


def _cancel_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel ``loop``'s unfinished tasks and let them unwind, as ``asyncio.run`` does.

    An error one of them raised while unwinding goes to the loop's exception handler (logged).
    """
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "a task of the specrag tool's run failed as it was cancelled",
                    "exception": task.exception(),
                    "task": task,
                }
            )


def _run_in_helper_thread(coro: Any) -> Any:
    """Run ``coro`` on a private loop in a helper thread; Ctrl-C here cancels the run.

    The caller's thread runs a loop already (Jupyter, async code calling the sync API). A
    pool's ``with`` waited for the whole run after Ctrl-C (a review, 2026-12-07: 5 s of a 5 s
    run); now the run's task is cancelled and unwinds (a few seconds at most) before the
    KeyboardInterrupt goes on. Callbacks, tracing and config travel along in a context copy.
    """
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def work() -> None:
        try:
            outcome["result"] = _run_on_own_loop(task, loop)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc
        finally:
            finished.set()

    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(work,), name="specrag-tool", daemon=True)
    try:
        worker.start()  # inside: a Ctrl-C while it starts (the run may be under way) cancels
        while not finished.wait(0.1):  # short waits: a signal met in another thread counts too
            pass
    except BaseException:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop closed as the run ended
            pass
        finished.wait(_UNWIND_WAIT_S)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


_UNWIND_WAIT_S = 5.0
"""How long Ctrl-C during a sync call from inside a running loop waits for the run to unwind."""


def make_specrag_tool(
    context: SpecRagContext | dict[str, Any] | None = None,
    graph: Any = None,
    *,
    name: str = "search_documents",
    # kept for output="text" too: under two wordings that described the text line instead,
    # the pair's 1.5B agent stopped calling the tool (2026-12-04, tests/pair/test_agent.py)
    description: str = (
        "Answer a question from the user's indexed documents. Returns JSON with the answer, "
        "whether it was verified against evidence, and the sources."
    ),
    output: Literal["json", "text"] = "json",
) -> BaseTool:
    """A tool that runs the specrag graph on a question (async and sync).

    ``output="json"``: answer, verified, route, reason, sources (each once) and errors as
    JSON, a refused question or failed run as ``{"error": "specrag: error: ..."}``;
    ``"text"``: the answer and then its sources (what small local agent models cite
    reliably), an error as one line ``specrag: error: ...``. ``context`` may be a dict of settings.
    A graph compiled without a checkpointer runs detached from the calling agent's (its steps
    stay out of the agent's thread); one compiled with its own keeps it.
    """
    if output not in ("json", "text"):
        raise ValueError(f"output must be 'json' or 'text', not {output!r}")
    fmt = format_result if output == "json" else format_text
    if graph is None:
        from specrag.graph.builder import graph as default_graph

        graph = default_graph
    if getattr(graph, "checkpointer", 0) is None:
        # A graph compiled without a checkpointer takes its caller's: inside an agent's tool
        # call that is the agent's, used through its async API (a sync SqliteSaver failed every
        # call) and filling the agent's thread with each run's steps (a review, 2026-12-07).
        # The tool's runs are its own: detached from the caller's checkpointer.
        graph = graph.copy(update={"checkpointer": False})
    if context is not None and not isinstance(context, (dict, SpecRagContext)):
        # a string or list was taken, then every call failed on an attribute (or [] read as
        # the defaults)
        raise TypeError(
            f"context must be a SpecRagContext or a dict of settings, not {type(context).__name__}"
        )
    ctx = SpecRagContext(**context) if isinstance(context, dict) else context or SpecRagContext()

    def error_text(line: str) -> str:
        # under output="json" the error is JSON too ({"error": ...}, as the CLI's --json)
        return json.dumps({"error": line}, ensure_ascii=False) if output == "json" else line

    def failed(line: str) -> ToolException:
        return ToolException(error_text(line))

    async def arun(question: str) -> str:
        # A ToolException is handled by the tool (handle_tool_error): the agent reads the
        # line in a ToolMessage with status "error"; a direct call returns the line
        try:
            result = await graph.ainvoke({"question": question}, context=ctx)
        except InputError as exc:  # an empty or over-long question: the agent reads why
            raise failed(f"specrag: error: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - an agent's ToolNode re-raises: its run would end
            log.warning("the specrag tool failed: %s", short_error(exc))
            log.debug("the specrag tool's failure", exc_info=True)
            raise failed(f"specrag: error: {short_error(exc)}") from exc
        try:
            return fmt(result)
        except Exception as exc:  # noqa: BLE001 - a custom graph's odd result: one line too
            raise failed(
                f"specrag: error: the run's result is unreadable: {short_error(exc)}"
            ) from exc

    def bad_arguments(exc: ValidationError) -> str:
        # a small model writes {"query": ...} or a number: it reads why, in the tool's format
        errors = exc.errors()
        where = ".".join(str(part) for part in errors[0]["loc"]) if errors else ""
        what = errors[0]["msg"] if errors else "invalid"
        return error_text(
            'specrag: error: the tool takes {"question": "<a question>"}; '
            f"{where or 'arguments'}: {what}"
        )

    def run(question: str) -> str:
        # The graph's nodes are async-only: run them on an event loop of our own. Inside a
        # running loop (Jupyter, an async agent calling the sync API) that loop lives in a
        # helper thread, since a loop cannot be nested in the thread that runs one.
        try:
            asyncio.get_running_loop()
            in_a_loop = True
        except RuntimeError:
            in_a_loop = False
        if not in_a_loop:  # outside the except: a failure is not chained to "no running loop"
            return _run_on_own_loop(arun(question))
        return _run_in_helper_thread(arun(question))

    return StructuredTool.from_function(
        func=run,
        coroutine=arun,
        name=name,
        description=description,
        args_schema=AskInput,
        handle_tool_error=True,  # a ToolException's line is the tool's output (status error)
        handle_validation_error=bad_arguments,
    )


def agent_prompt(name: str = "search_documents") -> str:
    """A system prompt for an agent around the tool named ``name`` (with ``output="text"``).

    Measured to make the pair's 1.5B call the tool and cite its sources
    (tests/pair/test_agent.py); a tool made with another ``name=`` needs its own name here.
    """
    return (
        f"Answer with the {name} tool, then give its answer and cite its sources in "
        "square brackets."
    )


AGENT_PROMPT = agent_prompt()
"""The prompt of :func:`agent_prompt` for the tool's default name (``search_documents``)."""
