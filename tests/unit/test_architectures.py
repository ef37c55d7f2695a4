"""The decoding engines on tiny random models of other architectures than Llama.

specrag promises "any Hugging Face causal LM". Each architecture here brings a cache or an
attention of its own kind: learned positions (GPT-2), ALiBi (BLOOM), mixture of experts
(Qwen3-MoE), sliding-window layers beside full ones (Gemma 3, gpt-oss with attention sinks),
sparse attention whose indexer keys are cached beside the key/values (DeepSeek V3.2: cropped
with them, not re-read),
state-space or linear-attention layers whose state cannot be cropped (Mamba, Jamba, Falcon-H1,
Qwen3-Next, MiniMax in its own cache class, ZAYA's linear attention beside a window: restored
from a snapshot on a rejection, ``cache_restores``). Every model decodes speculatively
(proposals made and some rejected) and with lossless RAPID, and both must give the model's own
greedy answer (a forward over the whole text per token, no cache).
"""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from specrag.decoding.rapid import RapidConfig
from specrag.decoding.state import VERIFIER_MARKS, LMState
from tests.unit import test_cache_kinds as cache_kinds
from tests.unit.test_cache_kinds import corrupted_run, hf_greedy, kept_off_disk, prompt_of
from tests.unit.test_decoding import one_thread, rapid_greedy  # noqa: F401 - autouse fixture

SIZES = {
    **cache_kinds.SIZES,
    "num_hidden_layers": 4,
    "head_dim": 8,
    "max_position_embeddings": 256,
    "n_embd": 32,  # GPT-2 and BLOOM name their sizes their own way
    "n_layer": 4,
    "n_head": 4,
    "n_positions": 256,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 8,
    "attn_layer_period": 2,  # Jamba: attention in every other layer
    "attn_layer_offset": 1,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# state that cannot crop
RESTORED = {"mamba", "jamba", "qwen3_next", "falcon_h1", "minimax", "zaya"}
# the drafter (the same model, reading the prompt's last 10 tokens) proposes what the target
# says throughout: RAPID rejects nothing on these tiny random models
RAPID_AGREES = {"bloom", "mamba", "zaya"}
MLA = dict(  # DeepSeek's latent attention: keys and values from one compressed latent
    num_key_value_heads=4,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
    n_routed_experts=4,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
)
OWN_SIZES = {  # Falcon-H1's state-space mixer sits beside attention in every layer
    "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=8, mamba_d_state=16, mamba_chunk_size=16),
    # ZAYA: linear attention beside windowed attention in one cache layer (hybrid_sliding)
    "zaya": dict(num_experts_per_tok=1, layer_types=["hybrid_sliding", "hybrid"] * 2),
    # DeepSeek V3.2's sparse attention: each query attends to the index_topk keys its indexer
    # scores highest (8 of the 30-46 here), the indexer's keys cached beside the key/values
    "deepseek_v32": dict(**MLA, index_topk=8, index_head_dim=8, index_n_heads=16),
}


def tiny(arch):
    """A tiny random model of ``arch`` with peaked output distributions."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(arch, **{**SIZES, **OWN_SIZES.get(arch, {})})
    model = AutoModelForCausalLM.from_config(config).eval()
    head = model.get_output_embeddings()
    if head is not None and not model.config.tie_word_embeddings:
        with torch.no_grad():  # peaked distributions
            head.weight.mul_(40.0)
    return model


@pytest.mark.parametrize(
    "arch",
    [
        "gpt2",
        "bloom",
        "phi3",
        "qwen3_moe",
        "gemma3_text",
        "gpt_oss",
        "deepseek_v32",
        *sorted(RESTORED),
    ],
)
def test_speculative_and_rapid_decoding_keep_the_models_greedy_answer(arch):
    model = tiny(arch)
    prompt = prompt_of(30)
    ref = hf_greedy(model, prompt, 16)

    # the verifier keeps one snapshot (VERIFIER_MARKS): a pass crops only what it fed
    out, stats = corrupted_run(LMState(model, marks=VERIFIER_MARKS), prompt, ref)
    assert out == ref
    assert stats.cache_refills == 0  # never a re-read of the whole context
    assert (stats.cache_restores > 0) == (arch in RESTORED), stats.cache_restores

    rapid, rstats = rapid_greedy(
        LMState(model, marks=VERIFIER_MARKS),
        LMState(model),
        prompt,
        prompt[-10:],
        16,
        RapidConfig(eta=0.0),
    )
    assert rapid == ref
    rejected = rstats.draft_tokens > rstats.accepted_tokens
    assert rejected == (arch not in RAPID_AGREES), rstats
    assert rstats.cache_refills == 0
    assert (rstats.cache_restores > 0) == (rejected and arch in RESTORED), rstats.cache_restores


@pytest.mark.parametrize(
    ("arch", "says"), [("deepseek_v32", "DynamicIndexedLayer"), ("minimax", "MiniMax")]
)
def test_a_cache_holding_more_than_keys_and_values_is_not_saved_to_disk(arch, says, tmp_path):
    """The disk prefix cache saves plain key/value layers only: a DSA cache's indexer keys and
    MiniMax's lightning-attention states would be lost, so such a prefix stays in memory."""
    lm = LMState(tiny(arch))
    lm.extend(prompt_of(20), all_logits=False)
    kept_off_disk(lm, arch, says, tmp_path)
    kv_bytes = sum(
        t.numel() * t.element_size()
        for layer in lm.cache.layers
        for t in (layer.keys, layer.values)
        if isinstance(t, torch.Tensor)
    )
    # the prefix cache's memory budget counts the indexer's keys and MiniMax's states too
    assert lm.nbytes() > kv_bytes


@pytest.mark.parametrize("arch", ["llama", *sorted(RESTORED)])
def test_a_caches_size_counts_every_state_it_holds(arch):
    """A hybrid model's linear-attention states were left out of nbytes (the prefix cache's
    memory budget): only keys and values were counted."""
    lm = LMState(tiny(arch))
    lm.extend(prompt_of(20), all_logits=False)
    kv_bytes = sum(
        t.numel() * t.element_size()
        for layer in lm.cache.layers
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
        if isinstance(t, torch.Tensor)
    )
    assert (lm.nbytes() > kv_bytes) == (arch != "llama"), (arch, lm.nbytes(), kv_bytes)
    assert lm.nbytes() >= kv_bytes


@pytest.mark.parametrize(
    ("arch", "sizes"),
    [
        ("falcon", dict(multi_query=True, new_decoder_architecture=False)),
        (
            "deepseek_v3",
            dict(
                **MLA,
                intermediate_size=64,
                moe_intermediate_size=32,
                num_experts_per_tok=2,
                max_position_embeddings=256,
            ),
        ),
    ],
)
def test_a_prefix_of_a_model_whose_config_misnames_its_cache_heads_is_read_from_disk(
    arch, sizes, tmp_path
):
    """A review (2026-12-06): the disk prefix cache checked a file's KV heads against the
    config (``num_key_value_heads`` or every attention head); multi-query Falcon caches 1
    head without saying so, DeepSeek's latent attention 1 of the config's 4: every file was
    dropped as damaged, and every process paid the document's prefill again."""
    from specrag.decoding.prefix_cache import PrefixCache, prefix_key

    torch.manual_seed(0)
    base = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=64)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **base, **sizes)).eval()
    lm = LMState(model)
    lm.extend(prompt_of(20), all_logits=False)
    key = prefix_key(f"{arch}|cpu|fp32", lm.tokens)
    writer = PrefixCache(disk_dir=tmp_path)
    writer.put(key, lm)
    writer.flush()
    hit = PrefixCache(disk_dir=tmp_path).get(key, model)  # a new process: memory empty
    assert hit is not None and hit.tokens == lm.tokens
    assert list(tmp_path.glob("*.kv"))


def test_a_composite_models_sizes_are_read_from_its_text_config():
    """A review (2026-12-06): Gemma 3 (4B and up) loads as ``*ForConditionalGeneration``,
    whose config keeps ``vocab_size`` and ``max_position_embeddings`` in ``text_config``:
    timing its passes failed (AttributeError) and every prompt was cut to 2,048 tokens."""
    from transformers import Gemma3Config

    from specrag.models.loading import LoadedLM, _measure_wide, time_layouts

    text = dict(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=32768,
        sliding_window=8,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        image_size=28,
        patch_size=14,
    )
    torch.manual_seed(0)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert not hasattr(model.config, "vocab_size")  # the case: sizes in text_config only
    lm = LoadedLM("g3", model, None, torch.device("cpu"), torch.float32, (1,), 0, False)
    assert lm.max_context == 32768
    assert _measure_wide(lm, 5, 1, 16) > 0
    time_layouts(model, torch.device("cpu"))
