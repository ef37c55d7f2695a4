"""Injected faults end in the documented route within the configured budgets.

A hung component waits on an event that is set only after the run has ended (at most
``HANG_S``), so a run the budget did not cut takes ``HANG_S``: the bound below fails it, and
one cut an order of magnitude late, while leaving a busy machine ample slack (not a speed
claim: a budget cut at 0.5 s ends the run in ~1 s here).
"""

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specrag import build_graph, prompts
from specrag.indexing.store import Batch
from specrag.runner import result_json
from tests.fakes import (
    HANG_S,
    FakeLogprobChat,
    chunk,
    ctx,
    failing_once,
    services,
    two_batches,
)

CUT = 8.0  # seconds: ~8x a run whose budget cut it, far below HANG_S
assert CUT < HANG_S / 2


@pytest.fixture
def hang() -> Iterator[threading.Event]:
    """An event a hung fake waits on; ``timed`` sets it as the run ends (and so does teardown)."""
    event = threading.Event()
    yield event
    event.set()


async def timed(svc, release: threading.Event | None = None, **kw):
    """The run's result and seconds; ``release`` (a hung fake's event) is set as it ends, so
    the hung thread finishes before the event loop closes (the loop waits for its threads)."""
    start = time.perf_counter()
    try:
        question = {"question": "capital of France?"}
        result = await build_graph(svc).ainvoke(question, context=ctx(**kw))
    finally:
        elapsed = time.perf_counter() - start
        if release is not None:
            release.set()
    return result, elapsed


def incremental(answer=None, wait=None, *, batches=None, grace=0.0, **kw):
    """``timed`` of an incremental run: evidence from ``batches`` or :func:`two_batches`
    (batch 2 after ``wait()``), drafting off (a coroutine: await it, or make it a task)."""
    svc = dataclasses.replace(
        services(**({"answer": answer} if answer is not None else {})),
        batch_retriever=batches or two_batches(wait),
    )
    return timed(
        svc, answer_policy="incremental", incremental_grace_s=grace, draft_policy="off", **kw
    )


async def test_hanging_draft_model_is_cut_at_its_budget(hang):
    hung = FakeLogprobChat(reply="never", hold=hang, calls=[])
    result, elapsed = await timed(services(draft=hung), hang, draft_timeout_s=0.5)
    assert result["route"] == "generate" and "draft timeout" in result["reason"]
    assert result["answer"] == "Paris."
    assert elapsed < CUT


async def test_a_budget_spent_before_the_model_is_called_is_said_so():
    """Fitting the evidence took what was left of a tiny answer budget; the model was called
    with a negative budget and the reason read "no answer within -0.000712s"."""

    class SlowFit(FakeLogprobChat):
        def prompt_fits(self, messages, max_new_tokens):
            time.sleep(0.05)
            return True

    found = [chunk("Paris.", n=n) for n in range(2)]
    model = SlowFit(reply="Paris.", calls=[])
    result, _ = await timed(
        services(answer=model, chunks=found), answer_timeout_s=0.01, draft_policy="off"
    )
    assert "TimeoutError: the answer budget of 0.01s is spent" in result["reason"], result
    assert "within -" not in result["reason"] and not model.calls


async def test_hanging_answer_model_ends_in_fallback_within_one_answer_budget(hang):
    # refine and the generate that follows its failure share ONE answer budget (issue 9 #6)
    hung = FakeLogprobChat(reply="never", hold=hang, calls=[])
    result, elapsed = await timed(services(answer=hung), hang, answer_timeout_s=0.5)
    assert result["route"] == "fallback"
    assert "refine: RuntimeError: no answer within 0.5s" in result["reason"]
    assert "generate: TimeoutError: the answer budget of 0.5s is spent" in result["reason"]
    assert result["answer"].startswith(prompts.UNCHECKED_PREFIX)
    # evidence WAS found: the answer must not claim that none was (review finding)
    assert not result["answer"].startswith(prompts.UNVERIFIED_PREFIX)
    assert elapsed < CUT


async def test_hanging_retriever_is_cut_at_its_budget(hang):
    result, elapsed = await timed(services(retrieve_hold=hang), hang, retrieval_timeout_s=0.4)
    assert result["route"] == "fallback" and "timed out" in result["reason"]
    assert elapsed < CUT


async def test_failing_everything_still_answers():
    svc = services(
        draft=FakeLogprobChat(fail=True, calls=[]),
        answer=FakeLogprobChat(fail=True, calls=[]),
        retrieve_error=RuntimeError("store down"),
    )
    result, _ = await timed(svc)
    assert result["route"] == "fallback"
    assert result["answer"] == prompts.SEARCH_FAILED_ANSWER  # not "could not find evidence"
    assert len(result["errors"]) == 2


async def test_failing_answer_over_streamed_evidence_ends_in_fallback_with_all_of_it():
    # incremental evidence and a remote answer model that fails after the last batch: the
    # failure path weaves the stream again and must find its end, not wait forever
    async with asyncio.timeout(20):
        result, _ = await incremental(
            FakeLogprobChat(fail=True, calls=[]), lambda: time.sleep(0.05)
        )
    assert result["route"] == "fallback" and "model exploded" in result["reason"]
    assert [c["id"] for c in result["chunks"]] == ["id1", "id0"]
    assert [b["source"] for b in result["batches"]] == ["dense", "hybrid"]


def emptying_batches(then: Exception | None = None):
    """Batch 1: the best dense hit (relevant); batch 2: a fused ranking of a chunk below the
    threshold only (re-ranking drops the hit); then ``then`` raised, if given."""
    first = chunk("Paris is the capital of France.", n=0)
    low = chunk("Lyon has a large old town.", score=0.05, n=1)

    def batches(query, document, ctx):
        yield Batch("dense", [first])
        time.sleep(0.05)
        yield Batch("hybrid", [low], [low])
        if then is not None:
            raise then

    return batches


async def test_an_incremental_answer_keeps_its_evidence_when_a_re_ranking_drops_all_of_it():
    """Hybrid search: batch 1 is the best dense hit (relevant), batch 2 the fused ranking,
    which may leave it out for chunks that all score below the threshold. The incremental
    answer was rebuilt on no evidence at all and still reported verified, citing nothing
    (a review of the graph, 2026-12-05)."""
    result, _ = await incremental(batches=emptying_batches())
    assert result["route"] == "generate" and result["verified"]
    assert [c["id"] for c in result["chunks"]] == ["id0"]  # the evidence it answered from
    assert [c["source"] for c in result["citations"]] == ["doc.txt"]
    assert any("ranked every chunk below relevance_threshold" in e for e in result["errors"])
    assert [b["source"] for b in result["batches"]] == ["dense", "hybrid"]


async def test_a_late_or_failing_later_batch_keeps_the_evidence_found_before():
    """answer_policy="wait": batch 1 found the evidence, batch 2 hangs or fails. The answer
    comes from batch 1's evidence, the errors say the evidence is incomplete and why; before,
    both cases threw that evidence away and answered "no evidence found" (fallback)."""
    first = chunk("Paris is the capital of France.", n=0)
    release = threading.Event()  # set once the run has ended: batch 2 misses any budget

    def hanging(query, document, ctx):
        yield Batch("dense", [first])
        release.wait(30)
        yield Batch("hybrid", [first])

    def failing(query, document, ctx):
        yield Batch("dense", [first])
        raise RuntimeError("store down")

    for batches, why in (
        (hanging, "later batches missed the 2.0s retrieval budget"),
        (failing, "later batches failed: RuntimeError: store down"),
    ):
        svc = dataclasses.replace(services(), batch_retriever=batches)
        try:  # 2 s: batch 1 comes at once, even on a loaded machine
            result, _ = await timed(svc, retrieval_timeout_s=2.0, draft_policy="off")
        finally:
            release.set()
        assert result["route"] == "generate" and result["answer"] == "Paris.", result["reason"]
        assert [c["id"] for c in result["chunks"]] == ["id0"]
        assert any(why in e and "from the 1 relevant chunk(s)" in e for e in result["errors"])
        # in the graph's output (a review, 2026-12-07: a State key only, so ainvoke and
        # `ask --json` never showed what README's route table says)
        assert result["evidence_complete"] is False
        assert result_json(result)["evidence_complete"] is False


@pytest.mark.parametrize("policy", ["wait", "incremental"])
@pytest.mark.parametrize("hang", [False, True], ids=["store-timeout", "budget-end"])
async def test_a_later_batchs_timeout_is_told_once_and_as_what_it_was(policy, hang):
    """A store's own TimeoutError in a later batch was reported as the retrieval budget's end
    (and, for a while, an incremental answer told every later-batch error twice)."""
    release = threading.Event()

    def later(query, document, ctx):
        yield Batch("dense", [chunk("Paris is the capital of France.", n=0)])
        if hang:
            release.wait(30)
        raise TimeoutError("the index is busy")

    svc = dataclasses.replace(services(), batch_retriever=later)
    try:
        result, _ = await timed(
            svc,
            answer_policy=policy,
            incremental_grace_s=0.0,
            draft_policy="off",
            retrieval_timeout_s=2.0,
        )
    finally:
        release.set()
    assert result["answer"] == "Paris.", result["reason"]
    later_errors = [e for e in result["errors"] if "later batches" in e]
    why = "missed the 2.0s retrieval budget" if hang else "failed: TimeoutError: the index is busy"
    assert len(later_errors) == 1 and why in later_errors[0], later_errors


async def test_a_failing_search_without_evidence_still_ends_in_fallback():
    def failing(query, document, ctx):
        yield Batch("dense", [chunk("unrelated", score=0.01)])  # below relevance_threshold
        raise RuntimeError("store down")

    svc = dataclasses.replace(services(), batch_retriever=failing)
    result, _ = await timed(svc, draft_policy="off")
    assert result["route"] == "fallback" and "retrieval failed" in result["reason"]
    assert "retrieve: RuntimeError: store down" in result["errors"]


def test_a_hanging_index_open_does_not_gather_a_stuck_thread_per_run():
    """A store that hangs while it opens holds the index lock; each later run's retrieval
    thread gives up after its budget (the budget ended the run's wait, never its thread)."""
    from specrag.graph import services as services_module

    with services_module._INDEX_LOCK:  # another run, stuck inside open_index
        start = time.perf_counter()
        with pytest.raises(TimeoutError, match="the index is busy"):
            services_module.open_index(ctx(retrieval_timeout_s=0.2))
        assert time.perf_counter() - start < CUT  # the lock is never released here


def test_an_open_index_is_searched_while_another_run_opens_another():
    """Every search took the index lock, its index open or not: a run stuck opening one
    index (a hung server) made every run on an index already open fail as "busy"."""
    from specrag.graph import services as services_module

    c = ctx(retrieval_timeout_s=0.2, index_dir="/nonexistent/open-already")
    key = (str(Path(c.index_dir)), c.collection, c.embedding_model)
    services_module._INDEXES[key] = opened = object()
    try:
        with services_module._INDEX_LOCK:  # another run, stuck opening another index
            assert services_module.open_index(c) is opened
    finally:
        services_module._INDEXES.pop(key)


def test_embeddings_never_wait_behind_a_model_load():
    """Another run loading a language model (minutes for a large one) held the lock the
    embeddings needed too, so a concurrent run's retrieval spent its budget waiting."""
    import threading

    from specrag.models import loading

    loading.load_embeddings()  # loaded once per process
    got = []
    with loading._LM_CACHE_LOCK:  # a model load in progress elsewhere
        worker = threading.Thread(target=lambda: got.append(loading.load_embeddings()))
        worker.start()
        worker.join(5.0)
        waited = worker.is_alive()  # still blocked while the model load holds its lock
    worker.join()
    assert got and not waited


async def test_an_incremental_answer_cites_the_evidence_it_read_not_a_batch_after_it():
    """A batch offered to a local decode that ended before reading it (its budget, or here a
    decode that never takes new prompts) replaced the cited chunks all the same, and the
    evidence was reported complete: citation numbers pointed at sources the answer never
    saw. The answer's evidence is the last prompt it read."""
    from tests.unit.test_budgets import SlowLocal

    later = threading.Event()
    batches = two_batches(lambda: later.wait(5))  # batch 2 once the answer is decoding

    class Deaf(SlowLocal):  # a local decode that never takes a new prompt from its feed
        def _job(self, messages, options):
            job = super()._job(messages, options)
            produce = job.produce

            def steps(should_stop):
                for i, step in enumerate(produce(should_stop)):
                    if i == 2:
                        later.set()
                    yield step

            job.produce = steps
            return job

    async with asyncio.timeout(20):
        result, _ = await incremental(Deaf(steps=40, step_s=0.01), batches=batches)
    assert result["route"] == "generate" and result["answer"].startswith("t0 t1")
    assert [c["id"] for c in result["chunks"]] == ["id0"]  # what the answer read
    assert [b["source"] for b in result["batches"]] == ["dense", "hybrid"]
    assert any("later batches were not woven in" in e for e in result["errors"])


async def test_a_remote_answers_wait_for_the_evidence_is_part_of_its_budget():
    """A remote answer model waits for the later batches (it cannot re-verify): that wait was
    not charged to the one answer budget (the model got the whole budget again after it), then
    it was, but it lasted until the search's end (4 s for a 1 s budget, then the fallback with
    evidence found). It waits half the budget at most and answers from the batches so far."""
    # batch 2 past the 2 s answer budget, within the 10 s retrieval budget
    async with asyncio.timeout(20):
        result, _ = await incremental(
            None, lambda: time.sleep(4), answer_timeout_s=2.0, retrieval_timeout_s=10.0
        )
    assert result["route"] == "generate", result["reason"]
    assert result["timings"]["answer_s"] < 2.0  # a 1 s wait, and a second to spare
    assert [c["id"] for c in result["citations"]] == ["id0"]  # the first batch's
    assert (
        "retrieve: later batches were not woven in: the answer model cannot re-verify, and "
        "waited for them 50% of what was left of answer_timeout_s=2.0" in result["errors"]
    ), result["errors"]


async def test_an_answer_cut_by_its_budget_says_so():
    """A slow answer model's partial text was returned as a plain verified answer: nothing but
    ``stats.<node>.truncated`` (local models only) said it was cut."""
    slow = FakeLogprobChat(reply=" ".join(f"w{i}" for i in range(200)), delay_s=0.02, calls=[])
    async with asyncio.timeout(20):
        result, _ = await timed(services(answer=slow), answer_timeout_s=0.5, draft_policy="off")
    assert result["route"] == "generate" and result["answer"].startswith("w0 w1")
    assert not result["answer"].endswith("w199")
    assert any("cut after" in e and "answer_timeout_s=0.5" in e for e in result["errors"])
    # and where a reader looks: the reason (it named only the gate's, 2026-12-06)
    assert result["reason"].endswith("; the answer budget cut the answer"), result["reason"]
    assert result["stats"]["generate"]["truncated"] is True  # and in the node's statistics


async def test_a_stores_own_timeout_error_is_reported_as_it_is():
    """Any TimeoutError read as the retrieval budget's end: "the index is busy" (another run
    opening the index) was reported as "no result within 10.0s", the real cause lost."""
    svc = services(retrieve_error=TimeoutError("the index is busy: another run opens one"))
    result, _ = await timed(svc, retrieval_timeout_s=10.0)
    assert result["route"] == "fallback"
    assert (
        result["reason"]
        == "retrieval failed (TimeoutError: the index is busy: another run opens one)"
    )
    assert "retrieve: TimeoutError: the index is busy: another run opens one" in result["errors"]


async def test_a_run_waiting_for_a_busy_index_is_told_so_before_its_budget_ends():
    """The wait for the index lock lasted the whole retrieval budget, which therefore always
    ended first: "the index is busy" never reached a run, only "no result within 1.0s"."""
    from specrag.graph import services as services_module

    def search(query, document, context):
        services_module.open_index(context)  # another run is stuck opening the index
        yield Batch("dense", [])

    svc = dataclasses.replace(services(), batch_retriever=search)
    with services_module._INDEX_LOCK:
        result, _ = await timed(svc, retrieval_timeout_s=1.0, draft_policy="off")
    assert result["route"] == "fallback"
    assert result["reason"].startswith("retrieval failed (TimeoutError: the index is busy")
    assert any("TimeoutError: the index is busy" in e for e in result["errors"]), result["errors"]


@pytest.mark.timeout(60)  # a regression hangs (forever before the fix)
async def test_searches_that_never_return_do_not_starve_later_runs():
    """Each hung search kept one thread of the event loop's shared pool after its run ended
    (cores + 4 threads): once they were all taken, every later run waited forever in its
    first to_thread (prepare's warm-ups), which no budget ends. Here the pool has 2 threads
    and 3 runs hang their searches."""
    from concurrent.futures import ThreadPoolExecutor

    hang = threading.Event()

    def never(query, document, context):  # until the test ends
        hang.wait()
        yield from ()

    pool = ThreadPoolExecutor(2)
    asyncio.get_running_loop().set_default_executor(pool)
    try:
        for _ in range(3):
            svc = dataclasses.replace(services(), batch_retriever=never)
            result, _ = await timed(svc, retrieval_timeout_s=0.2)
            assert result["route"] == "fallback" and "timed out" in result["reason"]
        async with asyncio.timeout(8):  # forever before
            result, _ = await timed(services(), retrieval_timeout_s=5.0)
        assert result["route"] == "refine" and result["answer"] == "Paris."
    finally:
        hang.set()


async def test_an_answer_that_failed_still_says_what_it_took():
    """An answer model that returned nothing had run for seconds, but the result's
    `timings.answer_s` was null: the time the failed attempt took was nowhere."""
    empty = FakeLogprobChat(reply="", delay_s=0.2, calls=[])
    result, _ = await timed(services(answer=empty))
    assert result["route"] == "fallback" and "empty answer" in result["reason"]
    assert result["timings"]["answer_s"] >= 0.2


async def test_evidence_past_the_answer_models_context_is_left_out_lowest_ranked_first():
    """With a large top_k the prompt was cut in the middle to fit the answer model, and the
    answer cited every chunk, the ones it never read too: the lowest-ranked are left out."""

    class Small(FakeLogprobChat):  # a context that holds a prompt of two long chunks
        def prompt_fits(self, messages, max_new_tokens):
            return sum(len(str(m.content)) for m in messages) < 2600

    found = [chunk("Paris. " + "x" * 1000, score=0.9 - n / 10, n=n) for n in range(5)]
    answer = Small(reply="Paris.", calls=[])
    result, _ = await timed(services(answer=answer, chunks=found), top_k=5)
    assert result["answer"] == "Paris."
    assert [c["n"] for c in result["citations"]] == [1, 2]
    (prompt,) = answer.calls
    assert prompt[-1].content.count("x" * 1000) == 2
    # a model that fits them all reads them all
    result, _ = await timed(services(chunks=found), top_k=5)
    assert [c["n"] for c in result["citations"]] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("fail", [False, True])
async def test_streamed_evidence_is_fitted_too_and_a_failure_passes_all_of_it_on(fail):
    """Incremental evidence whose batches all came before the answer began is fitted to the
    local model as one prompt; the next node after a failure still gets all of it."""
    from tests.unit.test_budgets import SlowLocal

    class OneBlock(SlowLocal):  # a context that holds one evidence block
        def prompt_fits(self, messages, max_new_tokens):
            return str(messages[-1].content).count("<evidence") <= 1

        def _job(self, messages, options):
            if fail:
                raise RuntimeError("model exploded")
            return super()._job(messages, options)

    async with asyncio.timeout(20):
        result, _ = await incremental(
            OneBlock(steps=3, step_s=0.0), lambda: time.sleep(0.05), grace=5.0
        )
    if fail:  # the fallback has all the evidence
        assert result["route"] == "fallback" and "model exploded" in result["reason"]
        assert [c["id"] for c in result["chunks"]] == ["id1", "id0"]
    else:  # the answer read and cites the top-ranked block only
        assert result["route"] == "generate" and result["answer"].startswith("t0 t1")
        assert [c["id"] for c in result["chunks"]] == ["id1"]
        assert [c["n"] for c in result["citations"]] == [1]


async def test_a_later_batchs_prompt_is_fitted_to_the_local_model_as_well():
    """Incremental evidence whose second batch came while the answer was decoding: the
    prompt offered to the decode held every chunk (the model would read only part of it, cut
    in the middle) and the answer cited them all. It is fitted as a whole-evidence prompt
    is: the top-ranked block only, cited as such."""
    from tests.unit.test_budgets import SlowLocal

    later = threading.Event()
    taken: list[list] = []

    class OneBlock(SlowLocal):  # a context that holds one evidence block; reads its feed
        def prompt_fits(self, messages, max_new_tokens):
            return str(messages[-1].content).count("<evidence") <= 1

        def _job(self, messages, options):
            job, feed = super()._job(messages, options), options.prompt_feed
            produce = job.produce

            def steps(should_stop):
                for i, step in enumerate(produce(should_stop)):
                    if i == 2:
                        later.set()
                    if feed.pending:
                        taken.append(feed.take())
                        feed.read_puts = feed.taken_puts
                    yield step

            job.produce = steps
            return job

    async with asyncio.timeout(20):
        result, _ = await incremental(OneBlock(steps=40, step_s=0.01), lambda: later.wait(5))
    assert result["route"] == "generate", result["reason"]
    (prompt,) = taken  # the second batch's, with REST ranked above FIRST
    assert str(prompt[-1].content).count("<evidence") == 1
    assert [c["id"] for c in result["citations"]] == ["id1"]  # what the answer read


async def test_a_failed_generate_does_not_wait_for_the_search_before_the_fallback():
    """generate failed at once and the fallback waited for the search's later batches (up
    to the retrieval budget), though its message uses no evidence."""
    from tests.unit.test_budgets import SlowLocal

    class Broken(SlowLocal):
        def _job(self, messages, options):
            raise RuntimeError("model exploded")

    release = threading.Event()
    try:
        async with asyncio.timeout(20):
            result, elapsed = await incremental(
                Broken(), lambda: release.wait(10), retrieval_timeout_s=10.0
            )
    finally:
        release.set()
    assert result["route"] == "fallback" and "model exploded" in result["reason"]
    assert elapsed < CUT
    assert "retrieve: later batches were not woven in: generate failed first" in result["errors"]


async def test_a_failed_refine_leaves_the_later_batches_to_generate():
    """refine failed, then waited for the search's later batches up to the retrieval budget
    (6 s), so generate found the answer budget (3 s) spent and the run fell back to the
    unverified draft (a review, 2026-12-06): generate now answers from the evidence so far and
    reads the later batches as they come, within what is left of the answer budget."""
    release = threading.Event()
    svc = dataclasses.replace(
        services(answer=failing_once(RuntimeError("refine broke"))),
        batch_retriever=two_batches(lambda: release.wait(30)),
    )
    result, elapsed = await timed(
        svc,
        release,
        answer_policy="incremental",
        incremental_grace_s=0.0,
        retrieval_timeout_s=6.0,
        answer_timeout_s=3.0,
    )
    assert "refine: RuntimeError: refine broke" in result["reason"]
    assert result["route"] == "generate" and result["answer"] == "Paris." and result["verified"]
    assert elapsed < 5.0  # the answer budget, not the retrieval budget
    assert any(e.startswith("retrieve: later batches were not woven in") for e in result["errors"])


async def test_a_cancelled_incremental_run_stops_the_search_behind_it():
    """A run cancelled while it answered from the first batch left the search for the later
    batches running until the retrieval budget ended (its task pending, its events emitted)."""
    from tests.unit.test_budgets import SlowLocal

    release = threading.Event()
    run = asyncio.create_task(
        incremental(SlowLocal(steps=400, step_s=0.01), lambda: release.wait(10))
    )
    try:
        await asyncio.sleep(0.5)  # answering from batch 1, batch 2 held back
        await cancelled_leaving_nothing(run)
    finally:
        release.set()


async def cancelled_leaving_nothing(run: asyncio.Task) -> None:
    """Cancel ``run``; no task of it is left running."""
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.sleep(0.1)
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert left == [], left


async def test_a_run_cancelled_while_it_drafts_stops_the_search_behind_it():
    """A review (2026-12-07): cancelled while its draft still ran (``draft_policy=complete``),
    after retrieve had returned the first batch, a run left the search for the later batches
    running (and its stream and signal in the process's tables): only the answer nodes
    cancelled it."""
    from specrag.graph import signals
    from tests.fakes import two_batches

    release = threading.Event()
    slow_draft = FakeLogprobChat(reply=" ".join(["w"] * 100), delay_s=0.05, calls=[])
    svc = dataclasses.replace(
        services(draft=slow_draft), batch_retriever=two_batches(lambda: release.wait(10))
    )
    context = ctx(answer_policy="incremental", draft_policy="complete", retrieval_timeout_s=10)
    before = set(signals._STREAMS)
    run = asyncio.create_task(build_graph(svc).ainvoke({"question": "q?"}, context=context))
    try:
        await asyncio.sleep(1.0)  # drafting; batch 1 delivered, batch 2 held back
        (key,) = set(signals._STREAMS) - before  # the search behind it runs
        await cancelled_leaving_nothing(run)
        assert key not in signals._STREAMS and key not in signals._SIGNALS
    finally:
        release.set()


def test_an_error_is_named_without_the_internal_underscore():
    """Reasons read "retrieve: IndexError_: no index at ...": the class's name, which only
    avoids shadowing Python's IndexError, was shown as it is spelt."""
    from specrag.errors import IndexError_, short_error

    assert short_error(IndexError_("no index at x\nmore")) == "IndexError: no index at x"


def test_an_error_without_a_message_says_the_one_it_was_raised_from():
    """`--index-url http://10.255.255.1:8000` said "cannot reach the Chroma server at ...:
    ValueError": chromadb raises a bare ValueError over the connect timeout (a new user)."""
    from specrag.errors import first_line, short_error

    try:
        try:
            raise TimeoutError("timed out")
        except TimeoutError as exc:
            raise ValueError() from exc
    except ValueError as exc:
        assert first_line(exc) == short_error(exc) == "ValueError (TimeoutError: timed out)"
    assert first_line(ValueError()) == short_error(ValueError()) == "ValueError"
    try:  # `from None` hides what it was raised during: so does the line
        try:
            raise KeyError("secret-key")
        except KeyError:
            raise RuntimeError() from None
    except RuntimeError as exc:
        assert first_line(exc) == "RuntimeError"


def test_a_model_that_failed_to_load_is_not_tried_again_within_a_minute(monkeypatch):
    """One graph run loads its answer model twice (prepare's warm-up, then the node): a hub
    id not in the cache without a network cost ~46 s of retries each time (102 s a run)."""
    import pytest

    from specrag.errors import ModelLoadError
    from specrag.models import loading

    tries = []

    def failing(name, device, dtype):
        tries.append(name)
        raise ModelLoadError(f"could not load model {name!r}: no network")

    monkeypatch.setattr(loading, "_load_lm_uncached", failing)
    with pytest.raises(ModelLoadError, match="could not load model 'nosuch/model'"):
        loading.load_lm("nosuch/model", "cpu", "float32")
    with pytest.raises(ModelLoadError, match="could not load model 'nosuch/model'"):
        loading.load_lm("nosuch/model", "cpu", "float32")
    assert tries == ["nosuch/model"] * 2  # a quick failure (a mistyped path): tried again

    monkeypatch.setattr(loading.FAILED_LOADS, "slow_s", 0.0)  # as slow as network retries
    with pytest.raises(ModelLoadError):
        loading.load_lm("nosuch/model", "cpu", "float32")
    with pytest.raises(
        ModelLoadError, match=r"no network \(failed 0s ago: tried again 60s after\)$"
    ) as e:
        loading.load_lm("nosuch/model", "cpu", "float32")
    assert len(tries) == 3 and isinstance(e.value.__cause__, ModelLoadError)
    ((key, (when, exc)),) = loading.FAILED_LOADS._failed.items()
    loading.FAILED_LOADS._failed[key] = (when - 60, exc)  # a minute ago: the user may have fixed it
    with pytest.raises(ModelLoadError):
        loading.load_lm("nosuch/model", "cpu", "float32")
    assert len(tries) == 4


@pytest.mark.parametrize("policy", ["wait", "incremental"])
async def test_evidence_from_before_a_failed_later_batch_is_incomplete_in_both_policies(policy):
    """State.evidence_complete is False when later batches failed and the run answers from the
    evidence before them: a wait-mode run said so, an incremental one said True (and its error
    left out what it answered from)."""

    def failing(query, document, ctx):
        yield Batch("dense", [chunk("Paris is the capital of France.", n=0)])
        time.sleep(0.05)  # the incremental answer has started from batch 1
        raise RuntimeError("store down")

    svc = dataclasses.replace(services(), batch_retriever=failing)
    question = {"question": "capital of France?"}
    context = ctx(answer_policy=policy, incremental_grace_s=0.0, draft_policy="off")
    state: dict = {}
    async for state in build_graph(svc).astream(question, context=context, stream_mode="values"):
        pass
    assert state["answer"] == "Paris." and state["evidence_complete"] is False, policy
    later = [e for e in state["errors"] if "later batches" in e]
    assert len(later) == 1 and "failed: RuntimeError: store down" in later[0], later
    assert "answering from the 1 relevant chunk(s) found before" in later[0], later


async def test_a_later_failure_after_an_emptying_re_ranking_names_the_evidence_kept():
    """After a batch whose re-ranking left no chunk relevant, a later failure said "answering
    from the 0 relevant chunk(s)": the answer kept the evidence it had (1 chunk)."""
    result, _ = await incremental(batches=emptying_batches(RuntimeError("store down")))
    failed = [e for e in result["errors"] if "failed: RuntimeError: store down" in e]
    assert failed and "answering from the 1 relevant chunk(s) found before" in failed[0], failed


@pytest.mark.parametrize("then", [None, RuntimeError("store down")])
@pytest.mark.parametrize("policy", ["wait", "incremental"])
async def test_a_re_ranking_that_drops_every_relevant_chunk_answers_alike_in_both_policies(
    policy, then
):
    """Batch 1 held a relevant chunk, batch 2's fused ranking none (then maybe a failure):
    `incremental` answered from batch 1, `wait` fell back ("no chunk scored 0.2 or more", or
    "retrieval failed") though a relevant chunk was found (a review, 2026-12-07)."""
    svc = dataclasses.replace(services(), batch_retriever=emptying_batches(then))
    context = ctx(answer_policy=policy, incremental_grace_s=0.0, draft_policy="off")
    result: dict = {}
    question = {"question": "capital of France?"}
    async for result in build_graph(svc).astream(question, context=context, stream_mode="values"):
        pass
    assert result["route"] == "generate" and result["verified"], (policy, result["reason"])
    assert result["answer"] == "Paris."
    assert [c["id"] for c in result["chunks"]] == ["id0"]
    assert result["evidence_complete"] is False
    said = "failed: RuntimeError" if then else "ranked every chunk below relevance_threshold"
    assert any(said in e and "from the 1 relevant chunk(s)" in e for e in result["errors"])


async def test_a_seed_past_a_remote_apis_range_is_folded_below_2_31():
    """`seed` goes up to 2**64-1; the answer's was sent as it was, so a remote model whose
    seed field is a signed integer failed refine and generate on the same bad request and
    every run ended unverified (a review, 2026-12-07). The draft's seed was folded already."""
    seen = []

    class Seeded(FakeLogprobChat):
        seed: int | None = None

        def _stream(self, *args, **kwargs):
            seen.append(self.seed)
            if self.seed is not None and not 0 <= self.seed < 2**63:
                raise RuntimeError("400: seed out of int64 range")
            yield from super()._stream(*args, **kwargs)

    svc = services(draft=Seeded(calls=[]), answer=Seeded(reply="Paris.", calls=[]))
    result, _ = await timed(svc, seed=2**64 - 1)
    assert result["route"] in ("refine", "generate") and result["answer"] == "Paris."
    assert seen and all(0 <= s < 2**31 for s in seen), seen
    await timed(services(answer=Seeded(reply="Paris.", calls=[])), seed=7)
    assert 7 in seen  # a seed in range is sent as it is


@pytest.mark.parametrize("policy", ["wait", "incremental"])
async def test_evidence_a_later_batch_brings_back_makes_the_evidence_complete_again(policy):
    """A review (2026-12-07): batch 2's fused ranking left nothing relevant, batch 3 (a
    reranker) brought relevant chunks back; the incremental answer wove them in but kept
    "answering from the 1 relevant chunk(s) found before" and evidence_complete false, which
    the wait policy, answering from the same chunks, did not say."""
    first = chunk("Paris is the capital of France.", n=0)
    low = chunk("Lyon has a large old town.", score=0.05, n=1)
    back = chunk("France's capital: Paris.", score=0.9, n=2)

    def three(query, document, ctx):
        yield Batch("dense", [first])
        time.sleep(0.05)  # the incremental answer has started from batch 1
        yield Batch("hybrid", [low], [low])  # a fused ranking: nothing relevant
        time.sleep(0.05)
        yield Batch("rerank", [back], [back, first])  # relevant again

    svc = dataclasses.replace(services(), batch_retriever=three)
    context = ctx(answer_policy=policy, incremental_grace_s=0.0, draft_policy="off")
    result = await build_graph(svc).ainvoke({"question": "capital of France?"}, context=context)
    assert result["route"] == "generate" and result["verified"], result["reason"]
    assert [c["id"] for c in result["citations"]] == ["id2", "id0"]
    assert result["evidence_complete"] is True
    assert not any("relevance_threshold" in e for e in result["errors"]), result["errors"]


async def test_hung_sync_only_remote_models_never_starve_later_runs():
    """A review (2026-12-07): a chat model with a synchronous stream only (a blocking SDK) was
    stepped by LangChain on the event loop's shared pool (cores + 4 threads); each hung call
    kept one, and once they were all held every later run waited in its first thread hop (a
    model's warm-up) with no budget to end the wait: no answer and no message. Each run's
    draft is cut at its budget, as before, and every run answers."""
    import os

    from langchain_core.messages import AIMessageChunk
    from langchain_core.outputs import ChatGenerationChunk

    release = threading.Event()

    class HungSync(FakeLogprobChat):  # a blocking SDK's call that never returns
        def _stream(self, *args, **kwargs):
            release.wait(60)
            yield from ()

    class AsyncAnswer(FakeLogprobChat):  # native async: never on the pool
        async def _astream(self, *args, **kwargs):
            yield ChatGenerationChunk(message=AIMessageChunk(content="Paris."))

    graph = build_graph(services(draft=HungSync(calls=[]), answer=AsyncAnswer(calls=[])))
    runs = min(32, (os.cpu_count() or 1) + 4) + 2  # past the shared pool's threads
    try:
        for _ in range(runs):
            async with asyncio.timeout(20):
                result = await graph.ainvoke(
                    {"question": "capital of France?"}, context=ctx(draft_timeout_s=0.2)
                )
            assert result["answer"] == "Paris." and result["route"] == "generate"
    finally:
        release.set()


def test_a_cancelled_runs_document_embedding_stops_between_batches():
    """A review (2026-12-07): Ctrl-C on a `--document` run waited until the whole document was
    embedded (26.9 s for a 500 KB file here, minutes for larger): the embedding ran on the
    event loop's shared pool, which `asyncio.run` joins at its end, and never looked for a
    stop. It stops at its next batch now, and nothing waits for the thread."""
    from langchain_core.embeddings import Embeddings

    from specrag.models.loading import ModelThreadEmbeddings
    from specrag.nodes.prepare import quietly

    calls: list[int] = []

    class Slow(Embeddings):
        def embed_documents(self, texts):
            calls.append(len(texts))
            time.sleep(0.05)
            return [[0.0] for _ in texts]

        def embed_query(self, text):
            return [0.0]

    embeddings = ModelThreadEmbeddings(Slow())
    texts = ["x"] * (ModelThreadEmbeddings.batch * 40)

    async def cancelled() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                quietly(lambda: embeddings.embed_documents(texts), stoppable=True), 0.3
            )

    asyncio.run(cancelled())  # returns without waiting for the embedding to end
    seen = len(calls)
    time.sleep(0.3)
    assert 0 < seen < 40 and len(calls) <= seen + 1, (seen, len(calls))


def test_a_wrapped_sync_only_model_streams_on_its_own_thread_too():
    """A review of that fix (2026-12-07): a model wrapped by `bind` or `with_config` (a
    RunnableBinding) was judged as no chat model, and streamed on the shared pool again."""
    from specrag.nodes.streaming import steps_on_the_shared_pool

    class SyncOnly(FakeLogprobChat):
        def _stream(self, *args, **kwargs):
            yield from ()

    model = SyncOnly(calls=[])
    assert steps_on_the_shared_pool(model)
    assert steps_on_the_shared_pool(model.with_config(tags=["x"]).bind(stop=["\n"]))
    assert steps_on_the_shared_pool(model.with_retry())
    assert steps_on_the_shared_pool(model.with_fallbacks([SyncOnly(calls=[])]))

    class Native(FakeLogprobChat):
        async def _astream(self, *args, **kwargs):
            for _ in ():
                yield

    assert not steps_on_the_shared_pool(Native(calls=[]).with_config(tags=["x"]))


async def test_the_grace_for_later_batches_is_part_of_the_answer_budget(monkeypatch):
    """A local answer model waits ``incremental_grace_s`` for batches that come soon; that
    wait is the answer's time: the model is called with what is left of its budget."""
    from specrag.nodes import answer as answer_node

    budgets: list[float] = []
    real = answer_node.stream_model

    async def spy(*args, **kwargs):
        budgets.append(kwargs["budget_s"])
        return await real(*args, **kwargs)

    monkeypatch.setattr(answer_node, "is_local", lambda model: True)  # the weaving path
    monkeypatch.setattr(answer_node, "stream_model", spy)
    release = threading.Event()
    try:
        async with asyncio.timeout(20):
            result, _ = await incremental(
                None, lambda: release.wait(HANG_S), grace=0.6, answer_timeout_s=5.0
            )
    finally:
        release.set()  # the second batch's search thread
    assert result["answer"] == "Paris." and len(budgets) == 1
    assert budgets[0] <= 5.0 - 0.6, budgets  # the grace waited in full: batch 2 never came
