"""Running the graph the way the CLI, the notebooks and the benchmarks do.

``run_graph`` (optionally on a SQLite thread, optionally streaming the draft and the answer to
stderr), ``preload`` (load models before any budget starts) and ``result_json`` (the one JSON
view of a result that ``specrag ask --json`` prints).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markup import escape

err = Console(stderr=True)


def result_json(result: dict[str, Any]) -> dict[str, Any]:
    """The CLI's JSON view of a graph result."""
    timings = result.get("timings") or {}
    answer_s = timings.get("answer_s")
    return {
        "answer": result.get("answer", ""),
        "route": result.get("route", ""),
        "reason": result.get("reason", ""),
        "verified": result.get("verified", False),
        "draft": result.get("draft", ""),
        "draft_confidence": result.get("draft_confidence"),
        "sources": [
            {
                "n": c.get("n"),
                "source": c.get("source"),
                "score": c.get("score"),
                **({"page": c["page"]} if "page" in c else {}),  # a PDF page's chunk
            }
            for c in result.get("citations") or []
        ],
        "seed": result.get("seed"),
        "timings": {
            "load_s": timings.get("load_s"),
            "document_index_s": timings.get("document_index_s"),
            "retrieve_s": timings.get("retrieve_s"),
            "draft_s": timings.get("draft_s"),
            "draft_ttft_s": timings.get("draft_ttft_s"),
            "answer_s": answer_s,
            "total_s": timings.get("total_s"),
            "ttft_s": timings.get("ttft_s"),
        },
        "batches": result.get("batches") or [],
        "revisions": result.get("revisions") or [],
        "stats": result.get("stats") or {},
        "errors": result.get("errors") or [],
    }


async def run_graph(
    question: str, ctx: Any, document: str | None, stream: bool, thread: str | None = None
) -> dict[str, Any]:
    """Run the graph; with ``thread``, on a SQLite checkpointer that persists across runs."""
    from specrag.graph.builder import build_graph, graph

    if not thread:
        return await _run(graph, question, ctx, document, stream, {})
    from specrag.persistence import sqlite_checkpointer

    async with sqlite_checkpointer() as saver:
        app = build_graph(checkpointer=saver)
        return await _run(
            app, question, ctx, document, stream, {"configurable": {"thread_id": thread}}
        )


async def unfinished_run(thread: str) -> tuple[str, ...] | None:
    """The nodes the interrupted run of ``thread`` would go on with; None when it has none.

    None both for a thread never run and for one whose last run finished.
    """
    from specrag.graph.builder import build_graph
    from specrag.persistence import sqlite_checkpointer

    async with sqlite_checkpointer() as saver:
        state = await build_graph(checkpointer=saver).aget_state(
            {"configurable": {"thread_id": thread}}
        )
    return tuple(state.next) or None


async def _run(
    app: Any, question: str, ctx: Any, document: str | None, stream: bool, config: dict[str, Any]
) -> dict[str, Any]:
    """Invoke, or stream the draft then the answer live on stderr."""
    inputs: dict[str, Any] | None = {"question": question} if question else None
    if document is not None and inputs is not None:
        inputs["document"] = document
    if not stream:
        return await app.ainvoke(inputs, config=config or None, context=ctx)
    final: dict[str, Any] = {}
    current, shown = None, ""

    def redraw() -> None:  # the answer so far, on a fresh line below a note
        err.print(f"\n[dim]answer ({current}):[/dim] ", end="")
        err.print(shown, end="", highlight=False, markup=False)

    async for mode, payload in app.astream(
        inputs, config=config or None, context=ctx, stream_mode=["messages", "custom", "values"]
    ):
        event = payload.get("event") if mode == "custom" else None
        if mode == "messages":
            chunk, meta = payload
            node = meta.get("langgraph_node")
            if node != current and chunk.content:
                current, shown = node, ""
                label = "draft (unverified)" if node == "draft" else f"answer ({node})"
                err.print(f"\n[dim]{label}:[/dim] ", end="")
            if chunk.content:
                shown += chunk.content
                err.print(chunk.content, end="", highlight=False, markup=False)
        elif event == "route":
            err.print(
                f"\n[dim]route -> {escape(payload['route'])}: {escape(payload['reason'])}[/dim]",
                end="",
            )
        elif event == "batch":
            source = escape(str(payload["source"]))
            err.print(
                f"\n[dim]evidence batch ({source}, {len(payload['chunks'])} chunks) "
                f"at {payload['arrival_s']:.2f}s[/dim]",
                end="",
            )
            if shown and current != "draft":  # the answer goes on below the note
                redraw()
        elif event == "revise":  # the new evidence retracts the end of the answer: redraw
            shown = shown[: payload["keep"]]
            err.print(
                f"\n[dim]revised: retracted {escape(repr(payload['dropped_text']))}[/dim]", end=""
            )
            redraw()
        elif mode == "values":
            final = payload
    err.print()
    return final


def preload(ctx: Any, document: str | None = None) -> float:
    """Load models (and open the index) before the first budget starts; returns seconds.

    The first run of a process otherwise loads them inside its budgets (the index is opened
    within the retrieval budget, so on a busy machine a first question can time out into the
    fallback route). Prints a note on stderr.
    """
    from specrag.graph.services import Services, default_chat_model

    started = time.perf_counter()
    services = Services()
    specs = [ctx.answer_spec] + ([ctx.draft_spec] if ctx.draft_policy != "off" else [])
    for spec in dict.fromkeys(specs):
        services.warm(default_chat_model(spec, ctx))
    services.warm_retriever(ctx, document)
    if document is None:
        from specrag.graph.services import open_index

        open_index(ctx)  # a corrupt index is reported here, as one line
    seconds = time.perf_counter() - started
    err.print(f"[dim]models ready in {seconds:.1f}s[/dim]")
    return seconds
