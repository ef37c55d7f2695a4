"""specrag as a tool for LangChain agents."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, Field

from specrag.errors import InputError
from specrag.graph.context import SpecRagContext

log = logging.getLogger(__name__)


class AskInput(BaseModel):
    """Arguments of the specrag tool."""

    question: str = Field(description="A self-contained question about the indexed documents.")


def format_text(result: dict[str, Any]) -> str:
    """The tool's answer as one line: the answer, then its sources (or why it is unverified).

    Small local agent models copy this line, citations included, where they paraphrase JSON
    and drop the sources (measured with the pair's 1.5B: tests/pair/test_agent.py).
    """
    answer = str(result.get("answer", "")).strip()
    sources = [str(c.get("source")) for c in result.get("citations") or []]
    if result.get("verified") and sources:
        return f"{answer} [sources: {', '.join(sources)}]"
    reason = result.get("reason", "no evidence")
    if answer.lower().startswith("unverified"):  # the answer says so already: only why
        return f"{answer} [why: {reason}]"
    return f"{answer} [unverified: {reason}]"


def format_result(result: dict[str, Any]) -> str:
    """The tool's answer: JSON with answer, route, reason and sources."""
    return json.dumps(
        {
            "answer": result.get("answer", ""),
            "verified": result.get("verified", False),
            "route": result.get("route", ""),
            "reason": result.get("reason", ""),
            "sources": [c.get("source") for c in result.get("citations") or []],
        },
        ensure_ascii=False,
    )


def _run_on_own_loop(coro: Any) -> Any:
    """Run ``coro`` on a private event loop, closed WITHOUT waiting for its worker threads.

    ``asyncio.run`` would wait for every leftover ``to_thread`` worker (e.g. a retrieval stuck
    on a locked store after its budget ended), so the tool could block past every budget.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()  # shuts its default executor down with wait=False


def make_specrag_tool(
    context: SpecRagContext | None = None,
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

    ``output="json"``: answer, verified, route, reason and sources as JSON; ``"text"``: one
    line, the answer and its sources (what small local agent models cite reliably).
    """
    if output not in ("json", "text"):
        raise ValueError(f"output must be 'json' or 'text', not {output!r}")
    fmt = format_result if output == "json" else format_text
    if graph is None:
        from specrag.graph.builder import graph as default_graph

        graph = default_graph
    ctx = context or SpecRagContext()

    async def arun(question: str) -> str:
        # A ToolException is handled by the tool (handle_tool_error): the agent reads the
        # line in a ToolMessage with status "error"; a direct call returns the line
        try:
            result = await graph.ainvoke({"question": question}, context=ctx)
        except InputError as exc:  # an empty or over-long question: the agent reads why
            raise ToolException(f"specrag: error: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - an agent's ToolNode re-raises: its run would end
            from specrag.errors import short_error

            log.warning("the specrag tool failed", exc_info=True)
            raise ToolException(f"specrag: error: {short_error(exc)}") from exc
        return fmt(result)

    def run(question: str) -> str:
        # The graph's nodes are async-only: run them on an event loop of our own. Inside a
        # running loop (Jupyter, an async agent calling the sync API) that loop lives in a
        # helper thread, since a loop cannot be nested in the thread that runs one.
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return _run_on_own_loop(arun(question))
        context = contextvars.copy_context()  # callbacks, tracing and config travel along
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specrag-tool") as pool:
            return pool.submit(context.run, _run_on_own_loop, arun(question)).result()

    return StructuredTool.from_function(
        func=run,
        coroutine=arun,
        name=name,
        description=description,
        args_schema=AskInput,
        handle_tool_error=True,  # a ToolException's line is the tool's output (status error)
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
