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


def test_a_model_whose_code_branches_on_the_attention_name_keeps_sdpa():
    """Gemma 4's text models with KV-shared layers keep a shortcut only where the attention is
    named "sdpa": switched, a pass keeping 5 logits on an empty cache (every refine's draft
    opening) gave other logits and another greedy answer (a review, 2026-12-07)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "gemma4_text", vocab_size=300, hidden_size=32, intermediate_size=64,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        global_head_dim=8, hidden_size_per_layer_input=8, vocab_size_per_layer_input=300,
        sliding_window=8, num_kv_shared_layers=2, max_position_embeddings=512,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    assert model.config._attn_implementation == "sdpa"
    ids = [(7 * i + 3) % 300 for i in range(30)]
    with torch.no_grad():
        full = model(torch.tensor([ids])).logits[0, -5:].float()
    assert "branches on the attention's name" in attention.use(model, CPU)
    assert model.config._attn_implementation == "sdpa"
    kept = LMState(model, CPU).extend(ids, all_logits=False, keep=5)
    assert torch.allclose(kept, full, atol=1e-5)
    # the models it was measured on still switch (their code never compares the name)
    llama = tiny_llama(layers=1)
    assert "native grouped-query" in attention.use(llama, CPU)


@pytest.mark.parametrize(
    ("probe", "line", "branches"),
    [
        ("eq", 'if config._attn_implementation == "sdpa":', True),
        ("ne", 'if config._attn_implementation != "sdpa":', True),
        ("in", 'if config._attn_implementation in ("eager", "sdpa"):', True),
        ("not_in", 'if config._attn_implementation not in ("eager",):', True),
        ("assigned", 'if config.set(_attn_implementation="sdpa"):', False),
    ],
)
def test_any_comparison_of_the_attention_name_counts_as_branching(
    tmp_path, monkeypatch, probe, line, branches
):
    """A mutation review, 2026-12-08: the check reduced to ``==`` passed every test, yet
    transformers' own models compare with ``in`` too (DeepSeek-V3.2, Mistral Large 4): such a
    model was switched to the renamed attention and took its non-SDPA branch (other logits)."""
    import importlib.util
    import sys

    name = f"specrag_attention_probe_{probe}"
    path = tmp_path / f"{name}.py"
    path.write_text(f"def forward(config):\n    {line}\n        return 1\n    return 0\n")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, name, module)
    assert attention._branches_on_name(name) is branches


def test_a_gemma4_model_loaded_by_name_answers_as_plain_decoding(tmp_path, monkeypatch):
    """The same through the package's own load of a model folder (where the switch is made): a
    refine's draft opening and its verify passes gave another greedy answer than plain
    decoding (a review, 2026-12-07, with tiny models of nine architectures: the tests built
    their models in memory and never met the switch). Proposals are made, some rejected."""
    from langchain_core.messages import HumanMessage, SystemMessage
    from transformers import AutoConfig, AutoModelForCausalLM

    from specrag.models.chat import ChatLocalLM
    from specrag.models.loading import load_lm

    tokenizer = load_lm().tokenizer  # the embedded model's (before the cache dir moves)
    monkeypatch.setenv("SPECRAG_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "gemma4_text", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        global_head_dim=8, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=len(tokenizer), sliding_window=16, num_kv_shared_layers=2,
        max_position_embeddings=1024, tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention"] * 2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # confident argmaxes: a tie never decides
    model.save_pretrained(tmp_path / "gemma4")
    tokenizer.save_pretrained(tmp_path / "gemma4")
    evidence = "Rollo led the Norse settlers of Normandy. The treaty of 911 gave them land. "
    messages = [SystemMessage("Answer."), HumanMessage(evidence * 2 + "Who led them?")]

    def chat(speculation):
        return ChatLocalLM(
            model_name=str(tmp_path / "gemma4"), device="cpu", dtype="float32",
            speculation=speculation, max_new_tokens=24,
        )  # fmt: skip

    plain = chat("none").invoke(messages)
    assert chat("none").load().model.config._attn_implementation == "sdpa"  # not switched
    words = plain.content.split()
    draft = " ".join(words[: len(words) // 2] + ["Normandy", "settlers", "treaty"])
    fast = chat("draft+prompt").invoke(messages, draft=draft)
    assert fast.content == plain.content
    stats = fast.response_metadata["decoding"]
    proposed = sum(stats["candidates_proposed"].values())
    accepted = sum(stats["candidates_accepted"].values())
    assert proposed > 0 and accepted < proposed, stats
