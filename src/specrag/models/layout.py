"""Each linear layer's weight in a second layout, so verify passes cost less on CPU.

In fp32 on CPU cores, a pass over a few tokens is a staircase (the 1.5B of the pair on 2 cores,
2,000-token cache: 2-3 tokens ~1.05x a single-token step, 4-6 ~1.9x, 8 ~2.5x, 10-12 ~3x,
16 ~2.7x): MKL's GEMM for ``x @ W.T`` with 4-15 rows of ``x`` is slow for ``nn.Linear``'s
``[out, in]`` weight. The second layout is the weight as oneDNN packs it for its own GEMM
(``torch.ops.mkldnn._reorder_linear_weight``, the form PyTorch's compiler uses on CPU): the
same passes cost 1.0-1.6x a step there (4 tokens 1.05x, 8 1.3x, 16 1.56x; with the plain
transposed copy used before 2026-12-02, 1.43x, 1.6x, 1.84x - see
``docs/bench/2026-12-02-packed-layout``). Passes with gradients on use the usual weight
(oneDNN's op has none). Where oneDNN is missing the second layout is the transposed weight
(``[in, out]``, contiguous). Prefills (>= :data:`MAX_ROWS` tokens) keep the usual layout;
single-token steps and narrow passes (< :data:`MIN_ROWS` tokens) too, unless the second one
was timed faster for them on this machine (:func:`narrow_rows`: MKL's few-row products are
fast on the Intel Xeons measured first, 2-3x slower than oneDNN's on an AMD EPYC).

It costs one more copy of the linear weights (the 1.5B in fp32: +5.8 GiB), so it is used only
where it was measured to pay, on the loaded model itself (:func:`apply` times a 9-token pass
both ways and takes the copy back if it is not clearly faster), and only for models whose
weights fit a bound (:data:`MAX_EXTRA_BYTES`, and a quarter of the machine's memory). The
verdict is kept per model weights and machine (:class:`Verdicts`, a JSON file in the cache
dir), so later loads skip the timing, and a model that keeps one layout skips the copy too. It
also costs load time (writing the copy, 6 s of timing on 2 cores and the row count of
:func:`narrow_rows`), repaid by a process that answers more than a few long questions, not by
a single ``specrag ask``. The products differ from the single layout's in the last bits
(summation order; max |logit difference| ~2e-5 on the 1.5B), as a k-token pass already
differs from a 1-token one: greedy identity with plain decoding is what the tests and
benchmarks check.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from specrag.models import int8
from specrag.models.records import Records, positive

MIN_ROWS = 4  # fewer rows (steps, narrow passes): the usual layout, unless timed otherwise
NARROW_PAYS = 0.9  # passes of 1-3 rows read the second layout where it takes <= this x as long
MAX_ROWS = 128  # this many rows or more (prefills): the usual layout again (packed: ~6% slower)
MAX_EXTRA_BYTES = 8 << 30  # a second copy of a larger model's weights is too much memory
PAYS = 0.9  # the dual layout is kept if a 9-token pass takes at most this fraction as long
CHECK = f"9-token pass, 64-token cache, dual if <= {PAYS}x, packed"  # in a kept verdict's key
SURE = 0.05  # a kept verdict this close to PAYS (dual/single ratio) is timed again
# A timing where the second layout took more than this many times as long is taken again and
# the second one kept: both layouts compute the same product, and passes 3.5x slower were once
# timed while the machine was busy - kept, that verdict turned the layout off for good.
IMPLAUSIBLE = 1.5
# the same guard for the row count's 1-3 row products (a kept row count timed without it is
# timed again once): in a kept verdict, next to its ratios
NARROW_CHECK = f"1-3 rows, a ratio over {IMPLAUSIBLE}x timed twice"


@functools.cache
def _onednn() -> bool:
    """Whether this PyTorch packs weights for oneDNN and multiplies with them.

    Checked once per process on a small product, so no layer fails in the middle of an answer.
    """
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8), None)
        for rows in (1, MIN_ROWS):  # a step too: :func:`narrow_rows` may send it there
            torch.ops.mkldnn._linear_pointwise(torch.zeros(rows, 8), packed, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


def _packed(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` as oneDNN packs it for its GEMM; None where this PyTorch cannot."""
    if not _onednn():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)  # type: ignore[no-any-return]


def _wide_form(weight: torch.Tensor) -> torch.Tensor:
    """The second layout of ``weight``: oneDNN-packed, else transposed and contiguous."""
    fp32_cpu = weight.device.type == "cpu" and weight.dtype == torch.float32
    packed = _packed(weight) if fp32_cpu else None
    return packed if packed is not None else weight.t().contiguous()


Source = tuple[int, int, int, torch.dtype, torch.device]


def _source(weight: torch.Tensor) -> Source:
    """What a second layout made now is made from: identity, storage, version, dtype, device.

    Any change since (in place, replaced, cast, moved): the copy is stale. Not seen: writes
    through ``weight.data`` (its own version counter) and in-place writes to a weight made
    inside ``torch.inference_mode`` (no version kept); after such a write, a ``.to()`` of the
    layer (or :func:`remove` and :func:`add`) makes the copy again.
    """
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor keeps no version (nor can it change outside)
        version = -1
    return id(weight), weight.data_ptr(), version, weight.dtype, weight.device


class DualLinear(nn.Linear):
    """``nn.Linear`` that also holds its weight in a second layout, for 4-127 input rows.

    From ``min_rows`` instead of 4 where :func:`narrow_rows` timed narrower passes faster in it.

    The packed form has no storage PyTorch can copy or cast, so ``model.to(...)`` or
    ``.half()`` drops the second layout (a plain ``nn.Linear`` again, as :func:`apply` leaves
    other devices and dtypes) unless the weight stays where and what it was, and a copy
    (``copy.deepcopy``, pickling) makes it again from the copied weight. The copy is of the
    weight as it was when made (:func:`_source`): a weight changed since - in place
    (``load_state_dict``, an optimizer step), replaced, or cast through a tied twin (an
    output layer sharing the embedding's weight) - is read as it is now, by the usual
    product, until a ``.to()`` makes the copy again (or drops it, off fp32 CPU).
    """

    weight_t: torch.Tensor  # oneDNN-packed [out, in] (``is_mkldnn``) or [in, out]; not saved
    min_rows: int = MIN_ROWS  # fewer rows read the usual weight (:func:`narrow_rows` times it)
    made_from: Source  # the weight's :func:`_source` when ``weight_t`` was made

    def make_wide(self) -> torch.Tensor:
        """(Re)make the second layout from the weight as it is now; returns it."""
        self.register_buffer("weight_t", _wide_form(self.weight.detach()), persistent=False)
        self.made_from = _source(self.weight)
        return self.weight_t

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        rows = x.numel() // self.in_features
        if (
            rows < self.min_rows
            or rows >= MAX_ROWS
            # the second layout's products record no gradient and ignore autocast
            or torch.is_grad_enabled()
            or _autocast()
            or _source(self.weight) != self.made_from  # changed since: the copy is stale
        ):
            return super().forward(x)
        if self.weight_t.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise(  # type: ignore[no-any-return]
                x.contiguous(), self.weight_t, self.bias, "none", [], ""
            )
        y = torch.matmul(x, self.weight_t)  # [..., rows, out]
        return y if self.bias is None else y + self.bias

    def _apply(self, fn: Any, recurse: bool = True) -> DualLinear:
        wide = self._buffers.pop("weight_t", None)
        if wide is None:
            return super()._apply(fn, recurse)  # type: ignore[return-value]
        try:
            super()._apply(fn, recurse)
        except BaseException:  # a failed move (no such device, out of memory): as it was
            self._buffers["weight_t"] = wide
            raise
        # compared with what the copy was made from, not with the weight before this call:
        # a tied twin's own ``_apply`` may have cast or moved the shared weight already
        if _source(self.weight) == self.made_from:  # unchanged: neither is its copy
            self._buffers["weight_t"] = wide
        elif self.weight.device.type == "cpu" and self.weight.dtype == wide.dtype:
            self.make_wide()
        else:  # cast, or moved to a GPU: one layout (what apply() gives those)
            _one_layout(self)
        return self

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_buffers"] = {k: v for k, v in self._buffers.items() if k != "weight_t"}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.weight.device.type == "cpu" and self.weight.dtype == torch.float32:
            self.make_wide()
        else:  # unpickled onto another device or dtype: one layout, as apply() gives those
            _one_layout(self)


def narrow_rows(model: nn.Module, reps: int = 5) -> tuple[int, dict[int, float]]:
    """From how many rows the second layout is the faster one (1-3; else :data:`MIN_ROWS`).

    Where MKL multiplies a few rows fast (the Intel Xeons measured on 2026-12-02: 2-3 tokens
    ~1.05x a step), steps and narrow passes keep the usual weight; where it does not (an AMD
    EPYC on 2026-12-04, 2 cores: the 1.5B's 8960 x 1536 layer took 2.8 / 6.6 / 9.3 ms for
    1 / 2 / 3 rows, oneDNN's packed weight 2.2 / 2.1 / 2.1 ms), they read the second layout
    too. Timed on one layer of each weight shape, weighted by how many layers have it: the
    two layouts take turns (so a burst of load slows both), min of ``reps`` each after a
    warm-up; where a ratio lands within :data:`SURE` of :data:`NARROW_PAYS` it is timed
    again and the mins of both rounds count. Returns the row count and the times' ratios
    (second layout over usual) for 1-3 rows; a product that fails gives :data:`MIN_ROWS`.
    """
    layers = [m for m in linears(model) if isinstance(m, DualLinear)]
    shapes: dict[tuple[int, int], list[DualLinear]] = {}
    for layer in layers:
        shapes.setdefault(tuple(layer.weight.shape), []).append(layer)  # type: ignore[arg-type]
    if not shapes:
        return MIN_ROWS, {}
    best: dict[tuple[int, tuple[int, int], bool], float] = {}  # (rows, shape, second) -> min s

    def time_round() -> dict[int, float]:
        for rows in (1, 2, 3):
            for shape, group in shapes.items():
                layer = group[0]
                x = torch.randn(1, rows, layer.in_features, dtype=layer.weight.dtype)
                for rep in range(reps + 1):
                    for second in (False, True):
                        layer.min_rows = 1 if second else MAX_ROWS  # which weight forward reads
                        start = time.perf_counter()
                        layer(x)
                        took = time.perf_counter() - start
                        if rep:  # the first of each is a warm-up
                            slot = (rows, shape, second)
                            best[slot] = min(best.get(slot, float("inf")), took)
        ratios: dict[int, float] = {}
        for rows in (1, 2, 3):
            usual_s, second_s = (
                sum(best[(rows, shape, s)] * len(group) for shape, group in shapes.items())
                for s in (False, True)
            )
            ratios[rows] = second_s / max(usual_s, 1e-12)
        return ratios

    try:
        with torch.inference_mode():
            ratios = time_round()
            if second_round(ratios):
                ratios = time_round()  # the mins of both rounds
    except (RuntimeError, NotImplementedError):  # e.g. oneDNN refuses a shape: no narrow rows
        return MIN_ROWS, {}
    finally:
        for group in shapes.values():
            group[0].min_rows = MIN_ROWS
    return rows_from(ratios), {r: round(v, 3) for r, v in ratios.items()}


def implausible(ratios: Iterable[object]) -> bool:
    """Whether a 1-3 row ratio is over :data:`IMPLAUSIBLE` (values not numbers skipped).

    Both layouts compute the same product, so such a ratio is a busy moment, not the layout.
    """
    return any(isinstance(r, (int, float)) and r > IMPLAUSIBLE for r in ratios)


def second_round(ratios: dict[int, float]) -> bool:
    """Whether a round of 1-3 row timings is taken again.

    A ratio too close to call, or one over :data:`IMPLAUSIBLE` (both layouts compute the same
    product: a busy moment, as for the 9-token check - a review, 2026-12-07: a kept 2.6x for
    one row sent every step of the 1.5B to the slower weight for good).
    """
    near = any(abs(r - NARROW_PAYS) < SURE for r in ratios.values())
    return near or implausible(ratios.values())


def rows_from(ratios: dict[int, float]) -> int:
    """The fewest rows from which every pass up to 3 rows pays in the second layout.

    ``ratios``: time in the second layout over the usual one, for 1, 2 and 3 rows.
    """
    rows = MIN_ROWS
    for candidate in (3, 2, 1):
        if ratios.get(candidate, float("inf")) > NARROW_PAYS:
            break
        rows = candidate
    return rows


def min_rows_of(model: object) -> int:
    """From how many rows ``model``'s linear layers read their second layout."""
    if not isinstance(model, nn.Module):  # e.g. a remote or stand-in model: one layout
        return MIN_ROWS
    for layer in linears(model):
        if isinstance(layer, DualLinear):
            return layer.min_rows
    return MIN_ROWS


def state(model: object) -> str:
    """Which layout ``model``'s passes read now, in a few words (what a pass timing depends on)."""
    if not isinstance(model, nn.Module):
        return "one layout"
    if int8.is_int8(model):  # with or without its bf16 copy for wide passes
        return "int8 with a bf16 copy" if int8.has_wide_copy(model) else "int8"
    kind = wide_kind(model)
    if kind == "no":
        return "one layout"
    return f"{kind} from {min_rows_of(model)} rows" if in_use(model) else f"{kind}, off"


def set_min_rows(model: nn.Module, rows: int) -> None:
    """From how many rows ``model``'s linear layers read their second layout."""
    for layer in linears(model):
        if "weight_t" in layer._buffers:
            layer.min_rows = rows  # type: ignore[assignment]


def _autocast() -> bool:
    try:
        return bool(torch.is_autocast_enabled("cpu"))
    except TypeError:  # PyTorch before 2.4: no device argument
        return bool(torch.is_autocast_cpu_enabled())


_PLAIN: tuple[type, ...] = (nn.Linear, DualLinear)


def linears(model: nn.Module) -> list[nn.Linear]:
    """The model's plain ``nn.Linear`` layers (subclasses, e.g. quantized ones, are left)."""
    return [m for m in model.modules() if isinstance(m, nn.Linear) and type(m) in _PLAIN]


def add(model: nn.Module) -> int:
    """Give every plain linear layer its weight's second layout; returns the bytes added."""
    added = 0
    for layer in linears(model):
        if isinstance(layer, DualLinear):
            continue
        layer.__class__ = DualLinear
        weight_t = layer.make_wide()  # type: ignore[operator]
        added += weight_t.numel() * weight_t.element_size()
    return added


def remove(model: nn.Module) -> None:
    """Undo :func:`add`: plain ``nn.Linear`` layers again, the second copies freed."""
    for layer in linears(model):
        if "weight_t" in layer._buffers:  # switched to one layout by set_dual, or not
            _one_layout(layer)


def _one_layout(layer: nn.Linear) -> None:
    """A plain ``nn.Linear`` again: its second copy, and what it was made from, dropped."""
    layer._buffers.pop("weight_t", None)
    layer.__dict__.pop("made_from", None)
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


@functools.cache
def cpu_name() -> str:
    """This machine's CPU model ("model name" of /proc/cpuinfo, else what platform says)."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return cpu or platform.processor() or platform.machine()


@functools.cache
def cpu_id() -> str:
    """This CPU beyond its name, and PyTorch's kernel level for it (``AVX512``, ...).

    Vendor, family, model and stepping (x86), implementer, part and variant (ARM), from
    /proc/cpuinfo's first processor: "AMD EPYC" alone named machines that timed apart (a
    review, 2026-12-07).
    """
    wanted: tuple[str, ...] = ("vendor_id", "cpu family", "model", "stepping")
    wanted += ("cpu implementer", "cpu part", "cpu variant")
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    if found:
                        break  # the first processor's block is enough
                    continue
                name, _, value = line.partition(":")
                if name.strip().lower() in wanted:
                    found.setdefault(name.strip().lower(), value.strip())
    except OSError:
        pass
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        capability = "?"
    return " ".join([*(found[k] for k in wanted if k in found), capability])


def machine() -> str:
    """What a timed verdict depends on besides the model: CPU, threads, torch."""
    cpu = f"{cpu_name()} ({cpu_id()})"
    return f"{cpu}|{torch.get_num_threads()} threads|torch {torch.__version__}"


class Verdicts(Records):
    """Timed layout verdicts of this machine, in a JSON file (delete it to time again).

    A verdict holds for the same model weights, CPU, thread count and torch version and for
    the same check (:data:`CHECK`): the key. An unreadable file or a malformed entry counts as
    missing; reads and atomic writes are :class:`~specrag.models.records.Records`'.
    """

    def get(self, key: str) -> dict[str, Any] | None:
        """The verdict recorded for ``key``, if any (and well formed)."""
        found = super().get(key)
        if found is None or not isinstance(found.get("dual"), bool):
            return None
        times = [positive(found.get(name)) for name in ("single_s", "dual_s")]
        if None in times:
            return None
        return {**found, "single_s": times[0], "dual_s": times[1]}


def apply(
    model: nn.Module,
    device: torch.device,
    dtype: torch.dtype,
    timer: Callable[[], tuple[float, float]],
    verdicts: Verdicts | None = None,
    key: str = "",
) -> str:
    """Keep both layouts where they pay (fp32 on CPU, measured); returns why, in words.

    ``timer`` times a wide pass with each layout once both are added: ``(single_s, dual_s)``
    (:func:`specrag.models.loading.time_layouts`). With ``verdicts`` and a ``key`` (model
    weights and :func:`machine`) a verdict timed before is reused: no copy is made for a
    model that keeps one layout, and no timing is paid for one that keeps both.
    """
    if device.type != "cpu" or dtype != torch.float32:
        return f"single layout ({device.type}/{str(dtype).removeprefix('torch.')})"
    extra = linear_bytes(model)
    memory = memory_bytes()
    if extra > MAX_EXTRA_BYTES or (memory and extra > memory // 4):
        return f"single layout (a second copy of {extra / 2**30:.1f} GiB is too much memory)"
    if not extra:
        return "single layout (no plain linear layers)"
    store, slot = (verdicts if key else None), f"{key}|{CHECK}"
    known = store.get(slot) if store is not None else None
    timed_rows = {
        k: v for k, v in (known or {}).items() if k in ("min_rows", "narrow_ratios", "narrow_check")
    }
    if known is not None and abs(known["dual_s"] / known["single_s"] - PAYS) < SURE:
        known = None  # too close to call once: timed again (and kept if it says otherwise)
    if known is None:
        add(model)
        single_s, dual_s = timer()
        source = ""
        if dual_s > IMPLAUSIBLE * single_s:  # the same product this much slower: timed again
            single_s, dual_s = timer()
            source = f"; timed twice, the first over {IMPLAUSIBLE}x"
        dual = dual_s <= PAYS * single_s
        when = time.strftime("%Y-%m-%d", time.gmtime())
        # the row count does not depend on this timing: one kept before stays
        entry = {"dual": dual, "single_s": single_s, "dual_s": dual_s, "on": when, **timed_rows}
        if not dual:
            remove(model)
    else:
        assert store is not None  # a kept verdict comes from the store
        entry = dict(known)
        dual, single_s, dual_s = known["dual"], known["single_s"], known["dual_s"]
        if dual:
            add(model)
        source = f"; timed {known.get('on', '?')}, kept in {store.path}"
    if dual:
        rows = entry.get("min_rows")
        kept = entry.get("narrow_ratios")
        doubtful = (  # timed once before the guard, with a ratio it would have timed again
            entry.get("narrow_check") != NARROW_CHECK
            and isinstance(kept, dict)
            and implausible(kept.values())
        )
        if type(rows) is not int or not 1 <= rows <= MIN_ROWS or doubtful:  # not timed yet
            rows, narrow = narrow_rows(model)  # (or malformed)
            entry.update(min_rows=rows, narrow_ratios=narrow, narrow_check=NARROW_CHECK)
        set_min_rows(model, rows)
    if store is not None and entry != known:  # a new timing, or a row count added to a kept one
        store.put(slot, entry)
    if not dual:
        return (
            f"single layout (a 9-token pass {dual_s:.3f}s with both layouts vs "
            f"{single_s:.3f}s: not worth {extra / 2**30:.1f} GiB{source})"
        )
    return (
        f"dual layout: a 9-token pass {dual_s:.3f}s vs {single_s:.3f}s "
        f"(+{extra / 2**30:.1f} GiB of {wide_kind(model)} weights, read by passes of "
        f"{rows}-{MAX_ROWS - 1} tokens{source})"
    )


def wide_kind(model: nn.Module) -> str:
    """Which second layout ``model`` holds: "oneDNN-packed", "transposed" or "no"."""
    for layer in linears(model):
        if "weight_t" in layer._buffers:
            return "oneDNN-packed" if layer.weight_t.is_mkldnn else "transposed"
    return "no"


def has_dual(model: nn.Module) -> bool:
    """Whether :func:`add` gave ``model`` both layouts (in use or switched off by set_dual)."""
    return wide_kind(model) != "no"


def in_use(model: object) -> bool:
    """Whether ``model``'s passes of 4-127 rows now read a second layout (not set_dual off).

    From fewer rows where :func:`narrow_rows` timed them faster in it.
    """
    if not isinstance(model, nn.Module):  # e.g. a remote or stand-in model: one layout
        return False
    return any(isinstance(layer, DualLinear) for layer in linears(model))


def set_dual(model: nn.Module, on: bool) -> None:
    """Switch a model given both layouts by :func:`add` between them (benchmarks, timing)."""
    for layer in linears(model):
        if "weight_t" in layer._buffers:
            layer.__class__ = DualLinear if on else nn.Linear
