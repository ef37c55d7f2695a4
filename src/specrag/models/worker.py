"""One thread for all model (torch) work, with decode jobs advanced a step at a time.

Why: on 2 CPU cores a SmolLM2 decode step took ~62-72 ms on the only thread that ran torch,
but ~90-100 ms once a second thread had run torch work too (measured; each calling thread gets
its own OpenMP team and they degrade each other). So every model call - decoding, embedding,
loading - runs here.

How: tasks are callables in a FIFO. A decode job is a generator; each turn runs ONE step
(``next``) and puts the job back at the end of the queue, so concurrent runs interleave
fairly and a quick task (embedding a question) waits at most one step of each active decode
(``max_active`` steps). At most ``max_active`` decode jobs hold KV caches at once; the rest
wait their turn (bounded memory).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from specrag.decoding.clock import count_lent

T = TypeVar("T")
log = logging.getLogger(__name__)


LEND_AFTER_S = 0.5  # a turn this long lends the model thread to one queued short call


class _Call:
    """A call queued on the model thread (``submit``), not a decode job's step.

    ``short``: a call a long turn may run at its stop checks (``submit_short``: a question's
    embedding, a batch of passages); a model's load or a timing never is.
    """

    __slots__ = ("run", "short")

    def __init__(self, run: Callable[[], None], short: bool = False) -> None:
        self.run = run
        self.short = short

    def __call__(self) -> None:
        self.run()


class ModelThread:
    """A single daemon thread running submitted tasks and stepping decode generators."""

    def __init__(self, max_active: int = 4) -> None:
        self.max_active = max_active
        self._start()

    def _start(self) -> None:
        self._tasks: deque[Callable[[], None]] = deque()
        self._waiting: deque[Callable[[], None]] = deque()  # decode jobs not yet started
        self._active = 0
        self._busy = False
        self._turn_start = 0.0  # when the running task began, or last lent the thread
        self._own_s = LEND_AFTER_S  # its own work due before it lends (again)
        self.closing = False  # set at interpreter exit: decode jobs stop at their next check
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="specrag-model", daemon=True)
        self._thread.start()

    def restart_in_child(self) -> None:
        """A new thread, with nothing queued, in a process forked from this one.

        ``os.fork`` (gunicorn ``--preload``, multiprocessing's fork) gives the child this
        object but not its thread: every model call waited for it forever. The parent's jobs
        stay the parent's.
        """
        self._start()

    @property
    def ident(self) -> int | None:
        """Thread id of the model thread."""
        return self._thread.ident

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._busy = False
                self._cv.notify_all()
                while not self._tasks:
                    self._cv.wait()
                task = self._tasks.popleft()
                self._busy = True
                self._turn_start = time.monotonic()
                self._own_s = LEND_AFTER_S
            try:
                task()  # tasks report through futures or callbacks ...
            except BaseException:  # noqa: BLE001 - ... and one that raises fails alone
                log.exception("a model-thread task failed; the thread keeps serving")

    def close(self, timeout: float = 30.0) -> None:
        """Stop decode jobs at their next check and wait (bounded) until the thread is idle.

        Called at interpreter exit: a daemon thread killed inside a torch kernel aborts the
        process ("terminate called without an active exception").
        """
        self.closing = True
        with contextlib.suppress(KeyboardInterrupt), self._cv:  # Ctrl-C again: stop waiting
            self._cv.wait_for(lambda: not self._busy and not self._tasks, timeout=timeout)

    def _push(self, task: Callable[[], None]) -> None:
        with self._cv:
            self._tasks.append(task)
            self._cv.notify()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn`` on the model thread; the future holds its result or exception."""
        return self._submit(False, fn, args, kwargs)

    def submit_short(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """As :meth:`submit`, for a short call a long turn may run at its stop checks.

        Only calls of a fraction of a second belong here (a question's embedding, a batch of
        32 passages): a lent call pauses the turn that lends it, whose budget keeps running.
        """
        return self._submit(True, fn, args, kwargs)

    def _submit(
        self, short: bool, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Future[T]:
        future: Future[T] = Future()

        def task() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

        self._push(_Call(task, short))
        return future

    def run_waiting_calls(self, before: Callable[[], None] | None = None) -> None:
        """On the model thread, inside a long turn: run the first short call queued behind it.

        A decode checks its stop between prefill slices and steps; a RAPID document's
        prefill (thousands of tokens) is one turn, and a question's embedding queued behind
        it waited the whole prefill while its retrieval budget ran out. A turn lends the
        thread once it has run :data:`LEND_AFTER_S` of its own work (after a lent call: as
        long as that call took), one call at a time, and only to calls queued by
        :meth:`submit_short`: a model's load or a cost timing queued
        behind it waits for the turn's end (lent, it would pause the turn for seconds while
        the turn's budget ran). The lent seconds are booked on this thread
        (:func:`specrag.decoding.clock.count_lent`), so the timings a decode steers by - its
        prefill, its drafter's reading - hold only its own work. Other jobs' steps still wait
        their turn. Anywhere but on the model thread this does nothing. ``before`` runs just
        before a call is lent (the turn's device synchronised: on a GPU the turn's queued
        slices would otherwise run during the lent call and leave the turn's own clock).
        """
        if threading.get_ident() != self.ident:
            return
        if time.monotonic() - self._turn_start < self._own_s:
            return
        with self._cv:
            call = next((t for t in self._tasks if isinstance(t, _Call) and t.short), None)
            if call is not None:
                self._tasks.remove(call)
        if call is not None:
            if before is not None:
                try:
                    before()
                except BaseException:  # (a device's sticky error): the call waits on, not lost
                    with self._cv:
                        self._tasks.appendleft(call)
                        self._cv.notify()
                    raise
            lent = time.perf_counter()
            try:
                call()  # a submitted call hands its exception to its future
            finally:
                took = time.perf_counter() - lent
                count_lent(took)
            # the turn's own work again before the next, as long as the call took: a turn
            # lending batches of passages (~1 s each on 2 cores) keeps half the thread
            self._turn_start, self._own_s = time.monotonic(), max(LEND_AFTER_S, took)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the model thread and wait (directly when already on it)."""
        if threading.get_ident() == self.ident:
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()

    def call_short(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """As :meth:`call`, queued by :meth:`submit_short` (a long turn may lend to it)."""
        if threading.get_ident() == self.ident:
            return fn(*args, **kwargs)
        return self.submit_short(fn, *args, **kwargs).result()

    @property
    def others_waiting(self) -> bool:
        """Tasks are queued behind the one running (read on the model thread, unlocked)."""
        return bool(self._tasks)

    def run_steps(
        self,
        start: Callable[[], Iterator[Any] | None],
        on_item: Callable[[Any], None],
        on_end: Callable[[BaseException | None], None],
    ) -> None:
        """Step the generator ``start()`` returns, one item per turn, interleaved with others.

        ``start`` runs on the model thread when the job gets a slot (it may return None to
        skip the job); ``on_end`` is always called once, with the exception if one was raised.
        """
        gen: Iterator[Any] | None = None

        def finish(exc: BaseException | None) -> None:
            # the slot is released first, whatever the job's callbacks do next
            with self._cv:
                self._active -= 1
                if self._waiting:
                    self._active += 1
                    self._tasks.append(self._waiting.popleft())
                    self._cv.notify()
            if gen is not None:
                try:
                    gen.close()  # type: ignore[attr-defined]  # frees the job's KV caches now
                except BaseException:  # noqa: BLE001
                    log.exception("closing a decode job failed")
            try:
                on_end(exc)
            except BaseException:  # noqa: BLE001 - e.g. the consumer's event loop is closed
                log.warning("a decode job's consumer is gone (%s)", exc or "finished")

        def step() -> None:
            nonlocal gen
            try:
                if gen is None:
                    gen = start()
                    if gen is None:
                        return finish(None)
                item = next(gen)
            except StopIteration:
                return finish(None)
            except BaseException as exc:  # noqa: BLE001 - reported through on_end
                return finish(exc)
            try:
                on_item(item)
            except BaseException as exc:  # noqa: BLE001 - the consumer failed: end this job only
                return finish(exc)
            self._push(step)  # back of the queue: other jobs and tasks get a turn

        with self._cv:
            if self._active < self.max_active:
                self._active += 1
                self._tasks.append(step)
                self._cv.notify()
            else:
                self._waiting.append(step)


MODEL_THREAD = ModelThread()
atexit.register(MODEL_THREAD.close)
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=MODEL_THREAD.restart_in_child)
