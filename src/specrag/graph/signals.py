"""The "retrieval delivered evidence" signal between the two parallel start nodes.

``draft`` (policy ``until_retrieval``) stops within one token of it; ``retrieve`` sets it ONLY
when it found usable evidence, so a failed, slow or empty retrieval lets the draft finish
within its own budget (it may become the unverified fallback answer).

The signal is keyed by the run id ``prepare`` draws for every run (a checkpoint id would be
reused by a replay or a retry, finding an old signal already set). The table is bounded, so
nothing leaks.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

_SIGNALS: OrderedDict[str, threading.Event] = OrderedDict()
_LOCK = threading.Lock()
_MAX = 4096


def retrieval_signal(state: dict[str, Any]) -> threading.Event:
    """The event set when this run's retrieval has delivered evidence."""
    key = str(state.get("run_id") or "")
    with _LOCK:
        event = _SIGNALS.get(key)
        if event is None:
            event = _SIGNALS[key] = threading.Event()
            while len(_SIGNALS) > _MAX:
                _SIGNALS.popitem(last=False)
        return event
