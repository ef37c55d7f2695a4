"""Running the graph the way the CLI, the notebooks and the benchmarks do.

``run_graph`` (optionally on a SQLite thread, optionally streaming the draft and the answer to
stderr), ``preload`` (load models before any budget starts) and ``result_json`` (the one JSON
view of a result that ``specrag ask --json`` prints).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from specrag.graph.context import SpecRagContext

err = Console(stderr=True, emoji=False)  # ":x:" in an answer is text, not an emoji
log = logging.getLogger(__name__)


def result_json(result: dict[str, Any]) -> dict[str, Any]:
    """The CLI's JSON view of a graph result."""
    timings = result.get("timings") or {}
    answer_s = timings.get("answer_s")
    return {
        "answer": result.get("answer", ""),
        "route": result.get("route", ""),
        "reason": result.get("reason", ""),
        "verified": result.get("verified", False),
        "query": result.get("query", ""),
        "draft": result.get("draft", ""),
        "draft_confidence": result.get("draft_confidence"),
        "draft_status": result.get("draft_status", ""),
        "draft_tokens": result.get("draft_tokens", 0),
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
            "answer_ttft_s": timings.get("answer_ttft_s"),
            "total_s": timings.get("total_s"),
            "ttft_s": timings.get("ttft_s"),
        },
        "batches": result.get("batches") or [],
        "revisions": result.get("revisions") or [],
        "stats": result.get("stats") or {},
        "errors": result.get("errors") or [],
        "evidence_complete": result.get("evidence_complete"),
    }


async def run_graph(
    question: str,
    ctx: Any,
    document: str | None,
    stream: bool,
    thread: str | None = None,
    locked: bool = False,
) -> dict[str, Any]:
    """Run the graph; with ``thread``, on a SQLite checkpointer that persists across runs.

    A run on a thread holds it (:func:`~specrag.persistence.thread_lock`; ``locked``: the
    caller holds it already): a second run on the thread waits for this one.
    """
    from specrag.graph.builder import build_graph, graph

    if not thread:
        return await _run(graph, run_inputs(question, document, False), ctx, stream, {})
    from specrag.persistence import keep_latest, sqlite_checkpointer, thread_lock

    if not locked:
        async with thread_lock(thread, lambda: log.info("thread %r is busy: waiting", thread)):
            return await run_graph(question, ctx, document, stream, thread, locked=True)
    async with sqlite_checkpointer() as saver:
        app = build_graph(checkpointer=saver)
        inputs = run_inputs(question, document, True)
        config: Any = {"configurable": {"thread_id": thread}}
        if inputs is None:  # --resume: a draft re-run after its retrieve finished stops at once
            from specrag.graph.signals import restore_signal

            restore_signal(await app.aget_state(config))
        result = await _run(app, inputs, ctx, stream, config)
        try:  # finished: only the latest checkpoint is needed
            await keep_latest(saver, thread)
        except Exception as exc:  # noqa: BLE001 - the answer stands; the file stays larger
            log.warning("could not prune the earlier checkpoints of thread %r: %s", thread, exc)
        return result


def run_inputs(question: str, document: str | None, conversation: bool) -> dict[str, Any] | None:
    """The graph's input; None resumes the thread's interrupted run.

    On a conversation (a thread) the question is a human message: the thread's earlier
    questions and answers become its history (``history_tokens``, follow-up queries).
    """
    if not question:
        return None
    inputs: dict[str, Any]
    if conversation:
        from langchain_core.messages import HumanMessage

        inputs = {"messages": [HumanMessage(question)]}
    else:
        inputs = {"question": question}
    if document is not None:
        inputs["document"] = document
    return inputs


@dataclass(frozen=True)
class Unfinished:
    """An interrupted run of a thread, as ``specrag ask --resume`` needs to know it."""

    nodes: tuple[str, ...]
    """The nodes it would go on with."""
    document: str = ""
    """Its own document (saved with it): it answers from that, so it needs no index."""

    @property
    def has_document(self) -> bool:
        """It answers from its own document."""
        return bool(self.document)

    @property
    def needs_index(self) -> bool:
        """Whether what is left of it searches the index (a run past retrieval does not)."""
        return not self.has_document and any(n in ("prepare", "retrieve") for n in self.nodes)


THREADS = "threads.json"  # in the data dir: each thread's latest run's command-line settings


def _threads() -> Any:
    """The records of :data:`THREADS` (a Records file of up to 4,096 threads)."""
    from specrag.models.records import Records
    from specrag.paths import data_dir

    return Records(data_dir() / THREADS, limit=4096)


def save_thread_settings(
    thread: str,
    overrides: dict[str, Any],
    document: str = "",
    pages: list[tuple[int, int]] | None = None,
) -> None:
    """Keep the settings a run of ``thread`` starts with, for ``specrag ask --resume``.

    ``document``: the file its ``--document`` text came from, which the resumed run cites;
    ``pages``: a PDF's page starts in that text (``join_pages``), so it cites pages too.
    """
    record: dict[str, Any] = {"settings": overrides}
    if document:
        record["document"] = document
    if pages:
        record["pages"] = [list(p) for p in pages]
    _threads().put(thread, record)


def thread_settings(thread: str) -> dict[str, Any]:
    """The settings the latest run of ``thread`` started with ({} when none were kept)."""
    found = (_threads().get(thread) or {}).get("settings")
    return found if isinstance(found, dict) else {}


def thread_document(thread: str) -> str:
    """The file the latest run of ``thread`` read its document from ("" when none)."""
    found = (_threads().get(thread) or {}).get("document")
    return found if isinstance(found, str) else ""


def thread_pages(thread: str) -> list[tuple[int, int]]:
    """Where each page of the latest run's PDF starts in its text ([] when not a PDF)."""
    found = (_threads().get(thread) or {}).get("pages")
    if not isinstance(found, list):
        return []
    return [
        (p[0], p[1])
        for p in found
        if isinstance(p, list) and len(p) == 2 and all(isinstance(n, int) for n in p)
    ]


async def check_checkpoints() -> None:
    """Open the thread checkpoints once, before any model loads.

    An unusable data dir or a corrupt file is one line
    (:class:`~specrag.errors.DataDirError`) then, not after the models loaded.
    """
    from specrag.persistence import sqlite_checkpointer

    async with sqlite_checkpointer(check=True):
        pass


async def unfinished_run(thread: str) -> Unfinished | None:
    """The interrupted run of ``thread``; None when it has none.

    None both for a thread never run and for one whose last run finished.
    """
    from specrag.graph.builder import build_graph
    from specrag.persistence import sqlite_checkpointer

    async with sqlite_checkpointer() as saver:
        state = await build_graph(checkpointer=saver).aget_state(
            {"configurable": {"thread_id": thread}}
        )
    if not state.next:
        return None
    values = state.values or {}
    # stopped before its prepare: ``run_document`` is still the run before it's, its own
    # document is the input (empty without one: it asks the index)
    document = values.get("document") if "prepare" in state.next else values.get("run_document")
    return Unfinished(tuple(state.next), str(document or ""))


async def _run(
    app: Any, inputs: dict[str, Any] | None, ctx: Any, stream: bool, config: dict[str, Any]
) -> dict[str, Any]:
    """Invoke, or stream the draft then the answer live on stderr."""
    if not stream:
        return await app.ainvoke(inputs, config=config or None, context=ctx)
    final: dict[str, Any] = {}
    current, shown = None, ""
    cut = False  # a note was printed inside the draft's line: its next words go on a fresh one

    def label(node: str | None) -> str:
        return "draft (unverified)" if node == "draft" else f"answer ({node})"

    def redraw() -> None:  # the text so far, on a fresh line below a note
        err.print(f"\n[dim]{label(current)}:[/dim] ", end="")
        err.print(shown, end="", highlight=False, markup=False)

    async for mode, payload in app.astream(
        inputs, config=config or None, context=ctx, stream_mode=["messages", "custom", "values"]
    ):
        event = payload.get("event") if mode == "custom" else None
        if mode == "messages":
            chunk, meta = payload
            if getattr(chunk, "name", None) == "specrag":  # a conversation's appended answer:
                continue  # its tokens were streamed already
            node = meta.get("langgraph_node")
            # .text, not .content: a provider's content may be a list of parts (Anthropic,
            # OpenAI's Responses API), which `shown +=` failed on mid-answer
            text = chunk.text if isinstance(getattr(chunk, "text", None), str) else ""
            if node != current and text:
                current, shown, cut = node, "", False
                err.print(f"\n[dim]{label(node)}:[/dim] ", end="")
            elif cut and text:  # the draft goes on below a note (draft_policy="complete")
                cut = False
                redraw()
            if text:
                shown += text
                err.print(text, end="", highlight=False, markup=False)
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
            elif shown:  # the draft, only if it goes on: it usually stops at the evidence
                cut = True
        elif event == "answer_failed":  # the text shown so far is not the answer
            err.print(
                f"\n[dim]{escape(str(payload['node']))} failed: "
                f"{escape(str(payload['error']))}[/dim]",
                end="",
            )
            current, shown = None, ""  # the next node's text starts on a fresh line
        elif event == "revise":  # the new evidence retracts the end of the answer: redraw
            err.print(
                f"\n[dim]revised: retracted {escape(repr(payload['dropped_text']))}[/dim]", end=""
            )
            # the node whose text it cuts (a remote draft's stop sequence too); an event
            # without one is the answer's, of which nothing was shown while the draft streamed
            node = payload.get("node")
            if (node == current) if node else current not in (None, "draft"):
                shown, cut = shown[: payload["keep"]], False
                redraw()
        elif mode == "values":
            final = payload
    err.print()
    return final


def preload(
    ctx: SpecRagContext | dict[str, Any],
    document: str | None = None,
    *,
    index: bool | None = None,
    started: float | None = None,
    quiet: bool = False,
) -> float:
    """Load models and open the index before a run starts; returns seconds.

    ``ctx``: a :class:`SpecRagContext`, or a dict of its settings (as a graph run takes).

    A run loads its models itself, before its origin (``load_s``, outside every budget), but
    opens the index, and loads its BM25 side (``retrieval`` bm25 or hybrid), inside its
    retrieval budget: on a busy machine a process's first question could time out into the
    fallback route. ``index``: whether runs will search the index (default: unless a
    ``document`` is given). Sets the process's RAPID prefix cache budgets to the context's
    (``prefix_cache_mib``, ``prefix_cache_disk_mib``: evicted and pruned down to them now).
    Prints a note on stderr (``quiet``: none), timed from ``started``
    (``perf_counter``; the caller's loading began there) or its call.
    """
    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import Services, default_chat_model

    if isinstance(ctx, dict):  # as graph.ainvoke(..., context={...}) takes it
        ctx = SpecRagContext(**ctx)
    started = time.perf_counter() if started is None else started
    # the draft model first: one that cannot load is the run's error, said before the answer
    # model's warm-up leaves it out as that model's drafter (a warning, then the error)
    specs = dict.fromkeys(([ctx.draft_spec] if ctx.drafter_runs else []) + [ctx.answer_spec])
    # said first: a new cache converts the weights (~20 s and more) before the line below
    # a remote model loads nothing here: its time is the embedding model's (a trial read
    # "loading models (openai:gpt-4o-mini) ... ready in 3.8s" as the provider's)
    from specrag.models.registry import local_model_name

    named = ", ".join(s if local_model_name(s) else f"{s} - remote, nothing to load" for s in specs)
    if not quiet:
        err.print(f"[dim]loading models ({escape(named)}) ...[/dim]", soft_wrap=True)
    services = Services()
    for spec in specs:
        services.warm(default_chat_model(spec, ctx))
    services.warm_retriever(ctx, document)
    from specrag.decoding.prefix_cache import DEFAULT_PREFIX_CACHE

    # the process's RAPID prefix cache takes this context's budgets (evicted and pruned down
    # to them now); a run's own settings only bound what that run reads and keeps there
    DEFAULT_PREFIX_CACHE.limit(ctx.prefix_cache_mib * 2**20, ctx.prefix_cache_disk_mib * 2**20)
    if document is None if index is None else index:
        from specrag.graph.services import open_index

        opened = open_index(ctx)  # a corrupt index is reported here, as one line
        if ctx.retrieval != "dense":  # read (or built) once, here, not in the first search;
            try:  # one that fails here is the search's to retry, and its route's to take
                opened.refresh_lexical()
            except Exception as exc:  # noqa: BLE001
                from specrag.errors import short_error

                log.warning("could not read the index's BM25 side: %s", short_error(exc))
    seconds = time.perf_counter() - started
    if not quiet:
        err.print(f"[dim]models ready in {seconds:.1f}s[/dim]")
    return seconds
