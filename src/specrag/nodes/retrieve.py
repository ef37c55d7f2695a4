"""``retrieve``: search the index (or the run's document) under the retrieval budget."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from langgraph.constants import TAG_NOSTREAM
from langgraph.runtime import Runtime

from specrag import prompts
from specrag.errors import short_error
from specrag.graph.context import SpecRagContext
from specrag.graph.routing import against
from specrag.graph.services import SEARCH_DEADLINE, Services
from specrag.graph.signals import EvidenceStream, open_evidence_stream, retrieval_signal
from specrag.graph.state import State
from specrag.indexing.documents import Chunk
from specrag.indexing.store import Batch
from specrag.models.options import DecodeOptions
from specrag.nodes.answer import LATER_BATCHES
from specrag.nodes.prepare import in_own_thread, quietly
from specrag.nodes.streaming import emit, now, resumed_origin, stream_model

# the share of the retrieval budget a model's follow-up rewrite may take (the search the rest)
REWRITE_SHARE = 0.5


async def followup_query(
    question: str, history: list[dict[str, str]], ctx: SpecRagContext, services: Services
) -> str:
    """The retrieval query: a follow-up question made self-contained from the history.

    ``concat``: the previous user question, then this one ("Who was the Norse leader? And
    when did he die?"); ``model``: the draft model rewrites it (greedy, <= 32 tokens, within
    ``REWRITE_SHARE`` of the retrieval budget: the search gets the rest; an empty, failed or
    late rewrite falls back to ``concat``); ``off`` or no history: the question itself.
    """
    previous = [t["content"] for t in history if t["role"] == "user"]
    if ctx.query_rewrite == "off" or not previous:
        return question
    concat = f"{previous[-1]} {question}"
    if ctx.query_rewrite == "concat":
        return concat
    share = ctx.retrieval_timeout_s * REWRITE_SHARE  # the search waits within the same budget
    try:
        async with asyncio.timeout(share):  # a model that never answers: its budget ends it
            result = await stream_model(
                services.chat_model(ctx.draft_spec, ctx),
                prompts.query_rewrite_messages(question, history),
                budget_s=share,
                tags=["query_rewrite", TAG_NOSTREAM],  # not an answer: off the messages stream
                options=DecodeOptions(temperature=0.0, max_new_tokens=32, speculation="none"),
            )
        text = result.text.strip('"').splitlines()
        if result.timed_out or not text or not text[0].strip():  # late or empty: no query
            return concat
        return text[0].strip()
    except Exception:  # noqa: BLE001 - rewriting is an aid: never fail retrieval over it
        return concat


def ended_by(budget: asyncio.Timeout, exc: BaseException) -> bool:
    """``exc`` is ``budget``'s end, not a TimeoutError of the store's own ("the index is busy")."""
    return isinstance(exc, TimeoutError) and budget.expired()


def ended_why(ctx: SpecRagContext, timed_out: bool, exc: BaseException) -> str:
    """Why later batches ended: the retrieval budget, or the store's own error."""
    if timed_out:
        return f"missed the {ctx.retrieval_timeout_s}s retrieval budget"
    return f"failed: {short_error(exc)}"


def ranked_below(ctx: SpecRagContext) -> str:
    """A later batch's re-ranking left no chunk relevant."""
    return f"ranked every chunk below relevance_threshold {ctx.relevance_threshold}"


def answering_from(why: str, n: int) -> str:
    """The error of a run answering from the evidence earlier batches found."""
    return f"{LATER_BATCHES} {why}; answering from the {n} relevant chunk(s) found before"


async def next_batch(batches: Iterator[Batch], n: int, ctx: SpecRagContext) -> Batch | None:
    """The next batch of a search (``n`` delivered so far), after its injected delay."""
    batch = await in_own_thread(lambda: next(batches, None))
    if batch is not None and n > 0 and ctx.added_batch_latency_s > 0:  # benchmarks only
        await asyncio.sleep(ctx.added_batch_latency_s)
    return batch


class Delivered:
    """What a search delivered so far: the evidence in its canonical order, and the batches."""

    def __init__(self, ctx: SpecRagContext, document: str | None, start: float) -> None:
        self.ctx, self.document, self.start = ctx, document, start
        self.evidence: list[Chunk] = []
        self.records: list[dict[str, Any]] = []
        # the relevant chunks of the last batch that had any: a fused re-ranking may drop
        # them all for chunks below the threshold (both policies answer from these then)
        self.kept: list[dict[str, Any]] = []

    @property
    def found(self) -> list[dict[str, Any]]:
        """Every chunk found so far, best first."""
        return [c.as_dict() for c in self.evidence]

    def add(self, batch: Batch) -> bool:
        """Record a batch; True when it changed the evidence that counts (relevant chunks)."""
        before = [c["id"] for c in self.relevant(self.found)]
        dropped = {c.id for c in self.evidence}
        self.evidence = batch.after(self.evidence)
        dropped -= {c.id for c in self.evidence}
        record: dict[str, Any] = {
            "source": batch.source,
            "chunks": [c.id for c in batch.chunks],
            "arrival_s": round(now() - self.start, 4),
        }
        if dropped:  # re-ranked out of the top k by this batch
            record["dropped"] = sorted(dropped)
        self.records.append(record)
        now_relevant = self.relevant(self.found)
        if now_relevant:
            self.kept = now_relevant
        return [c["id"] for c in now_relevant] != before

    def relevant(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Chunks at or above the relevance threshold (a run's document: all of them)."""
        if self.document:
            return chunks  # the document is the user's chosen evidence
        return [c for c in chunks if c["score"] >= self.ctx.relevance_threshold]


def make_retrieve(services: Services):  # noqa: ANN201 - a node function
    """Build the retrieve node.

    The search delivers batches, most relevant first. ``answer_policy="wait"`` collects them
    all; ``"incremental"`` returns with the first batch that holds evidence and keeps
    searching in a task whose batches the answer node weaves in (:class:`EvidenceStream`),
    within the same retrieval budget.
    """

    async def retrieve(state: State, runtime: Runtime[SpecRagContext]) -> dict[str, Any]:
        ctx = runtime.context or SpecRagContext()
        entered = now()  # a resumed run's origin: its re-indexing below counts in total_s
        question = state.get("question", "")
        document = state.get("run_document") or None
        incremental = ctx.answer_policy == "incremental" and not document
        if document:  # indexed by prepare (a cache hit); a run resumed in a new process
            # indexes it here, outside the retrieval budget, as prepare would have (a failure:
            # the search below meets it and says why)
            await quietly(lambda: services.index_document(ctx, document), stoppable=True)
        start = now()
        got = Delivered(ctx, document, start)
        update: dict[str, Any] = {"query": question}
        batches: Iterator[Batch] = iter(())
        done = True
        budget = asyncio.timeout(ctx.retrieval_timeout_s)
        try:

            async def search() -> bool:
                nonlocal batches
                query = await followup_query(question, state.get("history") or [], ctx, services)
                update["query"] = query
                if ctx.added_retrieval_latency_s > 0:  # injected (benchmarks only)
                    await asyncio.sleep(ctx.added_retrieval_latency_s)
                SEARCH_DEADLINE.set(budget.when())  # the search's threads see it (loop clock)
                batches = services.retrieve_batches(query, document, ctx)
                while (batch := await next_batch(batches, len(got.records), ctx)) is not None:
                    if got.add(batch) and incremental:
                        return False  # evidence: answer now, weave the rest in later
                return True

            async with budget:
                done = await search()
            searching = not done  # an incremental run's search goes on in a task
            relevant = got.relevant(got.found)
            status = "ok" if relevant or got.kept else ("irrelevant" if got.found else "empty")
            update.update(chunks=relevant or got.kept, retrieval_status=status)
            if not relevant and got.kept:  # as the incremental policy answers: from before
                done = False
                update["errors"] = [answering_from(ranked_below(ctx), len(got.kept))]
            elif got.found and not relevant:
                best = max(c["score"] for c in got.found)
                update["errors"] = [
                    f"retrieve: best score {against(best, ctx.relevance_threshold)} < "
                    "relevance_threshold "
                    f"{ctx.relevance_threshold}"
                ]
        except Exception as exc:  # noqa: BLE001 - the fallback route, or ...
            timed_out = ended_by(budget, exc)
            relevant = got.relevant(got.found) or got.kept
            if relevant:  # ... the evidence earlier batches found, which stays good evidence
                update.update(chunks=relevant, retrieval_status="ok")
                update["errors"] = [answering_from(ended_why(ctx, timed_out, exc), len(relevant))]
                done = False  # the evidence is what arrived in time, not all there was
            else:
                update.update(chunks=[], retrieval_status="timeout" if timed_out else "failed")
                update["errors"] = [
                    f"retrieve: no result within {ctx.retrieval_timeout_s}s"
                    if timed_out
                    else f"retrieve: {short_error(exc)}"
                ]
        else:
            if searching and update["retrieval_status"] == "ok":
                stream_rest(state, ctx, got, batches, start + ctx.retrieval_timeout_s)
        update["evidence_complete"] = done
        update["batches"] = [dict(r) for r in got.records]
        if update["retrieval_status"] == "ok":
            # "draft while you wait" stops now. Without evidence the draft runs on within its
            # own budget: it may become the run's (unverified) answer.
            retrieval_signal(dict(state)).set()
        update["timings"] = {"retrieve_s": round(now() - start, 4)}
        emit(
            {
                "event": "retrieved",
                "status": update["retrieval_status"],
                "chunks": len(update["chunks"]),
                "retrieve_s": update["timings"]["retrieve_s"],
                "batches": len(got.records),
                "complete": done,
            }
        )
        return {**update, **resumed_origin(dict(state), entered)}

    return retrieve


def stream_rest(
    state: State,
    ctx: SpecRagContext,
    got: Delivered,
    batches: Iterator[Batch],
    deadline: float,
) -> EvidenceStream:
    """Search on in a task; each later batch's evidence goes to the run's evidence stream."""
    stream = open_evidence_stream(dict(state))
    stream.records = got.records  # the answer node reports every batch, later ones included
    stream.delivered = len(got.records)

    async def rest() -> None:
        budget = asyncio.timeout(max(0.0, deadline - now()))
        emptied = ""  # the note of a re-ranking that left nothing relevant, while it holds
        try:
            async with budget:
                while (batch := await next_batch(batches, len(got.records), ctx)) is not None:
                    if got.add(batch):
                        # the stream event now; the trace's copy goes on the answer node's
                        # run (this task outlives retrieve, whose run is posted already)
                        emit({"event": "batch", **got.records[-1]}, traced=False)
                        # got.kept: the evidence the answer has now
                        if relevant := got.relevant(got.found):
                            if emptied:  # a later batch brought relevant evidence back (a
                                stream.errors.remove(emptied)  # reranker): the answer has
                                stream.partial, emptied = False, ""  # it all, as in wait mode
                            await stream.queue.put(relevant)
                        elif not stream.partial:  # a fused re-ranking dropped every
                            stream.partial = True  # relevant chunk (said once): the answer
                            emptied = answering_from(ranked_below(ctx), len(got.kept))
                            stream.errors.append(emptied)  # keeps the evidence it was given
        except Exception as exc:  # noqa: BLE001 - the answer keeps the evidence it has
            stream.partial = True  # as a wait-mode run says it: not all the evidence there was
            stream.errors.append(
                answering_from(ended_why(ctx, ended_by(budget, exc), exc), len(got.kept))
            )
        finally:
            stream.queue.put_nowait(None)

    stream.task = asyncio.create_task(rest())
    return stream
