"""Budgets stop prefill too; the model thread survives any job's failure (issue 9 #5, #6)."""

import asyncio
import logging
import threading
import time

import pytest
import torch

from specrag.decoding import state as state_module
from specrag.decoding.rapid import RapidConfig, RapidStats, rapid_decode
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import DecodeStats, Token, decode
from specrag.decoding.state import LMState, Stopped
from specrag.models.local import DecodeJob, LocalChatBase
from specrag.models.worker import MODEL_THREAD, ModelThread
from tests.tiny import tiny_llama


def tiny():
    return tiny_llama(sharpen=1.0)


class StopAfter:
    """A stop check that says "time" once ``calls`` checks have passed (counts the checks)."""

    def __init__(self, calls: int) -> None:
        self.calls, self.seen = calls, 0

    def __call__(self, n_generated: int) -> str | None:
        self.seen += 1
        return "time" if self.seen > self.calls else None


def test_a_budget_stops_a_long_prefill_between_slices(monkeypatch):
    monkeypatch.setattr(state_module, "PREFILL_CHUNK", 16)
    model = tiny()
    lm = LMState(model)
    prompt = list(range(1, 64)) * 2  # 126 tokens = 8 slices of 16
    stats = DecodeStats()
    out = list(
        decode(
            lm,
            prompt,
            max_new_tokens=8,
            sampler=Sampler(0.0),
            should_stop=StopAfter(2),
            stats=stats,
        )
    )
    assert out == [] and stats.finish_reason == "time"
    assert len(lm) == 2 * 16  # stopped before the third slice: the rest was never computed
    # without a stop the same prompt decodes normally
    assert list(decode(LMState(model), prompt, max_new_tokens=3, sampler=Sampler(0.0)))


def test_a_budget_stops_rapid_prefills(monkeypatch):
    monkeypatch.setattr(state_module, "PREFILL_CHUNK", 16)
    model = tiny()
    target, drafter = LMState(model), LMState(model)
    stats = RapidStats()
    out = list(
        rapid_decode(
            target,
            drafter,
            list(range(1, 64)) * 2,
            list(range(1, 40)),
            max_new_tokens=8,
            sampler=Sampler(0.0),
            cfg=RapidConfig(eta=0.0),
            should_stop=StopAfter(1),
            stats=stats,
        )
    )
    assert out == [] and stats.finish_reason == "time"
    assert len(target) == 16 and len(drafter) == 0
    # nothing decoded: no pass booked (it said 1) and no decode time (it held the prefill)
    assert stats.as_dict()["target_forward_passes"] == 0 and stats.decode_s == 0.0


def test_extend_raises_stopped_and_keeps_the_cache_consistent(monkeypatch):
    monkeypatch.setattr(state_module, "PREFILL_CHUNK", 8)
    lm = LMState(tiny())
    with pytest.raises(Stopped):  # checked before the first slice too
        lm.extend(list(range(1, 30)), all_logits=False, should_stop=lambda: "time")
    assert len(lm) == 0
    stop = StopAfter(1)
    with pytest.raises(Stopped):
        lm.extend(list(range(1, 30)), all_logits=False, should_stop=lambda: stop(0))
    assert len(lm) == 8 and lm.tokens == list(range(1, 9))
    lm.extend([9, 10])  # the cache still matches its tokens
    assert len(lm) == 10


# --- the model thread survives failing jobs ------------------------------------------------


def test_model_thread_survives_callbacks_that_raise():
    worker = ModelThread(max_active=2)
    ends = []

    def job():
        yield 1
        yield 2

    def boom(item):
        raise RuntimeError("Event loop is closed")

    def boom_end(exc):
        ends.append(exc)
        raise RuntimeError("Event loop is closed")

    worker.run_steps(job, boom, boom_end)  # on_item raises: this job fails, alone
    worker.submit(lambda: (_ for _ in ()).throw(ValueError("task"))).exception(timeout=5)
    worker._push(lambda: 1 / 0)  # a raw task that raises
    assert worker.submit(lambda: 42).result(timeout=5) == 42  # still serving
    assert len(ends) == 1 and isinstance(ends[0], RuntimeError)
    assert worker._active == 0  # the failed job gave its slot back
    done = threading.Event()
    worker.run_steps(job, lambda item: None, lambda exc: done.set())
    assert done.wait(5)


def test_decode_jobs_past_max_active_wait_for_a_slot_then_all_run():
    """A mutation review (2026-12-08): a finished job not starting a waiting one (the 5th
    concurrent decode hung for good) and ``max_active`` off by one (a KV cache more than the
    bound) both passed every unit test."""
    worker = ModelThread(max_active=1)
    gate = threading.Event()
    worker.submit(gate.wait, 10)  # every job is queued before any step runs
    live, peak, started, ends = [0], [0], [], []  # touched on the model thread only
    done = threading.Event()

    def job(name):
        def steps():
            started.append(name)
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            try:
                yield from range(3)
            finally:
                live[0] -= 1

        return steps

    def end(exc):
        ends.append(exc)
        if len(ends) == 3:
            done.set()

    for name in "abc":
        worker.run_steps(job(name), lambda item: None, end)
    gate.set()
    assert done.wait(10), (started, ends)
    assert started == ["a", "b", "c"] and ends == [None, None, None]
    assert peak[0] == 1  # one KV cache at a time
    assert worker._active == 0 and not worker._waiting


def test_a_cancelled_queued_call_never_runs(caplog):
    """A mutation review (2026-12-08): running a queued call whose future was cancelled (a
    timed-out run's embedding) passed every test; it took model-thread time, then its
    ``set_result`` raised and was logged as a failed task."""
    worker = ModelThread()
    gate = threading.Event()
    worker.submit(gate.wait, 10)
    ran = []
    queued = worker.submit(ran.append, 1)
    assert queued.cancel()
    gate.set()
    assert worker.submit(lambda: 42).result(timeout=10) == 42  # the queue has drained
    assert ran == [] and queued.cancelled()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_closing_the_model_thread_stops_its_decode_jobs():
    """A mutation review (2026-12-08): ``close()`` not setting ``closing`` passed every test;
    at exit decode jobs (which check it) ran on, and exit waited for them or killed the
    thread inside torch."""
    worker = ModelThread()
    limit = 20_000
    running, ended = threading.Event(), threading.Event()
    steps = []

    def job():
        while not worker.closing and len(steps) < limit:
            steps.append(1)
            running.set()
            time.sleep(0.001)
            yield

    worker.run_steps(job, lambda item: None, lambda exc: ended.set())
    assert running.wait(10)
    worker.close(timeout=60)
    assert worker.closing and ended.is_set()
    assert len(steps) < limit  # stopped by close, not by running out


class SlowLocal(LocalChatBase):
    """A local model whose decode ignores stop requests for a while (as a long step does)."""

    steps: int = 30
    step_s: float = 0.01

    @property
    def _llm_type(self) -> str:
        return "slow-local"

    def _job(self, messages, options):
        class Tok:
            def decode(self, ids, skip_special_tokens=True, **_):
                return "".join(f"t{i} " for i in ids)

        def produce(should_stop):
            for i in range(self.steps):
                time.sleep(self.step_s)
                yield [Token(i, -0.1, "model")]

        return DecodeJob(
            produce=produce,
            tokenizer=Tok(),
            eos_ids=(),
            input_tokens=1,
            metadata=dict,
            finish_reason=lambda: "stop",
        )


def test_cancelled_runs_on_closed_loops_do_not_kill_the_model_thread():
    model = SlowLocal()

    async def take_two():
        async for i, _ in _aenumerate(model.astream("hi")):
            if i == 1:
                return  # the consumer leaves mid-job; its loop closes right after

    for _ in range(3):
        loop = asyncio.new_event_loop()
        loop.run_until_complete(take_two())
        loop.close()  # later tokens of the still-running job hit a closed loop
    time.sleep(0.5)
    assert MODEL_THREAD._thread.is_alive()
    text = asyncio.run(model.ainvoke("again")).content  # and the next call is served
    assert text.startswith("t0 t1")
    assert MODEL_THREAD.submit(lambda: "ok").result(timeout=10) == "ok"


async def _aenumerate(aiter):
    i = 0
    async for item in aiter:
        yield i, item
        i += 1


async def test_the_decode_budget_counts_from_the_call_so_its_last_chunk_is_not_lost(
    monkeypatch,
):
    """The local decode's deadline started after the job was built (tokenizing a long
    document), while the caller's timeout had started before: building for more than the
    grace got the consumer cancelled before the decode's own "time" end, and the final chunk
    (finish_reason, the decode's stats) was lost."""
    from specrag.nodes import streaming

    grace = 2.0  # the caller's timeout runs this much past the budget
    monkeypatch.setattr(streaming, "GRACE_S", grace)

    class SlowToBuild(SlowLocal):
        def _job(self, messages, options):
            time.sleep(grace + 0.5)  # tokenizing a long document, past budget and grace
            job = super()._job(messages, options)

            ended = {"reason": "stop"}

            def produce(should_stop):  # a decode that stops at its deadline
                for i in range(self.steps):
                    if reason := should_stop(i):
                        ended["reason"] = reason
                        return
                    time.sleep(self.step_s)
                    yield [Token(i, -0.1, "model")]

            job.produce = produce
            job.finish_reason = lambda: ended["reason"]
            return job

    # built 2.5 s: past the 2 s budget (the decode stops at once) and past the 2 s grace (the
    # old deadline, counted after the build, ran to 4.5 s; the caller's timeout is at 4 s)
    model = SlowToBuild(steps=400, step_s=0.01)
    out = await streaming.stream_model(model, "q", budget_s=2.0, tags=["answer"])
    assert out.timed_out
    assert out.metadata.get("finish_reason") == "time", out.metadata
    assert "decoding" in out.metadata


async def test_loading_the_model_is_not_part_of_the_decode_budget():
    """Loading (a first GGUF conversion takes 20-30 s) happens before the budget's clock."""

    class SlowToLoad(SlowLocal):
        loaded: bool = False

        def load(self):  # as ChatLocalLM's: once per process, and again from _job (a no-op)
            if not self.loaded:
                time.sleep(3.0)
                self.loaded = True

        def _job(self, messages, options):
            self.load()
            job = super()._job(messages, options)
            ended = {"reason": "stop"}

            def produce(should_stop):
                for i in range(self.steps):
                    if reason := should_stop(i):
                        ended["reason"] = reason
                        return
                    yield [Token(i, -0.1, "model")]

            job.produce = produce
            job.finish_reason = lambda: ended["reason"]
            return job

    model = SlowToLoad(steps=5, step_s=0.0)
    out = model.invoke("q", max_time=2.0)  # the synchronous path
    assert out.response_metadata["finish_reason"] == "stop" and out.content.startswith("t0")
    model.loaded = False
    text, meta = "", {}
    async for chunk in model.astream("q", max_time=2.0):  # the asynchronous path (_astream)
        text += chunk.content
        meta.update(chunk.response_metadata or {})
    assert meta["finish_reason"] == "stop" and text.startswith("t0")


def test_a_nan_time_limit_on_the_model_is_refused_as_a_calls_is():
    """`ChatLocalLM(max_time=nan)` was accepted and decoded without any limit (its deadline
    never came), while a call's NaN is refused (a review, 2026-12-06)."""
    import math

    import pydantic

    from specrag.models.chat import ChatLocalLM

    with pytest.raises(pydantic.ValidationError, match="max_time must be a number, got NaN"):
        ChatLocalLM(max_time=math.nan)
    assert ChatLocalLM(max_time=math.inf).max_time == math.inf  # inf: no limit, as a call's


def test_a_forked_child_gets_a_model_thread_of_its_own():
    """A child made by fork (gunicorn --preload, multiprocessing's fork) had the model thread's
    object but no thread: its first model call waited forever."""
    import os
    import warnings

    assert MODEL_THREAD.submit(lambda: 1).result(timeout=10) == 1
    with warnings.catch_warnings():  # Python 3.12 warns about fork in a threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: a model call, then out without pytest's teardown
        code = 1
        try:
            code = 0 if MODEL_THREAD.submit(lambda: 42).result(timeout=20) == 42 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert MODEL_THREAD.submit(lambda: 2).result(timeout=10) == 2  # the parent's serves on


def test_a_long_documents_embedding_lets_other_model_work_through_between_batches():
    """A document's chunks were embedded in one model-thread task: a 480-chunk document held
    every other run's decode steps and question embeddings for 18 s (a concurrency review)."""
    from specrag.models.loading import ModelThreadEmbeddings

    order = []

    class Inner:
        def embed_documents(self, texts):
            order.append(f"batch of {len(texts)}")
            if len(order) == 1:  # another run's step arrives while the first batch runs
                MODEL_THREAD.submit(lambda: order.append("other run"))
            return [[float(len(t))] for t in texts]

    texts = [f"chunk {i}" for i in range(70)]
    vectors = ModelThreadEmbeddings(Inner()).embed_documents(texts)
    assert vectors == [[float(len(t))] for t in texts]
    assert order == ["batch of 32", "other run", "batch of 32", "batch of 6"]


def long_prefill(produce):
    """A local model whose decode job is ``produce`` (a long prefill: one model-thread turn)."""

    class LongPrefill(SlowLocal):
        def _job(self, messages, options):
            job = super()._job(messages, options)
            job.produce = produce
            return job

    return LongPrefill()


def test_a_question_embedding_runs_between_the_slices_of_a_long_prefill():
    """A RAPID document's prefill (thousands of tokens) is one turn of the model thread: a
    question's embedding queued behind it waited the whole prefill while its retrieval budget
    ran out (a concurrency review: 40 s). Plain calls now run at the prefill's stop checks."""
    from specrag.models.worker import LEND_AFTER_S

    def run(slices, submit=MODEL_THREAD.submit_short, what="query embedded"):
        order = []
        started = threading.Event()

        def produce(should_stop):
            started.set()
            for _ in range(slices):  # prefill slices in one turn, checked between
                should_stop(0)
                time.sleep(0.05)
            order.append("prefill done")
            yield [Token(0, -0.1, "model")]

        async def main():
            answer = asyncio.create_task(long_prefill(produce).ainvoke("a long document"))
            await asyncio.to_thread(started.wait, 10)
            await asyncio.to_thread(lambda: submit(lambda: order.append(what)).result(10))
            await answer

        asyncio.run(main())
        return order

    assert LEND_AFTER_S < 1.0
    assert run(slices=40) == ["query embedded", "prefill done"]  # 2 s: lent mid-way
    # a short turn (a decode step, a drafter round) lends nothing: its timings are its own
    assert run(slices=1) == ["prefill done", "query embedded"]
    # only short calls are lent: a model's load (minutes for a conversion) or a cost timing
    # queued behind the prefill waits for its end (lent, it paused the prefill while its
    # budget ran, and the run stopped for "time" at the next check)
    assert run(slices=40, submit=MODEL_THREAD.submit, what="model loaded") == [
        "prefill done",
        "model loaded",
    ]


def test_a_turn_waits_for_its_device_before_it_lends(monkeypatch):
    """On a GPU a turn's prefill slices are queued, not run: a call lent between them ran
    while the device still worked through them, and that time left the decode's own clock
    (its prefill, the drafter's join, the booked pass timings; a CUDA review, 2026-12-07).
    The turn's device is synchronised first - only when a call is lent."""
    from specrag.models import local

    order = []
    monkeypatch.setattr(local, "sync", lambda device: order.append(f"sync {device}"))

    def run(slices):
        started = threading.Event()

        def produce(should_stop):
            started.set()
            for _ in range(slices):
                should_stop(0)
                time.sleep(0.05)
            order.append("prefill done")
            yield [Token(0, -0.1, "model")]

        class OnADevice(type(long_prefill(produce))):
            def _job(self, messages, options):
                job = super()._job(messages, options)
                job.device = torch.device("cpu")
                return job

        async def main():
            answer = asyncio.create_task(OnADevice().ainvoke("a long document"))
            await asyncio.to_thread(started.wait, 10)
            query = MODEL_THREAD.submit_short(lambda: order.append("query embedded"))
            await asyncio.to_thread(query.result, 10)
            await answer

        asyncio.run(main())

    run(slices=40)
    assert order == ["sync cpu", "query embedded", "prefill done"]
    order.clear()
    run(slices=1)  # nothing lent: no synchronisation either
    assert order == ["prefill done", "query embedded"]


def test_a_call_lent_by_a_turn_whose_device_fails_runs_after_it(monkeypatch):
    """The device's synchronisation before a lend raises where a queued kernel failed (CUDA's
    sticky errors): the call it had taken from the queue was lost and its caller (a
    question's embedding) waited for ever (a review of that synchronisation, 2026-12-07)."""
    from specrag.models import worker

    monkeypatch.setattr(worker, "LEND_AFTER_S", 0.0)

    def failed_device():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def turn():
        query = MODEL_THREAD.submit_short(lambda: "query embedded")
        with pytest.raises(RuntimeError, match="illegal memory access"):
            MODEL_THREAD.run_waiting_calls(before=failed_device)
        return query

    query = MODEL_THREAD.submit(turn).result(10)
    assert query.result(10) == "query embedded"  # run once the failed turn ended


def test_a_long_turn_keeps_as_much_of_the_thread_as_it_lends(monkeypatch):
    """A long prefill lent the thread after every 0.5 s of its own work, whatever the lent
    calls took: a document being indexed (a batch of 32 passages, ~1 s on 2 cores) took two
    thirds of the thread while the prefill's budget ran (a review). After a lent call the turn
    works as long as that call took before it lends again."""
    from specrag.models import worker

    monkeypatch.setattr(worker, "LEND_AFTER_S", 0.1)
    order = []

    def prefill():
        batches = [
            MODEL_THREAD.submit_short(lambda: (time.sleep(1.0), order.append("batch")))
            for _ in range(3)
        ]
        for _ in range(30):  # 0.6 s of its own work, checked every 0.02 s
            MODEL_THREAD.run_waiting_calls()
            time.sleep(0.02)
        order.append("prefill done")
        return batches

    batches = MODEL_THREAD.submit(prefill).result(30)
    # one batch lent (after 0.1 s); the next was due after 1 s more of the turn's own work
    assert order == ["batch", "prefill done"]
    for batch in batches:  # the rest run after the turn
        batch.result(30)


def test_a_stopped_run_lends_nothing_before_it_stops(monkeypatch):
    """A cancelled run (or one past its budget, or the process exiting) stops at its check;
    it ran a queued call first (a review of the lending)."""
    from specrag.models import worker

    monkeypatch.setattr(worker, "LEND_AFTER_S", 0.0)  # every check may lend
    order = []
    started, ready, ended = threading.Event(), threading.Event(), threading.Event()

    def produce(should_stop):
        started.set()
        ready.wait(10)  # the first check comes once the run is cancelled
        for _ in range(40):
            if reason := should_stop(0):
                order.append(f"prefill stopped: {reason}")
                break
            time.sleep(0.05)
        ended.set()
        yield [Token(0, -0.1, "model")]

    async def main():
        answer = asyncio.create_task(long_prefill(produce).ainvoke("a long document"))
        await asyncio.to_thread(started.wait, 10)
        answer.cancel()
        await asyncio.gather(answer, return_exceptions=True)
        query = MODEL_THREAD.submit_short(lambda: order.append("query embedded"))
        ready.set()
        await asyncio.to_thread(query.result, 10)
        await asyncio.to_thread(ended.wait, 10)

    asyncio.run(main())
    assert order == ["prefill stopped: cancelled", "query embedded"]


def test_time_lent_to_other_calls_is_not_in_the_decodes_timings(monkeypatch):
    """The timings a decode steers by (its prefill, the drafter's first reading, booked in
    pass-timings.json) left out the seconds its turn lent to others' calls (a review)."""
    from specrag.models import worker

    monkeypatch.setattr(state_module, "PREFILL_CHUNK", 16)
    monkeypatch.setattr(worker, "LEND_AFTER_S", 0.0)
    model = tiny()
    lent = []

    def stop(n_generated):
        if not lent:  # another run's call arrives during this decode's prefill
            lent.append(MODEL_THREAD.submit_short(time.sleep, 0.6))
        MODEL_THREAD.run_waiting_calls()
        return None

    def run():
        stats = DecodeStats()
        t0 = time.perf_counter()
        out = list(
            decode(
                LMState(model),
                list(range(1, 64)) * 2,
                max_new_tokens=3,
                sampler=Sampler(0.0),
                should_stop=stop,
                stats=stats,
            )
        )
        return out, stats, time.perf_counter() - t0

    out, stats, wall = MODEL_THREAD.call(run)
    assert out and lent[0].done()  # the call was lent mid-decode ...
    assert wall >= 0.6
    assert stats.prefill_s + stats.decode_s <= wall - 0.6  # ... and is not the decode's time


async def test_a_step_past_the_grace_keeps_what_is_known_of_the_decode(monkeypatch):
    """A review (2026-12-07): one RAPID step ran past answer_timeout_s and the grace; the
    caller's timeout cancelled the stream before its last chunk, and the answer's stats read
    {"truncated": true} and nothing else (no token count, no finish reason)."""
    from specrag.nodes import streaming

    monkeypatch.setattr(streaming, "GRACE_S", 0.2)
    model = SlowLocal(steps=4, step_s=0.5)  # its steps end at 0.5 s and at 1.0 s, past 0.8 s
    out = await streaming.stream_model(model, "q", budget_s=0.6, tags=["answer"])
    assert out.timed_out and out.tokens >= 1
    assert out.metadata["decoding"] == {"new_tokens": out.tokens, "finish_reason": "time"}
