"""Decoding invariants on tiny random Llama models built here (fast, offline)."""

from collections import Counter

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specrag.decoding.candidates import NgramProposer
from specrag.decoding.prefix_cache import PrefixCache, prefix_key
from specrag.decoding.rapid import RapidConfig, RapidStats, rapid_decode, transfer_distribution
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import DecodeStats, decode
from specrag.decoding.state import LMState


def tiny(vocab=64, seed=0, layers=2):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharpen the output layer: peaked, non-tied distributions
        model.lm_head.weight.mul_(40.0)
    return model


@pytest.fixture(scope="module")
def model():
    return tiny()


def run(gen):
    return [t.id for step in gen for t in step]


def greedy(model, prompt, n):
    return run(decode(LMState(model), prompt, max_new_tokens=n, sampler=Sampler(0.0)))


def reference_greedy(model, prompt, n):
    """No KV cache at all: a full forward pass over the whole sequence per token."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt) :]


def test_cached_decode_matches_uncached_reference(model):
    prompt = torch.randint(0, 64, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    assert greedy(model, prompt, 25) == reference_greedy(model, prompt, 25)


@pytest.mark.parametrize("source", ["oracle", "random", "prompt"])
def test_candidates_never_change_greedy_output(model, source):
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 64, (40,), generator=g).tolist()
    ref = greedy(model, prompt, 40)
    cands = {
        "oracle": ref[5:30],
        "random": torch.randint(0, 64, (40,), generator=g).tolist(),
        "prompt": [],
    }[source]
    sources = {"draft": cands, "prompt": prompt} if cands else {"prompt": prompt}
    stats = DecodeStats()
    out = run(
        decode(
            LMState(model),
            prompt,
            max_new_tokens=40,
            sampler=Sampler(0.0),
            proposer=NgramProposer(sources),
            stats=stats,
        )
    )
    assert out == ref
    if source == "oracle":
        assert stats.passes_per_token < 0.6  # accepted candidates save passes
        assert stats.accepted["draft"] > 10


def test_eos_in_candidates_stops(model):
    prompt = list(range(10))
    ref = greedy(model, prompt, 20)
    eos = ref[7]
    out = run(
        decode(
            LMState(model),
            prompt,
            max_new_tokens=20,
            sampler=Sampler(0.0),
            eos_ids=(eos,),
            proposer=NgramProposer({"draft": ref}),
        )
    )
    assert out == ref[: ref.index(eos) + 1]


def test_speculative_sampling_is_lossless():
    """Empirical next-2-token distribution with and without (bad) candidates agree."""
    model = tiny(vocab=4, seed=3, layers=1)
    prompt = [1, 2, 3]
    sampler = Sampler(1.0)
    n = 2500

    def dist(with_candidates: bool) -> Counter:
        counts: Counter = Counter()
        g = torch.Generator().manual_seed(11 if with_candidates else 12)
        for _ in range(n):
            prop = NgramProposer({"draft": [0, 0, 0, 0]}) if with_candidates else None
            toks = run(
                decode(
                    LMState(model),
                    prompt,
                    max_new_tokens=3,
                    sampler=sampler,
                    proposer=prop,
                    generator=g,
                )
            )
            assert len(toks) == 3
            counts[tuple(toks[1:3])] += 1
        return counts

    a, b = dist(False), dist(True)
    keys = set(a) | set(b)
    tv = 0.5 * sum(abs(a[k] - b[k]) / n for k in keys)
    assert tv < 0.06, tv
    # a rule that always accepted the candidate would put far more mass on (0, 0):
    assert abs(a[(0, 0)] - b[(0, 0)]) / n < 0.03


def test_cache_after_rejections_equals_fresh_forward(model):
    prompt = list(range(3, 33))
    lm = LMState(model)
    out = run(
        decode(
            lm,
            prompt,
            max_new_tokens=30,
            sampler=Sampler(0.0),
            proposer=NgramProposer({"draft": list(range(40))}),
        )
    )
    # cache holds prompt + out[:-1]; next logits from the cache == a fresh full pass
    cached = lm.extend([out[-1]])[-1]
    fresh = LMState(model).extend(prompt + out)[-1]
    assert lm.tokens == prompt + out
    torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("ctx_len", [20, 200, 1200])
@pytest.mark.parametrize("gamma", [1, 4, 10])
def test_rapid_eta0_greedy_equals_target_greedy(model, ctx_len, gamma):
    g = torch.Generator().manual_seed(ctx_len + gamma)
    doc = torch.randint(0, 64, (ctx_len,), generator=g).tolist()
    target_prompt = doc + [5, 6, 7]
    drafter_prompt = doc[-min(len(doc), 15) :] + [5, 6, 7]  # "retrieved" piece only
    ref = greedy(model, target_prompt, 30)
    drafter = tiny(seed=9)  # a different drafter: acceptance is lower, output the same
    for d in (model, drafter):
        stats = RapidStats()
        out = run(
            rapid_decode(
                LMState(model),
                LMState(d),
                target_prompt,
                drafter_prompt,
                max_new_tokens=30,
                sampler=Sampler(0.0),
                cfg=RapidConfig(gamma=gamma, eta=0.0),
                stats=stats,
            )
        )
        assert out == ref
        assert stats.steps < 30 or stats.acceptance_rate == 0


def test_rapid_eta0_sampling_matches_target_distribution():
    target, drafter = tiny(vocab=4, seed=4, layers=1), tiny(vocab=4, seed=5, layers=1)
    prompt = [1, 2, 3, 0]
    n = 2500
    sampler = Sampler(1.0)

    def dist(use_rapid: bool) -> Counter:
        counts: Counter = Counter()
        g = torch.Generator().manual_seed(21 if use_rapid else 22)
        for _ in range(n):
            if use_rapid:
                gen = rapid_decode(
                    LMState(target),
                    LMState(drafter),
                    prompt,
                    prompt[2:],
                    max_new_tokens=3,
                    sampler=sampler,
                    cfg=RapidConfig(gamma=3, eta=0.0),
                    generator=g,
                )
            else:
                gen = decode(
                    LMState(target), prompt, max_new_tokens=3, sampler=sampler, generator=g
                )
            counts[tuple(run(gen)[:2])] += 1
        return counts

    def tv(a, b):
        return 0.5 * sum(abs(a[k] - b[k]) / n for k in set(a) | set(b))

    a, b = dist(False), dist(True)
    assert tv(a, b) < 0.06, tv(a, b)
    # sensitivity: the drafter alone is far from the target, so accepting every draft
    # token (a wrong rule) would be caught by the bound above
    g = torch.Generator().manual_seed(23)
    d = Counter(
        tuple(
            run(
                decode(LMState(drafter), prompt[2:], max_new_tokens=2, sampler=sampler, generator=g)
            )
        )
        for _ in range(n)
    )
    assert tv(a, d) > 0.15


def test_knowledge_transfer_shifts_toward_drafter():
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    q = torch.tensor([[0.0, 0.9, 0.1, 0.0]])
    p, p_hat = transfer_distribution(z, q, RapidConfig(eta=5.0), temperature=0.0)
    assert p_hat[0, 1] > p[0, 1] and p_hat[0, 0] < p[0, 0]
    # tokens the drafter finds implausible (q < alpha * max q) are not shifted: their odds hold
    torch.testing.assert_close(p_hat[0, 3] / p_hat[0, 0], p[0, 3] / p[0, 0])
    p0, same = transfer_distribution(z, q, RapidConfig(eta=0.0), temperature=0.0)
    assert torch.equal(p0, same)
    _, mix = transfer_distribution(z, q, RapidConfig(transfer="mixture", lam=0.5), 0.0)
    torch.testing.assert_close(mix, 0.5 * p + 0.5 * q)


def test_prefix_cache_reuse_gives_same_output(model):
    doc = list(range(1, 60)) * 3
    cache = PrefixCache()
    key = prefix_key("tiny", doc)
    first = LMState(model)
    first.extend(doc, all_logits=False)
    cache.put(key, first)
    reused = cache.get(key)
    assert reused is not None and reused.tokens == doc
    prompt = doc + [7, 8, 9]
    out_reused = run(decode(reused, prompt, max_new_tokens=20, sampler=Sampler(0.0)))
    out_fresh = greedy(model, prompt, 20)
    assert out_reused == out_fresh
    assert reused.forward_passes < 25  # the document was not prefilled again
    again = cache.get(key)  # the cached entry was not modified by the first use
    assert again.tokens == doc


@pytest.mark.parametrize("eta", [0.0, 5.0])
def test_rapid_caches_after_rejections_equal_fresh_forward(model, eta):
    doc = torch.randint(0, 64, (120,), generator=torch.Generator().manual_seed(5)).tolist()
    target_prompt, drafter_prompt = doc + [1, 2], doc[-20:] + [1, 2]
    target, drafter = LMState(model), LMState(tiny(seed=9))
    stats = RapidStats()
    out = run(
        rapid_decode(
            target,
            drafter,
            target_prompt,
            drafter_prompt,
            max_new_tokens=25,
            sampler=Sampler(0.0),
            cfg=RapidConfig(gamma=6, eta=eta),
            stats=stats,
        )
    )
    assert stats.draft_tokens > stats.accepted_tokens  # there were rejections
    # both caches hold exactly their prompt + every emitted token but the last
    assert target.tokens == target_prompt + out[:-1]
    assert drafter.tokens == drafter_prompt + out[: len(drafter.tokens) - len(drafter_prompt)]
    cached = target.extend([out[-1]])[-1]
    fresh = LMState(model).extend(target_prompt + out)[-1]
    torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)
