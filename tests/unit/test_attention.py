"""Native grouped-query attention on CPU (``specrag.models.attention``): same logits, no copy."""

import pytest
import torch
import transformers.integrations.sdpa_attention as hf_sdpa

from specrag.decoding.state import LMState
from specrag.models import attention
from tests.tiny import tiny_llama

CPU = torch.device("cpu")


def passes(model, widths=(1, 2, 3, 5, 9)):
    """Logits of passes of each width after a 40-token cache (the cache cropped back each time)."""
    state = LMState(model, CPU)
    state.extend([(7 * i) % 60 + 2 for i in range(40)], all_logits=False)
    out = {}
    for width in widths:
        out[width] = state.extend([(3 * i) % 60 + 1 for i in range(width)])
        state.crop(40)
    return out


def test_same_logits_as_transformers_sdpa_and_no_copy_of_the_cache(monkeypatch):
    model = tiny_llama(layers=2)  # 4 query heads, 2 key/value heads
    assert model.config._attn_implementation == "sdpa"
    copies = []
    real_repeat = hf_sdpa.repeat_kv

    def repeat_kv(hidden, n_rep):
        copies.append(hidden.shape)
        return real_repeat(hidden, n_rep)

    monkeypatch.setattr(hf_sdpa, "repeat_kv", repeat_kv)
    before = passes(model)
    assert copies, "transformers' SDPA copies the cache for a masked multi-token pass"
    copies.clear()
    assert "native grouped-query" in attention.use(model, CPU)
    assert model.config._attn_implementation == attention.NAME
    after = passes(model)
    assert not copies  # every pass above, the multi-token ones included, ran without a copy
    for width in before:
        assert torch.equal(before[width], after[width]), width


def test_a_prompt_prefill_and_greedy_generate_agree():
    plain, native = tiny_llama(seed=3), tiny_llama(seed=3)
    attention.use(native, CPU)
    ids = torch.tensor([[5, 9, 2, 33, 17, 8, 41]])
    kw = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(plain.generate(ids, **kw), native.generate(ids, **kw))


@pytest.mark.parametrize(
    ("config", "device"),
    [({"num_key_value_heads": 4}, CPU), ({}, torch.device("cuda"))],
    ids=["no grouped heads", "not a CPU"],
)
def test_left_as_transformers_chose_elsewhere(config, device):
    model = tiny_llama(**config)
    assert attention.use(model, device) == "attention: sdpa"
    assert model.config._attn_implementation == "sdpa"
