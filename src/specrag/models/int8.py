"""A drafter with int8 linear layers (CPU): cheaper decode steps, verified by the target.

A drafter's numerics only shape its proposals; the target verifies them in its own dtype, so
greedy answers stay the target's and sampling stays exact (the acceptance rule uses the q the
proposals were drawn from; in RAPID at eta 0 - with knowledge transfer the drafter's q shapes
the answer by design). Not for an answer model: a wide pass (bf16 copy, or int8 activations
quantized over all its rows) computes differently from a single step, so an int8 model would
not verify its own proposals exactly.

On 2 CPU cores a decode step reads every weight once, so it costs what the weights weigh:
int8 weights halve bf16's bytes. Measured (2026-12-01, 2 cores with
AMX, Qwen2.5-Coder-0.5B, 600-token cache): a step 0.071-0.075 s in int8 vs 0.111-0.115 s in
bf16 and 0.120-0.124 s in fp32; but a 600-token prefill 0.97 s in int8 vs 0.56 s in bf16
(AMX multiplies bf16 matrices faster than the int8 kernel quantizes and multiplies them). So
where the CPU has native bf16 each layer keeps a bf16 copy too and a pass of
:data:`MIN_ROWS` or more tokens (a prefill, a catch-up) takes it (+2 bytes per weight).

PyTorch's dynamic quantization (``torch.ao``): weights int8 per output channel, activations
quantized per call; the model's other tensors stay fp32. PyTorch has deprecated it (for the
``torchao`` package); where it is gone ``drafter_dtype`` auto no longer picks int8
(:func:`specrag.models.loading.x86_int8`).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

MIN_ROWS = 4  # passes of this many tokens or more use the bf16 copy, where one is kept

# torch.ao's eager quantization warns that it moves to torchao, and its quantized tensors that
# they are deprecated (torch 2.x still has both; set once: changing the warning filters around
# each call is not thread-safe)
warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization.*")
warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*")
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.ao\.")


class Int8Linear(nn.Module):
    """A linear layer with int8 weights, and a bf16 copy of them for wide passes."""

    def __init__(self, layer: nn.Linear, wide: bool) -> None:
        super().__init__()
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
        from torch.ao.quantization import per_channel_dynamic_qconfig

        self.in_features, self.out_features = layer.in_features, layer.out_features
        layer.qconfig = per_channel_dynamic_qconfig  # type: ignore[assignment]
        self.q = DynamicLinear.from_float(layer)
        bias = layer.bias
        self.wide_weight = layer.weight.detach().to(torch.bfloat16) if wide else None
        self.wide_bias = bias.detach().to(torch.bfloat16) if wide and bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        if x.dim() == 1:  # the int8 kernel wants rows
            return self.forward(x[None])[0]
        if self.wide_weight is None or x.numel() < MIN_ROWS * self.in_features:
            return self.q(x)
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)  # 2-D: the fast bf16 kernel
        y = F.linear(rows, self.wide_weight, self.wide_bias).to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)


def quantize(model: nn.Module, wide: bool) -> str:
    """Replace ``model``'s ``nn.Linear`` layers by :class:`Int8Linear` in place (fp32 model).

    ``wide``: keep a bf16 copy for passes of :data:`MIN_ROWS`+ tokens. Returns what was done.
    """
    if next(model.parameters()).dtype != torch.float32:
        raise ValueError("int8 quantization starts from an fp32 model")
    named = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    for name, layer in named:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, Int8Linear(layer, wide))
    copy = ", bf16 copy for passes of 4+ tokens" if wide else ""
    return f"int8 linear layers ({len(named)}, weights per output channel{copy})"


def is_int8(model: nn.Module) -> bool:
    """Whether :func:`quantize` was applied to ``model``."""
    return any(isinstance(m, Int8Linear) for m in model.modules())


def has_wide_copy(model: nn.Module) -> bool:
    """Whether :func:`quantize` kept a bf16 copy of ``model``'s weights for wide passes."""
    return any(isinstance(m, Int8Linear) and m.wide_weight is not None for m in model.modules())
