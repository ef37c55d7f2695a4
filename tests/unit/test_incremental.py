"""Incremental decoding: the prompt grows while the answer is decoded (tiny random models).

The invariant: whatever was decoded under the earlier prompts, the final answer is the decode
of the final prompt - token-identical under greedy decoding, distributed exactly as it under
sampling - and each test of it asserts that rebuilds happened AND that some tokens were
retracted (an incremental test in which the new evidence never changes the answer proves
nothing). The tests of edge cases (a rebuild that keeps all, a stopped prefill, the counters)
say what they check instead.
"""

from collections import Counter

import pytest
import torch

from specrag.decoding.candidates import NgramProposer
from specrag.decoding.incremental import PromptFeed, decode_incremental
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import DecodeStats, Revise
from specrag.decoding.state import LMState, shared_prefix
from tests.tiny import tiny_llama
from tests.unit.test_decoding import (
    exact_conditionals,
    exact_sequences,
    greedy,
    one_thread,  # noqa: F401 - module fixture: one torch thread
    tv_to_exact,
)

HEAD, NEW_EVIDENCE, QUESTION = [5, 9, 3], [11, 12, 13, 14], [7, 1, 2]
P1 = HEAD + QUESTION  # the first batch's prompt
P2 = HEAD + NEW_EVIDENCE + QUESTION  # rebuilt: a new evidence block before the question


def drive(model, prompts, n, put_after, *, sampler=None, generator=None, eos=(), ngrams=False):
    """Run an incremental decode; put ``prompts[1:]`` once ``put_after`` tokens are shown.

    A ``put_after`` beyond the answer's end puts them while the decode waits (the answer
    ended before the evidence was complete). Returns what a client shows at the end, the
    stats and the retractions.
    """
    feed, stats, lm = PromptFeed(), DecodeStats(), LMState(model)
    shown, revises, later = [], [], list(prompts[1:])
    gen = decode_incremental(
        lm,
        prompts[0],
        feed,
        list,
        make_proposer=(lambda p: NgramProposer({"prompt": p})) if ngrams else (lambda p: None),
        should_stop=lambda _n: None,
        stats=stats,
        max_new_tokens=n,
        sampler=sampler or Sampler(0.0),
        eos_ids=eos,
        generator=generator,
    )
    for item in gen:
        if not hasattr(stats, "first_prefill_s"):  # the first prompt's prefill, done by now
            stats.first_prefill_s = stats.segment.prefill_s
        if isinstance(item, Revise):
            revises.append(item)
            del shown[item.keep :]
        else:
            shown.extend(t.id for t in item)
        if later and (len(shown) >= put_after or item == []):
            feed.put(later.pop(0))
            if not later:
                feed.close()
    return shown, stats, revises


def plain_incremental(model, feed, stats, **kw):
    """An incremental greedy decode of P1 without a proposer (``kw`` overrides)."""
    args = dict(make_proposer=lambda p: None, should_stop=lambda _n: None, sampler=Sampler(0.0))
    return decode_incremental(LMState(model), P1, feed, list, stats=stats, **{**args, **kw})


CASES = [(seed, after) for seed in range(6) for after in (1, 4, 30)]


@pytest.mark.parametrize("ngrams", [False, True])
def test_greedy_incremental_equals_serial_over_final_evidence(ngrams):
    """Rebuilt at 1 or 4 tokens or after the answer ended: the answer is serial RAG's."""
    kept_and_dropped = 0
    for seed, after in CASES:
        model = tiny_llama(seed=seed)
        n = 12
        shown, stats, revises = drive(model, [P1, P2], n, after, ngrams=ngrams)
        assert shown == greedy(model, P2, n), (seed, after)
        assert len(stats.rebuilds) == 1, (seed, after)
        rebuild = stats.rebuilds[0]
        assert rebuild["reused_prefix_tokens"] == shared_prefix(P1, P2) == len(HEAD)
        assert stats.new_tokens == len(shown)
        assert sum(stats.tokens_from().values()) == len(shown)
        assert "kept" not in stats.tokens_from()  # the shown tokens' own sources, not a rebuild's
        if revises:
            assert rebuild["dropped_tokens"] == revises[0].dropped > 0
        kept_and_dropped += bool(revises) and rebuild["kept_tokens"] > 0
    # the new evidence changed some answers part-way: kept a prefix, retracted the rest
    assert kept_and_dropped >= 2, kept_and_dropped


def test_the_running_segments_prefill_is_visible_before_it_is_summed():
    """The drafter's join estimate reads the target's prefill while the first segment runs;
    the summed stats get it only when the segment ends."""
    feed, stats = PromptFeed(), DecodeStats()
    feed.close()
    gen = plain_incremental(tiny_llama(seed=1), feed, stats, max_new_tokens=6)
    next(gen)
    assert stats.prefill_s == 0 and stats.segment is not None and stats.segment.prefill_s > 0
    for _ in gen:
        pass
    assert stats.prefill_s == stats.segment.prefill_s > 0


def test_three_batches_and_an_unchanged_answer():
    """Two rebuilds, each keeping a prefix and retracting the rest; a rebuild whose answer
    does not change retracts nothing."""
    p3 = HEAD + NEW_EVIDENCE + [20, 21] + QUESTION
    model = tiny_llama(seed=3)
    shown, stats, revises = drive(model, [P1, P2, p3], 10, 2)
    assert shown == greedy(model, p3, 10)
    assert len(stats.rebuilds) == 2
    assert len(revises) == 2 and all(r.keep > 0 and r.dropped > 0 for r in revises)
    # a rebuild's prefill+verify pass is decode time (a cost only incremental answers add),
    # not the answer's prefill, which stays the first prompt's
    rebuilt = sum(r["verify_s"] for r in stats.rebuilds)
    assert rebuilt > 0 and stats.decode_s >= rebuilt
    assert stats.prefill_s == stats.first_prefill_s
    same, _, revises = drive(model, [P1, P1], 10, 3)
    assert same == greedy(model, P1, 10) and not revises


def test_answer_ended_before_the_evidence_waits_and_reverifies():
    """An end-of-sequence before the last batch is not the end: the decode waits for it."""
    model = tiny_llama(seed=2)
    plain1, plain2 = greedy(model, P1, 6), greedy(model, P2, 6)
    eos = plain1[3]  # the first answer "ends" at its 4th token
    assert eos not in plain2[:5] or plain2 != plain1  # the final answer differs
    shown, stats, _ = drive(model, [P1, P2], 6, 99, eos=(eos,))
    final = greedy_eos(model, P2, 6, eos)
    assert shown == final
    assert stats.rebuilds and stats.rebuilds[0]["at_tokens"] == plain1.index(eos) + 1


def greedy_eos(model, prompt, n, eos):
    from specrag.decoding.speculative import decode

    gen = decode(LMState(model), prompt, max_new_tokens=n, sampler=Sampler(0.0), eos_ids=(eos,))
    return [t.id for step in gen for t in step]


def test_sampled_incremental_answer_has_the_final_prompts_distribution():
    """Sampling: kept tokens are one-hot proposals, so the answer is distributed as P2's.

    Vocab 3 at temperature 3 (spread distributions), 4 new tokens, the rebuild after the
    second token: 2000 runs against the exact distribution of plain sampling under P2 (81
    outcomes; multinomial draws from the exact distribution give TV mean 0.045, 99.9% quantile
    0.068). Measured: TV 0.056. Mutation: keeping every earlier token unverified (the mixture
    of P1's and P2's distributions) gave TV 0.095 and no retraction.
    """
    model = tiny_llama(vocab=3, seed=4, layers=1)
    p1, p2, new, sampler = [1, 2, 0, 1], [1, 2, 2, 2, 0, 1], 4, Sampler(3.0)
    exact = exact_sequences(exact_conditionals(model, p2, new, sampler), 3, new)
    g = torch.Generator().manual_seed(5)
    counts, dropped, kept = Counter(), 0, 0
    for _ in range(2000):
        shown, stats, revises = drive(model, [p1, p2], new, 2, sampler=sampler, generator=g)
        counts[tuple(shown)] += 1
        dropped += sum(r.dropped for r in revises)
        kept += stats.rebuilds[0]["kept_tokens"]
    tv = tv_to_exact(counts, exact)
    assert dropped > 0 and kept > 0, (dropped, kept)
    assert tv < 0.075, f"TV={tv:.3f} kept={kept} dropped={dropped}"


def test_a_stop_sequence_in_an_early_answer_does_not_skip_the_rebuild():
    """A first answer that wrote a stop sequence (an invented "\\nQuestion:") set the
    consumer's stop flag; the rebuild's prefill read that flag, stopped before verifying, and
    the first batch's answer was returned as the final evidence's. The consumer here works as
    ``_Run`` does: the flag is set when a shown token is the stop token and looked for again
    in what a ``Revise`` keeps. The answer must be serial RAG's over the final prompt, cut at
    its own first stop token."""
    checked = revised = 0
    for seed in range(8):
        model = tiny_llama(seed=seed)
        first, final = greedy(model, P1, 12), greedy(model, P2, 12)
        stop_token = first[3]  # the first answer "writes a stop sequence" at its 4th token
        expected = final[: final.index(stop_token)] if stop_token in final else final
        for put_after in (5, 99):  # while it decodes past the stop, or once it has ended
            feed, stats, lm = PromptFeed(), DecodeStats(), LMState(model)
            shown: list[int] = []
            pending = [P2]
            hit = [False]
            gen = decode_incremental(
                lm,
                P1,
                feed,
                list,
                make_proposer=lambda p: NgramProposer({"prompt": p}),
                should_stop=lambda _n: "stop_sequence" if hit[0] else None,
                stats=stats,
                max_new_tokens=12,
                sampler=Sampler(0.0),
            )
            for item in gen:
                if isinstance(item, Revise):
                    del shown[item.keep :]
                    revised += 1
                else:
                    shown.extend(t.id for t in item)
                hit[0] = stop_token in shown
                if pending and (len(shown) >= put_after or item == []):
                    feed.put(pending.pop())
                    feed.close()
            visible = shown[: shown.index(stop_token)] if stop_token in shown else shown
            assert visible == expected, (seed, put_after)
            assert len(stats.rebuilds) == 1 and stats.rebuilds[0]["prompt_tokens"] == len(P2)
            checked += visible != first[:3]  # the final evidence changed the answer
    assert checked >= 4 and revised >= 4, (checked, revised)


@pytest.mark.parametrize("busy", [False, True])
def test_a_decode_waiting_for_evidence_blocks_only_an_idle_thread(busy):
    """An answer that ended before the evidence did blocked the model thread for poll_s at
    every turn, so each other run's step waited behind it; with work queued it blocks 1 ms at
    most (not 0: two decodes waiting behind each other would spin)."""

    class Counted(PromptFeed):
        waits: list[float] = []

        def wait(self, timeout):
            Counted.waits.append(timeout)
            super().wait(timeout)

    feed = Counted()
    gen = plain_incremental(
        tiny_llama(seed=1),
        feed,
        DecodeStats(),
        max_new_tokens=4,
        poll_s=0.05,
        others_waiting=lambda: busy,
    )
    idle = 0
    for item in gen:
        if item == []:
            idle += 1
            if idle == 3:
                feed.close()
    assert idle == 3 and Counted.waits == [0.001 if busy else 0.05] * 3


def test_a_rebuild_stopped_in_its_prefill_keeps_the_answer_it_read_within_the_new_limit():
    """The budget ends during a rebuild's prefill: the answer is the earlier prompt's (never
    judged by the new one, so the feed says the answer read the first prompt, not the one it
    took), cut to the lower answer limit the longer prompt set (it ran past it before)."""
    model = tiny_llama(seed=4)
    first = greedy(model, P1, 12)
    feed, stats = PromptFeed(), DecodeStats()
    caps = iter([12, 5])
    budget_over = [False]
    gen = plain_incremental(
        model,
        feed,
        stats,
        should_stop=lambda n: "time" if budget_over[0] and n == 0 else None,
        answer_cap=lambda: next(caps),
    )
    shown: list[int] = []
    for item in gen:
        if isinstance(item, Revise):
            del shown[item.keep :]
        else:
            shown.extend(t.id for t in item)
        if len(shown) >= 8 and not feed.puts:
            feed.put(P2)  # taken at the next step; the budget ends in its prefill
            feed.close()
            budget_over[0] = True
    assert shown == first[:5]
    assert stats.finish_reason == "time" and stats.new_tokens == 5
    (rebuild,) = stats.rebuilds
    assert rebuild["kept_tokens"] == 5 and rebuild["at_tokens"] >= 8
    assert feed.taken_puts == 1 and feed.read_puts == 0  # taken, never read
    # the prompt the answer stands on (usage_metadata's input_tokens reads it): the first
    assert stats.prompt_tokens == len(P1) and rebuild["prompt_tokens"] == len(P2)


def test_a_rebuild_that_keeps_an_ended_answer_whole_counts_as_read():
    """An answer that had ended (its end token) and a later prompt that agrees with all of
    it: the rebuild verifies it in its prefill and yields nothing, and it was booked as never
    read - the answer cited the older evidence, said later batches were not woven in, and
    the rebuild's pass was not counted."""
    model = tiny_llama(seed=2)
    eos = greedy(model, P1, 6)[3]  # the answer ends at its 4th token
    feed, stats = PromptFeed(), DecodeStats()
    gen = plain_incremental(model, feed, stats, max_new_tokens=6, eos_ids=(eos,))
    items = []
    for item in gen:
        items.append(item)
        if item == [] and not feed.puts:  # ended; the same evidence comes again
            feed.put(P1)
            feed.close()
    assert feed.taken_puts == 1 and feed.read_puts == 1
    (rebuild,) = stats.rebuilds
    assert rebuild["kept_tokens"] == rebuild["at_tokens"] == 4
    assert not any(isinstance(i, Revise) for i in items)
    steps = 3  # after the prefill (not counted here): tokens 2-4, the 4th the end token
    assert stats.forward_passes == steps + 1  # and the rebuild's verify pass


def test_a_first_prefill_stopped_by_new_evidence_is_still_the_answers_prefill():
    """A batch arrives before the first prompt's prefill ends: the prefill is stopped and the
    next prompt's prefill is the answer's (it was counted as a rebuild's verify pass: one
    forward pass too many and its time as decode time); the answer is serial's over P2."""
    model = tiny_llama(seed=3)
    feed, stats = PromptFeed(), DecodeStats()
    feed.put(P2)  # pending before the first slice: the first prefill stops at once
    feed.close()
    shown = [t.id for item in plain_incremental(model, feed, stats, max_new_tokens=8) for t in item]
    assert shown == greedy(model, P2, 8)
    out = stats.as_dict()
    assert out["forward_passes"] == out["new_tokens"] == 8  # a plain decode: one per token
    assert stats.prefill_s > 0 and len(stats.rebuilds) == 1


def test_a_stopped_prefill_has_no_decode_time():
    """A prefill stopped between slices spent its time prefilling: decode_s 0 (a stopped
    rebuild's time was summed twice, once as prefill and once as decode)."""
    from specrag.decoding.speculative import decode

    stats = DecodeStats()
    steps = list(
        decode(
            LMState(tiny_llama(seed=1)),
            P2,
            max_new_tokens=4,
            sampler=Sampler(0.0),
            should_stop=lambda _n: "time",
            stats=stats,
        )
    )
    assert steps == [] and stats.finish_reason == "time"
    assert stats.decode_s == 0.0 and stats.prefill_s > 0


def test_an_answer_that_ended_keeps_its_finish_reason_when_the_wait_for_evidence_ends():
    """The answer reached its limit, then the budget ended the wait for the next batch: the
    answer is whole for what it read (reported "time", it was marked cut by the budget)."""
    model = tiny_llama(seed=4)
    feed, stats = PromptFeed(), DecodeStats()
    ended = [False]
    gen = plain_incremental(
        model,
        feed,
        stats,
        max_new_tokens=6,
        should_stop=lambda n: "time" if ended[0] else None,
    )
    shown = []
    for item in gen:
        if item == []:  # waiting for evidence: the budget ends now
            ended[0] = True
        shown.extend(t.id for t in item)
    assert shown == greedy(model, P1, 6)
    assert stats.finish_reason == "length" and stats.new_tokens == 6


def test_a_rebuild_on_the_same_prompt_reports_the_positions_it_kept():
    """A rebuilt prompt equal to the cached one (a fitting that cut the new chunks out) was
    reported as reusing all of it; decode re-reads its last position for the logits (a
    review, 2026-12-07). The answer is the plain one."""
    model = tiny_llama(seed=0)
    shown, stats, _ = drive(model, [P1, P1], 12, 4)
    assert shown == greedy(model, P1, 12)
    assert [r["reused_prefix_tokens"] for r in stats.rebuilds] == [len(P1) - 1]
