"""Tiny random Llama models for decoding invariants (built in memory, no download)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab=64, seed=0, layers=2, sharpen=40.0, **config):
    """A 2-layer random Llama; ``sharpen`` scales the output layer (peaked distributions)."""
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    model = LlamaForCausalLM(LlamaConfig(**{**settings, **config})).eval()
    with torch.no_grad():  # sharpen the output layer: peaked, non-tied distributions
        model.lm_head.weight.mul_(sharpen)
    return model
