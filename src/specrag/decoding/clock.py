"""The clock a decode's own timings read: this thread's time less what it lent to others.

A long turn of the model thread (a long prompt's prefill) runs one queued short call at its
stop checks (:meth:`specrag.models.worker.ModelThread.run_waiting_calls`). The timings a
decode steers by - its prefill, its drafter's first reading, the prefill ratio a join books
into ``pass-timings.json`` - must hold its own work only, so they read :func:`own_clock`,
which leaves out the seconds this thread spent on calls it was lent. Durations that span
turns (``decode_s``, the drafter's join wait) are wall time: other runs' steps are in them
anyway, and a lent total is the thread's, not the run's.
"""

from __future__ import annotations

import threading
import time

_thread = threading.local()


def own_clock() -> float:
    """``time.perf_counter()`` less the seconds this thread has spent on lent calls."""
    return time.perf_counter() - getattr(_thread, "lent_s", 0.0)


def count_lent(seconds: float) -> None:
    """Book ``seconds`` this thread spent on a call it was lent (not its own work)."""
    _thread.lent_s = getattr(_thread, "lent_s", 0.0) + seconds
