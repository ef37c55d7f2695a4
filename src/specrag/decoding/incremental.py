"""Decoding while the evidence grows: incremental, self-correcting answers.

The answer starts from the first batch of evidence. When a later batch arrives, the prompt is
rebuilt with all the evidence so far and the decode restarts on it *without starting over*:

1. the KV cache is cropped to the prefix the old and new prompts share (the chat head and the
   evidence blocks that did not change) - only the new evidence and the question are fed;
2. the tokens already generated are fed in the same pass and verified as speculative
   candidates (:func:`specrag.decoding.speculative.decode` with ``prior``): the agreed prefix
   is kept, the first disagreement is replaced by the model's own token, the rest is retracted
   (a :class:`~specrag.decoding.speculative.Revise` step);
3. decoding continues from there. When the answer ends before the evidence is complete, the
   decode waits for the next prompt (or for the feed to close) and re-verifies.

After the last prompt the answer is the decode of that prompt: token-identical (greedy) to
serial RAG over the final evidence, or distributed exactly as it (sampling: kept tokens are
deterministic proposals, accepted with probability ``p(c)``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from specrag.decoding.candidates import Proposer
from specrag.decoding.speculative import DecodeStats, Revise, Step, Token, decode
from specrag.decoding.state import LMState, shared_prefix

T = TypeVar("T")

# A decode that ended by itself; with evidence still to come it waits and re-verifies.
NATURAL_ENDS = ("stop", "length", "stop_sequence")
NEW_EVIDENCE = "new_evidence"


class PromptFeed(Generic[T]):
    """The rebuilt prompts of one incremental decode (thread-safe; the newest one wins).

    The answer node ``put``s a prompt per evidence batch and ``close``s the feed after the
    last one; the decode ``take``s between steps.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._latest: T | None = None
        self._pending = False
        self._closed = False
        self.puts = 0
        self.taken_puts = 0  # ``puts`` when the newest prompt taken was put
        self.read_puts = 0  # the same for the newest prompt the answer was verified under

    def put(self, item: T) -> None:
        """Offer a new prompt (replaces one not yet taken)."""
        with self._cv:
            self._latest, self._pending = item, True
            self.puts += 1
            self._cv.notify_all()

    def close(self) -> None:
        """No more prompts will come."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    @property
    def pending(self) -> bool:
        """A prompt was put and not yet taken."""
        return self._pending

    @property
    def closed(self) -> bool:
        """Closed and nothing pending: the current prompt is the final one."""
        return self._closed and not self._pending

    def take(self) -> T | None:
        """The newest prompt not yet taken, or None."""
        with self._cv:
            if self._pending:
                self.taken_puts = self.puts
            item, self._latest, self._pending = self._latest, None, False
            return item

    def wait(self, timeout: float) -> None:
        """Block until a prompt is put, the feed closes, or ``timeout`` seconds pass."""
        with self._cv:
            self._cv.wait_for(lambda: self._pending or self._closed, timeout=timeout)


def absorb(total: DecodeStats, part: DecodeStats, first: bool, judged: bool = True) -> None:
    """Add one segment's work counters to the whole decode's.

    ``first``: the segment's prefill is the answer's (no earlier prompt's prefill ran to its
    end). ``judged``: the segment's prefill pass ran to its end (not stopped between slices).
    """
    # every segment after the first starts with a prefill+verify pass of its own
    total.forward_passes += part.forward_passes + (0 if first or not judged else 1)
    for name in ("proposed", "accepted"):
        into = getattr(total, name)
        for key, value in getattr(part, name).items():
            into[key] = into.get(key, 0) + value
    # the first prompt's prefill is the answer's prefill; a rebuild's prefill+verify pass is a
    # cost of decoding incrementally, paid while the answer is decoded: decode time
    total.prefill_s += part.prefill_s if first else 0.0
    total.decode_s += part.decode_s + (0.0 if first else part.prefill_s)
    total.decode_own_s += part.decode_own_s + (0.0 if first else part.prefill_s)
    total.plain_steps += part.plain_steps
    total.plain_step_s += part.plain_step_s
    total.widest = max(total.widest, part.widest)
    total.cache_refills = part.cache_refills  # the answer model's own count, cumulative
    total.cache_restores = part.cache_restores
    if first or judged:  # the prompt the answer stands on (not a rebuild stopped unjudged)
        total.prompt_tokens = part.prompt_tokens
    total.finish_reason = part.finish_reason


def decode_incremental(
    lm: LMState,
    prompt: list[int],
    feed: PromptFeed[Any],
    encode: Callable[[Any], list[int]],
    *,
    make_proposer: Callable[[list[int]], Proposer | None],
    should_stop: Callable[[int], str | None],
    stats: DecodeStats,
    poll_s: float = 0.01,
    answer_cap: Callable[[], int] | None = None,
    others_waiting: Callable[[], bool] | None = None,
    **decode_kwargs: Any,
) -> Iterator[Step]:
    """:func:`decode` over a prompt that is rebuilt while the answer is decoded.

    ``feed`` delivers new prompts (``encode`` turns one into token ids); ``make_proposer``
    builds the speculative proposer for each prompt (its n-grams are the new evidence). Yields
    token lists and :class:`Revise` steps, and - while it waits for evidence after the answer
    ended - empty lists (the model thread serves other work in between). ``stats`` gets the
    summed counters, the answer's tokens by source, and one record per rebuild in
    ``stats.rebuilds``. ``answer_cap``: read after each ``encode``, the answer's token
    limit for that prompt (a longer prompt may leave the answer less of the context).
    ``others_waiting``: other work is queued on the thread that steps this decode; while
    waiting for evidence the decode then blocks 1 ms at most per turn instead of ``poll_s``
    (not 0: two decodes waiting behind each other would spin).
    """
    answer: list[Token] = []
    first = True  # the first prompt
    prefilled = False  # a prompt's prefill ran to its end (new evidence can stop the first)
    while True:
        part = DecodeStats()
        stats.segment = part  # summed into ``stats`` when the segment ends

        def stop(n: int) -> str | None:
            reason = should_stop(n)
            if reason == "stop_sequence" and verifying:
                reason = None  # the old answer's stop sequence: this pass judges that answer
            if reason and reason != "stop_sequence":
                return reason
            return NEW_EVIDENCE if feed.pending else reason

        if answer_cap is not None:
            decode_kwargs["max_new_tokens"] = answer_cap()
        # the positions decode keeps (a whole cached prompt: its last is re-read for its logits)
        reused = min(shared_prefix(lm.tokens, prompt), len(prompt) - 1)
        before = len(answer)
        # verifying: a rebuild's prefill pass, which judges the answer shown so far
        verifying, judged = not first, False
        reading = feed.taken_puts  # this prompt's (0: the first, given before any put)
        t0 = time.perf_counter()
        for item in decode(
            lm,
            prompt,
            proposer=make_proposer(prompt),
            should_stop=stop,
            stats=part,
            prior=answer,
            **decode_kwargs,
        ):
            # judged: the rebuild's pass verified the answer (a Revise before that is only a
            # cut to a lower answer limit); a stop sequence in what is kept now stops it
            if not isinstance(item, Revise) or "kept" in part.accepted:
                verifying, judged = False, True
                feed.read_puts = reading  # the answer now stands on this prompt's evidence
            if isinstance(item, Revise):
                del answer[item.keep :]
            else:
                answer.extend(item)
            yield item
        if "kept" in part.accepted and not judged:  # verified, all kept, nothing new to say
            judged = True  # (an answer that had ended: its end token or the limit)
            feed.read_puts = reading
        if not first:
            # a rebuild stopped in its prefill (time, cancellation) kept the answer unjudged
            kept = part.accepted.get("kept", 0) if judged else len(answer)
            stats.rebuilds.append(
                {
                    "at_tokens": before,
                    "kept_tokens": kept,
                    "dropped_tokens": before - kept if before else 0,
                    "prompt_tokens": len(prompt),
                    "reused_prefix_tokens": reused,
                    "verify_s": round(part.prefill_s, 4),
                    "at_s": round(t0 - stats.started, 4),
                }
            )
        # until a prefill has run to its end, each segment's prefill is the answer's prefill
        absorb(stats, part, not prefilled, judged)
        prefilled = prefilled or judged
        first = False
        stats.new_tokens = len(answer)
        stats.sources = dict(Counter(t.source for t in answer))
        reason = part.finish_reason
        if reason != NEW_EVIDENCE and reason not in NATURAL_ENDS:
            return  # time, cancellation: the answer ends as it is
        while not feed.pending:  # the answer ended: wait for the rest of the evidence
            if feed.closed:
                return
            late = should_stop(len(answer))
            if late and late != "stop_sequence":
                # the answer had ended by itself: it keeps its finish reason (a budget that
                # ends the wait leaves batches unread, which the caller reports as such)
                return
            busy = others_waiting is not None and others_waiting()
            feed.wait(min(poll_s, 0.001) if busy else poll_s)  # never a busy loop
            yield []
        new = feed.take()
        if new is not None:
            prompt = encode(new)
