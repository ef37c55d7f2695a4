"""Grouped-query attention over the KV cache without copying it, for passes of several tokens.

transformers' SDPA attention (5.x) gives a model with grouped-query attention (fewer key/value
heads than query heads: Qwen2.5, SmolLM2) PyTorch's native GQA only where no mask is passed;
a pass of several tokens after a cache - every verify pass, and a question's prefill after a
cached document - carries a causal mask, so it copies every layer's keys and values once per
query-head group first (``repeat_kv``). PyTorch's CPU kernel takes the mask and the grouped
heads together (``enable_gqa``). Measured on 2 CPU cores (2026-12-01, the 1.5B of the pair
after a 2,000-token cache; docs/bench/2026-12-01-gqa-attention/): an 8-token pass 0.851 s ->
0.751 s, 16 tokens 0.964 s -> 0.838 s, 3 tokens 0.488 s -> 0.446 s; logits bit-identical at
every width (1-16 tokens; ``tests/unit/test_attention.py`` checks that on a tiny model).

:func:`use` switches a loaded CPU model to :data:`NAME`, which is transformers' SDPA attention
except for that one case. Other devices keep transformers' choice (its masked-GQA dispatch is
tuned per backend).
"""

from __future__ import annotations

import inspect
import re
import sys
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

NAME = "specrag_gqa_sdpa"


def gqa_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,  # [batch, heads, q_len, head_dim]
    key: torch.Tensor,  # [batch, kv_heads, kv_len, head_dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The SDPA attention of transformers, with native GQA where it would copy the cache instead."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = getattr(module, "num_key_value_groups", 1) > 1
    if (
        not grouped
        or query.shape[2] == 1  # a single token: transformers packs the groups, no copy
        or attention_mask is None  # no mask: transformers uses native GQA itself
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("output_attentions")
    ):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None  # [batch, q_len, heads, head_dim]


@cache  # the probe and the registration once per process, not at every model load
def _registered() -> bool:
    """Register :data:`NAME` with transformers (attention and mask); False if it cannot."""
    probe = torch.zeros(1, 2, 1, 4)
    try:  # torch >= 2.5 (the builtin has no inspectable signature)
        F.scaled_dot_product_attention(probe, probe[:, :1], probe[:, :1], enable_gqa=True)
    except TypeError:
        return False
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:
        return False
    AttentionInterface.register(NAME, gqa_sdpa)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return True


# a model's code that compares the attention's name: ``config._attn_implementation == "sdpa"``
_BRANCHES_ON_NAME = re.compile(r"_attn_implementation\s*(?:[=!]=|(?:not\s+)?in\b)")


@cache
def _branches_on_name(module_name: str) -> bool:
    """Whether a modeling module's code branches on the attention's name (or cannot be read).

    Such a model behaves otherwise under another name: Gemma 4's text models with KV-shared
    layers keep a shortcut only for "sdpa" that a pass with ``logits_to_keep`` > 1 needs
    (renamed, the draft opening's prefill gave other logits: a review, 2026-12-07).
    """
    module = sys.modules.get(module_name)
    try:
        source = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return True  # unread: keep transformers' own attention
    return not source or bool(_BRANCHES_ON_NAME.search(source))


def use(model: Any, device: torch.device) -> str:
    """Switch ``model`` to :data:`NAME` where it helps (CPU, SDPA, grouped heads); says what.

    Not a model whose code branches on the attention's name (:func:`_branches_on_name`):
    :data:`NAME` is SDPA to transformers' attention functions, not to the model's own code.
    """
    config = model.config
    current = getattr(config, "_attn_implementation", None)
    heads = getattr(config, "num_attention_heads", 0)
    kv_heads = getattr(config, "num_key_value_heads", heads) or heads
    if device.type != "cpu" or current != "sdpa" or kv_heads >= heads:
        return f"attention: {current}"
    if _branches_on_name(type(model).__module__):
        return "attention: sdpa (its code branches on the attention's name)"
    if not _registered():
        return "attention: sdpa (no native grouped-query attention in this torch)"
    model.set_attn_implementation(NAME)
    if model.config._attn_implementation != NAME:  # a model that cannot switch keeps sdpa
        return "attention: sdpa"
    return f"attention: sdpa with native grouped-query attention ({NAME})"
