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


def padded_drafter(target, rows, layers=1, seed=1, shared=64):
    """A drafter with ``rows`` output rows sharing ``target``'s first ``shared`` tokens (its
    embeddings and output rows) and its first ``layers`` blocks.

    Models of one family pad their output layers differently (Qwen2.5-0.5B: 151,936 rows,
    7B: 152,064) around one tokenizer. The drafter's padding rows (``shared`` and up) are made
    to win its argmax where they exist: a drafter laid out wrongly proposes them.
    """
    drafter = tiny_llama(rows, seed, layers, 40.0)
    source = target.state_dict()
    with torch.no_grad():
        drafter.model.embed_tokens.weight[:shared] = source["model.embed_tokens.weight"][:shared]
        drafter.lm_head.weight[:shared] = source["lm_head.weight"][:shared]
        drafter.lm_head.weight[shared:] = source["lm_head.weight"][: rows - shared] * 3
        for k, v in drafter.state_dict().items():
            if k.startswith("model.layers.") and int(k.split(".")[2]) < layers:
                v.copy_(source[k])
    return drafter


def save_tiny(path, tokenizer, context=256):
    """A 1-layer random Llama over ``tokenizer``'s vocabulary, saved with it to ``path`` (a
    folder a model spec can name: ``hf:<path>``); ``context``: its max positions."""
    model = tiny_llama(len(tokenizer), layers=1, sharpen=1.0, max_position_embeddings=context)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
