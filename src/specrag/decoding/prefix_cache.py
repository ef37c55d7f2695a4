"""Reusing a long document's KV cache across questions.

Prompts are laid out document-first, so every question about the same document shares the
token prefix ``[chat head + document]``. The first question pays the prefill; later ones clone
the cached prefix and prefill only the question. Entries are keyed by model identity and a hash
of the prefix tokens, and bounded by total bytes (least recently used goes first).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from specrag.decoding.state import LMState


def prefix_key(model_key: str, prefix: list[int]) -> str:
    """Cache key of a token prefix for one model."""
    digest = hashlib.sha256(",".join(map(str, prefix)).encode()).hexdigest()
    return f"{model_key}:{len(prefix)}:{digest}"


class PrefixCache:
    """LRU of prefilled :class:`LMState` prefixes, bounded in bytes."""

    def __init__(self, max_bytes: int = 4 * 2**30) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, LMState] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> LMState | None:
        """A private clone of the cached prefix, or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        return entry.clone()

    def put(self, key: str, state: LMState) -> None:
        """Store a clone of ``state``: the prefix of ``key``, or a start of it.

        A partial prefix (a budget stopped its prefill) is continued by the next caller.
        """
        snapshot = state.clone()
        with self._lock:
            self._entries[key] = snapshot
            self._entries.move_to_end(key)
            while len(self._entries) > 1 and self.nbytes() > self.max_bytes:
                self._entries.popitem(last=False)

    def nbytes(self) -> int:
        """Bytes held by all entries."""
        return sum(e.nbytes() for e in self._entries.values())

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()


DEFAULT_PREFIX_CACHE = PrefixCache()
