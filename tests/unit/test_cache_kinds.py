"""Speculative decoding on models whose caches are not plain key/value stores.

Transformers keeps only the last window of positions for sliding-window and chunked layers
(Mistral, Gemma 2/3, Qwen2 with ``use_sliding_window``) and cannot crop such a cache once the
window is full; linear-attention layers (LFM2's convolutions) keep a rolling state. Every
verify pass crops rejected candidates, so before ``specrag.decoding.state.rollback_cache`` a
sliding-window model crashed at its first rejection past the window. Each test runs prompts
longer than the window, asserts proposals were made AND some rejected, and compares with the
model's own greedy answer (each token from a forward over the whole text, no cache).
"""

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Lfm2Config,
    Lfm2ForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from specrag.decoding import state as state_module
from specrag.decoding.candidates import NgramProposer
from specrag.decoding.drafter import DrafterPolicy, DrafterProposer, MergedProposer
from specrag.decoding.prefix_cache import PrefixCache, prefix_key
from specrag.decoding.rapid import RapidConfig
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import DecodeStats, decode, prefill_verify
from specrag.decoding.state import VERIFIER_MARKS, LMState, Stopped
from tests.unit.test_decoding import (  # noqa: F401 - one_thread: the same autouse fixture
    counts_msg,
    one_thread,
    rapid_greedy,
    run,
)

WINDOW = 8
SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
KINDS = {
    # every layer sliding
    "mistral": lambda w, n: (MistralForCausalLM, MistralConfig(sliding_window=w, **n)),
    # sliding layers after the first max_window_layers (a hybrid cache)
    "qwen2": lambda w, n: (
        Qwen2ForCausalLM,
        Qwen2Config(use_sliding_window=True, sliding_window=w, max_window_layers=1, **n),
    ),
    # alternating sliding and full layers
    "gemma2": lambda w, n: (
        Gemma2ForCausalLM,
        Gemma2Config(
            sliding_window=w,
            head_dim=8,
            final_logit_softcapping=None,
            tie_word_embeddings=False,
            **n,
        ),
    ),
}


def build(kind, window=WINDOW, layers=2, seed=0):
    """A tiny random model of ``kind`` (``window`` past every position: no window at all)."""
    cls, config = KINDS[kind](window, {**SIZES, "num_hidden_layers": layers})
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():  # peaked distributions: drafts are often right, sometimes not
        model.lm_head.weight.mul_(40.0)
    return model


@torch.inference_mode()
def hf_greedy(model, prompt, n):
    """The model's own greedy answer: each token from a forward over the whole text, no cache."""
    out: list[int] = []
    for _ in range(n):
        out.append(int(model(torch.tensor([prompt + out])).logits[0, -1].argmax()))
    return out


class Corrupted:
    """Proposes ``ref``'s continuation, its last candidate wrong in every other proposal."""

    def __init__(self, ref):
        self.ref, self.calls = ref, 0

    def propose(self, generated, k):
        self.calls += 1
        cands = self.ref[len(generated) : len(generated) + k]
        if self.calls % 2 and cands:
            cands = [*cands[:-1], (cands[-1] + 1) % 64]
        return cands, "prompt"


def corrupted_run(lm, prompt, ref):
    """Greedy decode of ``len(ref)`` tokens with :class:`Corrupted` proposals: (tokens, stats),
    after asserting that proposals were made and some rejected."""
    stats = DecodeStats()
    gen = decode(
        lm,
        prompt,
        max_new_tokens=len(ref),
        sampler=Sampler(0.0),
        proposer=Corrupted(ref),
        stats=stats,
    )
    out = run(gen)
    proposed, accepted = stats.proposed["prompt"], stats.accepted.get("prompt", 0)
    assert proposed > accepted > 0, counts_msg(proposed, accepted)
    return out, stats


def prompt_of(n, seed=1):
    return torch.randint(1, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_verify_passes_crop_a_sliding_window_cache_and_keep_greedy_output(kind):
    model = build(kind)
    prompt = prompt_of(5 * WINDOW)
    ref = hf_greedy(model, prompt, 30)
    unwindowed = build(kind, window=512)
    assert hf_greedy(unwindowed, prompt, 30) != ref  # the window shapes this answer
    out, stats = corrupted_run(LMState(model), prompt, ref)
    assert out == ref
    assert stats.cache_refills == 0  # cropped in place, not re-read


@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_a_sliding_window_drafter_crops_back_after_rejections(kind):
    """The drafter feeds its proposals one pass each and is cropped back over several."""
    target = build(kind, layers=2)
    drafter = build(kind, layers=1)
    drafter.load_state_dict(
        {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.1.")}
    )
    stats, lm = drafter_run(target, drafter, prompt_of(4 * WINDOW, seed=2), 40)
    assert stats.cache_refills == lm.refills == 0  # both cropped in place


def drafter_run(target, drafter, prompt, n):
    """Greedy decode of ``n`` tokens with ``drafter`` proposing (from its first step): the
    stats and the drafter's state, after asserting that proposals were made and some rejected
    and that the answer is the target's own greedy one."""
    ref = hf_greedy(target, prompt, n)
    policy = DrafterPolicy(after_tokens=0, join_factor=0.0, min_acceptance=0.0, pay_check=False)
    proposer = MergedProposer(
        NgramProposer({}), DrafterProposer(LMState(drafter), prompt, Sampler(0.0)), policy
    )
    stats = DecodeStats()
    out = run(
        decode(
            LMState(target),
            prompt,
            max_new_tokens=n,
            sampler=Sampler(0.0),
            proposer=proposer,
            stats=stats,
        )
    )
    proposed, accepted = stats.proposed["drafter"], stats.accepted.get("drafter", 0)
    assert proposed > accepted > 0, counts_msg(proposed, accepted)
    assert out == ref
    return stats, proposer.drafter.lm


def test_rapid_lossless_on_sliding_window_models():
    target = build("mistral", layers=2)
    drafter = build("mistral", layers=2, seed=3)
    doc = prompt_of(6 * WINDOW, seed=4)
    target_prompt, drafter_prompt = doc + [5, 6, 7], doc[-12:] + [5, 6, 7]
    ref = hf_greedy(target, target_prompt, 30)
    proposed = accepted = 0
    for d in (target, drafter):  # the target itself drafts well, the other model poorly
        out, stats = rapid_greedy(
            LMState(target), LMState(d), target_prompt, drafter_prompt, 30, RapidConfig(eta=0.0)
        )
        assert out == ref
        assert stats.cache_refills == 0
        proposed, accepted = proposed + stats.draft_tokens, accepted + stats.accepted_tokens
    assert proposed > accepted > 0, counts_msg(proposed, accepted)


def test_a_sliding_window_cache_round_trips_through_its_tensors():
    """What the disk prefix cache saves and restores: every position, so it continues right."""
    model = build("gemma2")
    prompt = prompt_of(5 * WINDOW, seed=5)
    state = LMState(model)
    state.extend(prompt, all_logits=False)
    kv = state.kv_tensors()
    assert all(k.shape[-2] == len(prompt) for k, _ in kv)
    restored = LMState.from_kv(model, prompt, [(k.clone(), v.clone()) for k, v in kv])
    restored.crop(len(prompt) - 3)  # a shorter shared prefix, as a new question would use
    fresh = LMState(model)
    fresh.extend(prompt[:-3], all_logits=False)
    tail = prompt[-3:] + [9, 10]
    torch.testing.assert_close(restored.extend(tail), fresh.extend(tail))


def tiny_lfm2():
    torch.manual_seed(0)
    config = Lfm2Config(**{**SIZES, "num_hidden_layers": 2}, layer_types=["conv", "full_attention"])
    model = Lfm2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return model


def test_a_cache_with_convolution_state_is_restored_on_rejection(tmp_path):
    """LFM2's convolution layers cannot crop: a rejection restores a snapshot of their state
    taken before the verify pass (``cache_restores``) - never a re-read of the whole context -
    the output stays the model's, and nothing is saved to disk."""
    model = tiny_lfm2()
    prompt = prompt_of(20, seed=6)
    ref = hf_greedy(model, prompt, 20)
    lm = LMState(model)
    out, stats = corrupted_run(lm, prompt, ref)
    assert out == ref
    assert stats.cache_refills == 0
    assert stats.cache_restores > 0 and stats.as_dict()["cache_restores"] == stats.cache_restores
    kept_off_disk(lm, "lfm2", "LinearAttentionLayer", tmp_path)


def kept_off_disk(lm, name, says, folder):
    """Assert that ``lm``'s cache is refused as plain keys and values (an error saying
    ``says``), and that the prefix cache keeps it in memory, writing nothing to ``folder``."""
    with pytest.raises(ValueError, match=says):
        lm.kv_tensors()
    cache = PrefixCache(disk_dir=folder)
    cache.put(prefix_key(name, lm.tokens), lm)
    cache.flush()
    assert not list(folder.iterdir())  # nothing written, nothing half-written
    assert cache.get(prefix_key(name, lm.tokens)) is not None  # kept in memory


def tiny_qwen3_next():
    """Three gated-delta-rule layers (convolution and recurrent state), then full attention."""
    torch.manual_seed(0)
    sizes = dict(num_experts=4, moe_intermediate_size=32, num_experts_per_tok=2, pad_token_id=0)
    config = AutoConfig.for_model(
        "qwen3_next", **{**SIZES, "num_hidden_layers": 4, "head_dim": 8, **sizes}
    )
    return AutoModelForCausalLM.from_config(config).eval()


def tiny_minimax():
    """Lightning attention (a state per layer, in MiniMax's own cache class) beside full."""
    torch.manual_seed(0)
    sizes = dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8, pad_token_id=0)
    config = AutoConfig.for_model("minimax", **{**SIZES, "num_hidden_layers": 4, **sizes})
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("build_model", [tiny_lfm2, tiny_qwen3_next, tiny_minimax])
@pytest.mark.parametrize(("steps", "refills"), [(1, [0, 1, 1, 1]), (3, [0, 0, 0, 1])])
def test_a_crop_restores_the_latest_snapshot_before_it_or_re_reads(
    build_model, steps, refills, monkeypatch
):
    """Crops of a cache with convolution (LFM2), also recurrent (Qwen3-Next) or lightning-
    attention state (MiniMax): into the last forwards (restore the snapshot at or before the
    target, re-feed the rest), and back past every snapshot kept (re-read all). Each leaves
    the cache as a fresh prefill of the kept tokens would (next logits equal). Such a cache
    is never taken for plain keys and values (the prefix cache would save it to disk)."""
    monkeypatch.setattr(state_module, "MARKS", 4)
    model = build_model()
    prompt, more = prompt_of(20, seed=7), prompt_of(12, seed=8)
    lm = LMState(model)
    lm.extend(prompt, all_logits=False)
    for i in range(0, len(more), steps):  # a drafter's single steps, or verify passes of 3
        lm.extend(more[i : i + steps])
    assert [m.length for m in lm.marks] == list(range(32 - 4 * steps, 32, steps))
    for length, refill in zip((30, 26, 24, 5), refills, strict=True):
        before = (lm.refills, lm.restores)
        lm.crop(length)
        assert lm.tokens == (prompt + more)[:length]
        assert (lm.refills - before[0], lm.restores - before[1]) == (refill, 1 - refill)
        fresh = LMState(model)
        fresh.extend(lm.tokens, all_logits=False)
        torch.testing.assert_close(lm.extend([3, 4]), fresh.extend([3, 4]))
        lm.crop(length)
    with pytest.raises(ValueError, match="hold"):
        lm.kv_tensors()


def test_a_re_read_after_a_crop_past_every_snapshot_keeps_to_the_budget(monkeypatch):
    """A new prompt that shares only an early prefix with a cache that cannot crop re-reads
    that prefix (no snapshot reaches back so far); a spent budget stops the re-read before
    its first slice, as it stops a prefill. Before, the re-read ran unbudgeted and only the
    prompt's remaining tokens were refused."""
    monkeypatch.setattr(state_module, "MARKS", 4)
    model = tiny_lfm2()
    prompt, more = prompt_of(20, seed=7), prompt_of(12, seed=8)
    lm = LMState(model)
    lm.extend(prompt, all_logits=False)
    for token in more:
        lm.extend([token])
    passes = lm.forward_passes
    new_prompt = prompt[:10] + prompt_of(6, seed=9)
    with pytest.raises(Stopped, match="budget spent"):
        prefill_verify(lm, new_prompt, [], should_stop=lambda: "budget spent")
    assert lm.refills == 1 and lm.forward_passes == passes  # dropped, nothing re-read
    assert lm.tokens == []  # the invariant holds: the cache is empty and says so
    logits = prefill_verify(lm, new_prompt, [])  # with budget left it reads the prompt
    fresh = LMState(model)
    torch.testing.assert_close(logits, fresh.extend(new_prompt, all_logits=False))
    assert lm.tokens == new_prompt


def test_a_verifier_given_its_prompt_again_re_reads_it_once():
    """An answer model keeps one snapshot (VERIFIER_MARKS), taken after the prompt. When the
    same prompt is fed again (an incremental answer's rebuild that renders identically), the
    cache must go back to the prompt's last position. That is one re-read. Before, it was two:
    a crop to the prompt's length, then another to one token before it."""
    model = tiny_lfm2()
    prompt = prompt_of(20, seed=7)
    lm = LMState(model, marks=VERIFIER_MARKS)
    lm.extend(prompt, all_logits=False)
    for token in prompt_of(6, seed=8):  # an answer's single steps
        lm.extend([token])
    assert [m.length for m in lm.marks] == [25]
    logits = prefill_verify(lm, prompt, [])
    assert lm.refills == 1 and lm.tokens == prompt
    fresh = LMState(model)
    torch.testing.assert_close(logits, fresh.extend(prompt, all_logits=False))


def test_a_drafter_with_recurrent_state_restores_after_its_single_steps():
    """A Qwen3-Next drafter feeds its proposals one pass each; a rejection several steps back
    restores the snapshot before the first rejected one (never a re-read), and the target's
    greedy answer stands."""
    target, drafter = tiny_qwen3_next(), tiny_qwen3_next()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # peaked; the drafter: the target with a noisy output layer
        noise = torch.randn(drafter.lm_head.weight.shape, generator=gen)
        target.lm_head.weight.mul_(40.0)
        drafter.lm_head.weight.add_(0.02 * noise).mul_(40.0)
    stats, lm = drafter_run(target, drafter, prompt_of(24, seed=9), 30)
    assert stats.cache_refills == lm.refills == 0
    assert stats.cache_restores > 0 and lm.restores > 0


@pytest.mark.parametrize("build_model", [tiny_lfm2, tiny_qwen3_next, tiny_minimax])
def test_a_rejected_opening_restores_a_snapshot_after_the_prompt(build_model):
    """The prompt and an opening draft are fed in one pass; a cache that cannot crop kept its
    one snapshot from before the prompt, so a rejected opening token re-read the whole prompt
    (unbudgeted). A snapshot before the verified tokens makes it a restore."""
    from specrag.decoding.state import VERIFIER_MARKS

    model = build_model()
    prompt = prompt_of(40, seed=4)
    ref = [
        t.id
        for s in decode(LMState(model), prompt, max_new_tokens=6, sampler=Sampler(0.0))
        for t in s
    ]
    wrong = [ref[0], (ref[1] + 1) % 64, ref[2]]  # the second one is rejected
    lm = LMState(model, marks=VERIFIER_MARKS)
    out = [
        t.id
        for s in decode(lm, prompt, max_new_tokens=6, sampler=Sampler(0.0), opening=wrong)
        for t in s
    ]
    assert out == ref
    assert lm.refills == 0 and lm.restores >= 1, (lm.refills, lm.restores)
