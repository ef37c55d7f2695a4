"""The "retrieval delivered evidence" signal between the two parallel start nodes.

``draft`` (policy ``until_retrieval``) stops within one token of it; ``retrieve`` sets it ONLY
when it found usable evidence, so a failed, slow or empty retrieval lets the draft finish
within its own budget (it may become the unverified fallback answer).

Both start tasks of one run share the checkpoint id of their superstep, which identifies the
run without any extra state key. The table is bounded, so nothing leaks.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from langgraph.runtime import Runtime

_SIGNALS: OrderedDict[str, threading.Event] = OrderedDict()
_LOCK = threading.Lock()
_MAX = 4096


def retrieval_signal(runtime: Runtime[Any]) -> threading.Event:
    """The event set when this run's retrieval has delivered evidence."""
    info = getattr(runtime, "execution_info", None)
    key = f"{getattr(info, 'thread_id', '')}:{getattr(info, 'checkpoint_id', '') or id(runtime)}"
    with _LOCK:
        event = _SIGNALS.get(key)
        if event is None:
            event = _SIGNALS[key] = threading.Event()
            while len(_SIGNALS) > _MAX:
                _SIGNALS.popitem(last=False)
        return event
