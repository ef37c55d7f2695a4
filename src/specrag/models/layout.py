"""Each linear layer's weight in two layouts, so verify passes of 4+ tokens cost less on CPU.

In fp32 on CPU cores, a pass over a few tokens is a staircase (the 1.5B of the pair on 2 cores,
400-token cache: 2-3 tokens ~1.05x a single-token step, 4-6 ~2x, 8-9 ~2.7x, 16 2.8x): MKL's
GEMM for ``x @ W.T`` with 4-15 rows of ``x`` is slow for ``nn.Linear``'s ``[out, in]`` weight.
With the weight stored transposed (``[in, out]``, contiguous) the same product costs 0.6-0.8x
as much at 4-16 rows (8 tokens: 0.465 s vs 0.638 s) but ~1.6x at 2-3 rows, and the same at one
row and at prefill sizes (benchmarks/verify_cost.py; docs/bench/2026-12-01-dual-layout/). No
single layout wins everywhere, so :func:`apply` keeps both and picks per call by row count:
the single-token steps and narrow passes stay as they were, wide verify passes get cheaper.

It costs one more copy of the linear weights (the 1.5B in fp32: +5.8 GiB), so it is used only
where it was measured to pay, on the loaded model itself (:func:`apply` times a 9-token pass
both ways and takes the copy back if it is not clearly faster), and only for models whose
weights fit a bound (:data:`MAX_EXTRA_BYTES`, and a quarter of the machine's memory). It also
costs load time (the 1.5B: 23-25 s instead of 5-6 s on 2 cores - 12 s writing the copy, most
of it first touch of fresh memory, 6 s timing), repaid by a process that answers more than a
few long questions, not by a single ``specrag ask``. The products differ from the single
layout's in the last bits (summation order; max |logit difference| 2.5e-5 on the 1.5B), as a
k-token pass already differs from a 1-token one: greedy identity with plain decoding is what
the tests and benchmarks check.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

MIN_ROWS = 4  # fewer rows (steps, narrow passes): the usual layout is the faster one
MAX_EXTRA_BYTES = 8 << 30  # a second copy of a larger model's weights is too much memory
PAYS = 0.9  # the dual layout is kept if a 9-token pass takes at most this fraction as long


class DualLinear(nn.Linear):
    """``nn.Linear`` that also holds its weight transposed and uses it for 4+ input rows."""

    weight_t: torch.Tensor  # [in_features, out_features], contiguous; not saved

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        if x.numel() < MIN_ROWS * self.in_features:
            return super().forward(x)
        y = torch.matmul(x, self.weight_t)  # [..., rows, out]
        return y if self.bias is None else y + self.bias


_PLAIN: tuple[type, ...] = (nn.Linear, DualLinear)


def linears(model: nn.Module) -> list[nn.Linear]:
    """The model's plain ``nn.Linear`` layers (subclasses, e.g. quantized ones, are left)."""
    return [m for m in model.modules() if isinstance(m, nn.Linear) and type(m) in _PLAIN]


def add(model: nn.Module) -> int:
    """Give every plain linear layer its transposed weight; returns the bytes added."""
    added = 0
    for layer in linears(model):
        if isinstance(layer, DualLinear):
            continue
        weight_t = layer.weight.detach().t().contiguous()
        layer.__class__ = DualLinear
        layer.register_buffer("weight_t", weight_t, persistent=False)
        added += weight_t.numel() * weight_t.element_size()
    return added


def remove(model: nn.Module) -> None:
    """Undo :func:`add`: plain ``nn.Linear`` layers again, the transposed copies freed."""
    for layer in linears(model):
        if "weight_t" in layer._buffers:  # switched to one layout by set_dual, or not
            del layer._buffers["weight_t"]
            layer.__class__ = nn.Linear  # type: ignore[assignment]


def linear_bytes(model: nn.Module) -> int:
    """Bytes of the plain linear layers' weights (what :func:`add` would copy)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in linears(model))


def memory_bytes() -> int:
    """Physical memory of this machine (0 where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def apply(
    model: nn.Module,
    device: torch.device,
    dtype: torch.dtype,
    timer: Callable[[], tuple[float, float]] | None = None,
) -> str:
    """Keep both layouts where they pay (fp32 on CPU, measured); returns why, in words.

    ``timer`` (tests) returns ``(single_s, dual_s)``; by default a 9-token pass over a
    64-token cache is timed both ways, interleaved, min of 3 each.
    """
    if device.type != "cpu" or dtype != torch.float32:
        return f"single layout ({device.type}/{str(dtype).removeprefix('torch.')})"
    extra = linear_bytes(model)
    memory = memory_bytes()
    if extra > MAX_EXTRA_BYTES or (memory and extra > memory // 4):
        return f"single layout (a second copy of {extra / 2**30:.1f} GiB is too much memory)"
    if not extra:
        return "single layout (no plain linear layers)"
    add(model)
    single_s, dual_s = (timer or (lambda: _time_both(model, device)))()
    if dual_s > PAYS * single_s:
        remove(model)
        return (
            f"single layout (a 9-token pass {dual_s:.3f}s with both layouts vs "
            f"{single_s:.3f}s: not worth {extra / 2**30:.1f} GiB)"
        )
    return (
        f"dual layout: a 9-token pass {dual_s:.3f}s vs {single_s:.3f}s "
        f"(+{extra / 2**30:.1f} GiB of transposed weights)"
    )


def set_dual(model: nn.Module, on: bool) -> None:
    """Switch a model given both layouts by :func:`add` between them (benchmarks, timing)."""
    for layer in linears(model):
        if "weight_t" in layer._buffers:
            layer.__class__ = DualLinear if on else nn.Linear


def _time_both(
    model: Any, device: torch.device, cache: int = 64, width: int = 9
) -> tuple[float, float]:
    """``(single_s, dual_s)``: min over 3 interleaved 9-token passes after a warm-up each."""
    from specrag.decoding.state import LMState

    vocab = int(model.config.vocab_size)
    with torch.inference_mode():
        lm = LMState(model, device)
        lm.extend([(40 + i) % vocab for i in range(cache)], all_logits=False)
        wide = [(300 + j) % vocab for j in range(width)]
        times: dict[bool, list[float]] = {False: [], True: []}
        try:
            for rep in range(4):
                for dual in (False, True):
                    set_dual(model, dual)
                    t0 = time.perf_counter()
                    lm.extend(wide)
                    took = time.perf_counter() - t0
                    lm.crop(cache)
                    if rep:  # the first pass of each layout is a warm-up
                        times[dual].append(took)
        finally:
            set_dual(model, True)
    return min(times[False]), min(times[True])
