"""A drafter that scores only some output rows (specrag.decoding.vocab) on tiny models.

The tiny target's greedy answers use tokens outside the drafter's subset, so a trimmed drafter
is wrong there by construction: every speculative test sees proposals AND rejections.
"""

import pytest
import torch

from specrag.decoding.candidates import NgramProposer
from specrag.decoding.drafter import DrafterPolicy, DrafterProposer, MergedProposer
from specrag.decoding.rapid import RapidConfig
from specrag.decoding.sampling import Sampler
from specrag.decoding.state import LMState
from specrag.decoding.vocab import VocabSubset, fit_rows
from tests.unit.test_decoding import (  # noqa: F401 - one_thread: the same autouse fixture
    counts_msg,
    greedy,
    one_thread,
    rapid_greedy,
)
from tests.unit.test_drafter import Recording, drafter_sampling_stats, greedy_run, tiny_pair

FIRST = 8  # rows kept besides the prompt's ids (of 64)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def prompt_of(seed: int, n: int = 12, high: int = 40) -> list[int]:
    return torch.randint(0, high, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_a_subset_scores_its_rows_as_the_full_layer_does_and_nothing_else(pair):
    target, _ = pair
    prompt = prompt_of(1)
    head = target.get_output_embeddings()
    full = LMState(target).extend(prompt)
    trimmed = LMState(target)
    kept = trimmed.restrict(FIRST, [*prompt, 63])
    part = trimmed.extend(prompt)
    ids = sorted({*range(FIRST), *prompt, 63})
    assert kept == len(ids) < 32
    torch.testing.assert_close(part[:, ids], full[:, ids])
    others = [i for i in range(64) if i not in ids]
    assert torch.isneginf(part[:, others]).all()
    # the model itself is untouched: another state of it scores every row
    assert target.get_output_embeddings() is head
    torch.testing.assert_close(LMState(target).extend(prompt), full)


def test_the_full_output_layer_is_back_after_a_forward_call_that_fails(pair):
    target, _ = pair
    head = target.get_output_embeddings()
    state = LMState(target)
    state.restrict(FIRST, [1, 2])
    with pytest.raises(IndexError):
        state.extend([10_000])  # not a token of this model: the embedding lookup fails
    assert target.get_output_embeddings() is head


def test_no_subset_where_it_would_save_too_little(pair):
    target, _ = pair
    assert VocabSubset.of(target, 0, [1, 2]) is None  # switched off
    assert VocabSubset.of(target, 32, []) is None  # half the rows
    assert VocabSubset.of(target, 16, range(16, 31)).kept == 31
    assert VocabSubset.of(target, 16, [-1, 99]).kept == 16  # ids outside the layer are ignored


@pytest.mark.parametrize("seed", [3, 4])
def test_greedy_decode_with_a_trimmed_drafter_is_plain_decoding(pair, seed):
    target, drafter = pair
    prompt = prompt_of(seed)
    plain, _ = greedy_run(target, prompt)
    trimmed = DrafterProposer(
        LMState(drafter), prompt, Sampler(0.0), eos_ids=(63,), vocab_first=FIRST
    )
    policy = DrafterPolicy(after_tokens=0, join_factor=0.0, min_acceptance=0.0, pay_check=False)
    recording = Recording(trimmed)
    proposer = MergedProposer(NgramProposer({}), recording, policy)
    out, stats = greedy_run(target, prompt, proposer)
    proposed, accepted = stats.proposed.get("drafter", 0), stats.accepted.get("drafter", 0)
    kept = set(range(FIRST)) | set(prompt) | {63}
    seen = {t for *_, tokens in recording.calls for t in tokens}
    assert out == plain
    assert proposed > accepted > 0, counts_msg(proposed, accepted)
    assert trimmed.stats.vocab_rows == len(kept)
    assert seen and seen <= kept  # the drafter never proposes a row it did not score ...
    assert set(plain) - kept  # ... and the target's answer needs some of those


def test_rapid_eta0_with_a_trimmed_drafter_is_target_only(pair):
    target, drafter = pair
    doc = prompt_of(5, n=120, high=64)
    target_prompt, drafter_prompt = doc + [5, 6], doc[-15:] + [5, 6]
    cfg = RapidConfig(gamma=4, eta=0.0, drafter_vocab=FIRST)
    out, stats = rapid_greedy(
        LMState(target), LMState(drafter), target_prompt, drafter_prompt, 30, cfg, eos_ids=(63,)
    )
    assert out == greedy(target, target_prompt, 30)
    assert stats.drafter_vocab_rows == len(set(range(FIRST)) | set(drafter_prompt) | {63})
    assert stats.draft_tokens > stats.accepted_tokens > 0, stats.as_dict()


def test_rapid_with_knowledge_transfer_keeps_every_drafter_row(pair):
    """With eta > 0 the drafter's q shapes the answer's distribution: it is not trimmed."""
    target, drafter = pair
    doc = prompt_of(6, n=60, high=64)
    cfg = RapidConfig(gamma=4, eta=5.0, drafter_vocab=FIRST)
    _, stats = rapid_greedy(
        LMState(target), LMState(drafter), doc + [5, 6], doc[-15:] + [5, 6], 10, cfg
    )
    assert stats.drafter_vocab_rows == 0 and stats.draft_tokens > 0


def test_merged_sampling_with_a_trimmed_drafter_is_lossless():
    """The drafter scores 2 of 3 rows (its q is 0 on the third); sampled output is still
    exactly the target's distribution.

    Thresholds as in test_drafter.test_merged_sampling_is_lossless. Measured: TV 0.092, TV_23
    0.018, drafter 11189 proposed / 1902 accepted. The subset is set on the drafter's state
    directly: :meth:`VocabSubset.of` would not keep 2 of 3 rows (too little to save), and
    the rows kept, not how they were chosen, are what sampling depends on.
    """
    r = drafter_sampling_stats(keep=[0, 2])
    info = f"TV={r['tv']:.3f} TV_23={r['tv_23']:.3f} " + counts_msg(r["proposed"], r["accepted"])
    print(info)
    assert r["proposed"] > r["accepted"] > 0, info
    assert r["proposed_rows"] == {0, 2}, info
    assert r["tv"] < 0.14, info
    assert r["tv_23"] < 0.06, info


def test_fit_rows_lays_a_drafter_out_on_the_target_rows():
    """Padded heads of one family: drafter rows past the target's or past the tokenizer are
    -inf, missing rows too; the same width with nothing to mask is returned as it is."""
    x = torch.randn(2, 72)
    assert fit_rows(x, 72, None) is x and fit_rows(x, 72, 80) is x and fit_rows(x, None) is x
    wider = fit_rows(x, 64)  # the drafter has 8 rows the target lacks
    assert wider.shape == (2, 64) and torch.equal(wider, x[:, :64])
    padded = fit_rows(x, 72, usable=64)  # 8 padding rows in both
    assert torch.equal(padded[:, :64], x[:, :64]) and torch.isneginf(padded[:, 64:]).all()
    narrower = fit_rows(x[:, :60], 64)  # the target has 4 rows more
    assert narrower.shape == (2, 64) and torch.isneginf(narrower[:, 60:]).all()
    assert fit_rows(x.to(torch.bfloat16), 72).dtype == torch.float32
