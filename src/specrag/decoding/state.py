"""A causal LM with its own KV cache: the unit both decoders are built from."""

from __future__ import annotations

import copy
import inspect
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import (
    DummyLayer,
    DynamicIndexedLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndSlidingWindowAttentionLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
)

from specrag.decoding.vocab import VocabSubset, scoring

# Prefill long prompts in slices so that peak activation memory stays bounded, and so that a
# budget can stop a long prefill between slices.
PREFILL_CHUNK = 2048
# Snapshots of a linear-attention cache's states kept for rolling back, one per recent forward
# call to :meth:`LMState.extend` (taken at the length before it). A proposer (a drafter) crops
# back over its whole proposal: more than its longest (16 single steps) and its catch-up feed.
# A verifier, after each verify pass, crops back only into what that call fed, where its
# latest snapshot is, so it keeps one - each copy costs as much memory as the state itself. A
# crop further back than the oldest (a rebuilt prompt sharing less than the cached one)
# re-reads the kept tokens.
MARKS = 20
VERIFIER_MARKS = 1


def sync(device: torch.device | str) -> None:
    """Wait until ``device`` has run what was queued on it; a no-op on a CPU.

    CUDA runs ahead of the host's clock: every timing of device work reads it after this.
    """
    device = torch.device(device) if isinstance(device, str) else device
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    elif device.type == "mps" and torch.backends.mps.is_available():  # queued as CUDA's is
        torch.mps.synchronize()


def settle(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` once its device has computed it (:func:`sync`).

    Timings taken right after a pass - a prefill's, before decode time starts - would
    otherwise charge the rest of that pass to what comes next.
    """
    sync(tensor.device)
    return tensor


def shared_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """Length of the longest common prefix of two sequences (token ids, or text)."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class Stopped(Exception):
    """A budget or stop signal ended a prefill between two slices (``reason`` says which)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _cache_kwarg(model: Any) -> str:
    """Transformers >= 5.x names the KV-cache argument ``cache`` (``past_key_values`` before)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def rollback_cache(model: Any) -> DynamicCache:
    """An empty KV cache for ``model`` that can be cropped back to any earlier length.

    Transformers gives sliding-window and chunked-attention layers (Mistral, Gemma 2/3, Qwen2
    with ``use_sliding_window``, ...) a cache that keeps only the last window of positions and
    cannot be cropped once the window is full - and speculative decoding crops rejected
    candidates after every verify pass. Those layers get a plain layer here, holding every
    position (their memory is that of full attention); the model's attention mask still applies
    the window, so the outputs are unchanged (ZAYA's linear attention beside a window too).
    Layers with other state (linear attention's convolution and recurrent states; MiniMax's
    own cache class) cannot be cropped: :meth:`LMState.crop` restores a snapshot of their
    states (:class:`Mark`) or, past every snapshot, re-reads the kept tokens.
    """
    if getattr(model.config, "model_type", None) == "minimax":  # refuses any other cache class
        from transformers.models.minimax.modeling_minimax import MiniMaxCache

        return MiniMaxCache()  # lightning-attention states in ``linear_cache``: see Mark
    cache = DynamicCache(config=model.config)
    cache.layers = [_unwindowed(layer) for layer in cache.layers]
    return cache


def _unwindowed(layer: Any) -> Any:
    """A layer holding every position where ``layer`` would keep only the last window."""
    if type(layer) is DynamicSlidingWindowLayer:
        return DynamicLayer()
    if type(layer) is LinearAttentionAndSlidingWindowAttentionLayer:  # ZAYA's hybrid_sliding
        return LinearAttentionAndFullAttentionLayer(number_of_states=layer.number_of_states)
    return layer


def croppable(cache: Any) -> bool:
    """Whether ``cache`` can be cropped back to any earlier length (plain key/value layers).

    If not, :meth:`LMState.crop` restores a :class:`Mark` or re-reads the kept tokens.
    Transformers' own ``is_croppable`` is not enough: a linear-attention layer recording its
    past reports True but can only roll back the tokens fed since its last crop.
    """
    if minimax_states(cache) is not None:
        return False
    return all(type(layer) in CROPPABLE for layer in cache.layers)


def minimax_states(cache: Any) -> list[Any] | None:
    """MiniMax's lightning-attention states, held beside its key/value layers (None: not MiniMax).

    ``MiniMaxCache.linear_cache`` has a state tensor (or ``[]``) per layer; no layer of the
    cache holds them, so every check of what a cache can crop or save asks here first.
    """
    return getattr(cache, "linear_cache", None)


# DSA models' layers (DeepSeek V3.2, GLM MoE DSA) crop their indexer keys with the key/values
CROPPABLE = (DynamicLayer, DynamicIndexedLayer, DummyLayer)
# layers whose linear-attention states a Mark restores and whose attention part (if any) crops
RESTORABLE = (*CROPPABLE, LinearAttentionLayer, LinearAttentionAndFullAttentionLayer)


@dataclass
class Mark:
    """A linear-attention cache's convolution and recurrent states after ``length`` tokens.

    Those states fold every token into a fixed-size tensor and cannot be cropped; restoring a
    mark and cropping the key/value layers puts the whole cache back at ``length`` tokens, so
    a rejected candidate costs re-feeding the accepted tokens after ``length``, not a re-read
    of the whole context. ``states``: per linear layer ``(layer, conv, recurrent, previous)``.
    """

    length: int
    states: list[tuple[Any, dict[int, torch.Tensor], dict[int, torch.Tensor], dict[int, bool]]]
    linear: list[Any] | None = None  # MiniMax's ``linear_cache``: a state tensor or [] per layer

    @staticmethod
    def possible(cache: Any) -> bool:
        """Whether a mark can restore ``cache`` (every layer a kind it knows)."""
        return all(type(layer) in RESTORABLE for layer in getattr(cache, "layers", []))

    @classmethod
    def take(cls, cache: Any, length: int) -> Mark | None:
        """A copy of ``cache``'s states now (None: a layer kind a mark cannot restore)."""
        if not length or not cls.possible(cache):
            return None
        layers = getattr(cache, "layers", [])
        states = []
        for layer in layers:
            if isinstance(layer, LinearAttentionCacheLayerMixin):
                conv = {i: t.clone() for i, t in layer.conv_states.items() if t is not None}
                rec = {i: t.clone() for i, t in layer.recurrent_states.items() if t is not None}
                states.append((layer, conv, rec, dict(layer.has_previous_state)))
        linear = minimax_states(cache)
        return cls(length, states, None if linear is None else _copies(linear))

    @torch.inference_mode()  # the cache's tensors were made there
    def restore(self, cache: Any) -> None:
        """Put ``cache`` back as it was at :attr:`length` tokens."""
        for layer, conv, rec, previous in self.states:
            for held, saved in ((layer.conv_states, conv), (layer.recurrent_states, rec)):
                for i, tensor in saved.items():
                    now = held.get(i)
                    if now is not None and now.shape == tensor.shape:
                        now.copy_(tensor)  # in place: a static address stays static
                    else:
                        held[i] = tensor.clone()
            layer.has_previous_state.update(previous)
        if self.linear is not None:
            cache.linear_cache = _copies(self.linear)
        for layer in cache.layers:  # each key/value part by its own length: a forward that
            if not isinstance(layer, DynamicLayer):  # raised may have fed some layers only
                continue
            drop = DynamicLayer.get_seq_length(layer) - self.length
            if drop > 0 and type(layer) in CROPPABLE:  # its own crop (indexer keys too)
                layer.crop(-drop)
            elif drop > 0:  # DynamicLayer's crop, not a linear layer's (it cannot crop)
                DynamicLayer.crop(layer, -drop)


def _copies(states: list[Any]) -> list[Any]:
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in states]


class LMState:
    """A model plus the tokens it has consumed and their KV cache.

    Invariant: ``len(self.tokens) == cache length``; ``self.tokens`` is exactly what the cache
    encodes, so cropping to a shared prefix is always safe.
    """

    def __init__(
        self, model: Any, device: torch.device | None = None, marks: int | None = None
    ) -> None:
        """``marks``: snapshots kept of a cache that cannot crop (default :data:`MARKS`)."""
        self.model = model
        self.device = device or next(model.parameters()).device
        self.cache: Any = rollback_cache(model)
        self.tokens: list[int] = []
        self.forward_passes = 0
        self.refills = 0  # crops done by re-reading the kept tokens (a cache that cannot crop)
        self.restores = 0  # crops done by restoring a snapshot of such a cache (Mark)
        self.marks: list[Mark] = []  # oldest first, lengths ascending
        self.keep_marks = MARKS if marks is None else marks
        if self.keep_marks < 1:
            raise ValueError(f"marks={marks} must be >= 1")
        self._kw = _cache_kwarg(model)
        self.vocab: VocabSubset | None = None  # a drafter's output rows (None: all of them)

    def __len__(self) -> int:
        return len(self.tokens)

    @torch.inference_mode()
    def extend(
        self,
        ids: list[int],
        *,
        all_logits: bool = True,
        keep: int = 1,
        should_stop: Callable[[], str | None] | None = None,
    ) -> torch.Tensor:
        """Feed ``ids`` after the cached tokens.

        Returns float32 logits ``[len(ids), vocab]``, or with ``all_logits`` False only the
        last ``keep`` positions' ``[keep, vocab]`` - used by prefill, where a full logits
        matrix of an 8K prompt would need gigabytes (``keep > 1``: a prompt followed by tokens
        to verify, in one pass). ``should_stop`` is asked before every prefill slice; a
        reason it returns raises :class:`Stopped` (the slices already fed stay cached, so
        the invariant holds).
        """
        if not ids:
            raise ValueError("extend() needs at least one token")
        if not 1 <= keep <= len(ids):
            raise ValueError(f"keep={keep} must be in 1..{len(ids)}")
        held = self.marks and self.marks[-1].length == len(self.tokens)  # (a restored one)
        if not held and not croppable(self.cache):
            if mark := Mark.take(self.cache, len(self.tokens)):
                # crop dropped every longer one
                self.marks = [*self.marks, mark][-self.keep_marks :]
        out: torch.Tensor | None = None
        step = len(ids) if all_logits else PREFILL_CHUNK
        starts = list(range(0, len(ids), step))
        # a cache that cannot crop gets a snapshot before the tokens verified with a prompt
        # (an opening draft, an incremental answer): a rejected one restores it, where the
        # one snapshot before the whole prompt made it read the prompt again
        split = (
            not all_logits
            and keep > 1
            and len(ids) > keep
            and not croppable(self.cache)
            and Mark.possible(self.cache)  # a pass split for no snapshot would cost for nothing
        )
        if not all_logits and (split or len(ids) - starts[-1] < keep):  # last slice: them all
            starts = [s for s in starts if s < len(ids) - keep] + [len(ids) - keep]
        for start, end in zip(starts, [*starts[1:], len(ids)], strict=True):
            if should_stop is not None and (reason := should_stop()):
                raise Stopped(reason)
            if split and end == len(ids) and start > 0:
                if mark := Mark.take(self.cache, len(self.tokens)):
                    self.marks = [*self.marks, mark][-self.keep_marks :]
            piece = ids[start:end]
            input_ids = torch.tensor([piece], dtype=torch.long, device=self.device)
            kwargs = {self._kw: self.cache, "use_cache": True}
            if not all_logits:
                kwargs["logits_to_keep"] = keep if end == len(ids) else 1
            with scoring(self.model, self.vocab):
                result = self.model(input_ids=input_ids, **kwargs)
            self.tokens.extend(piece)
            self.forward_passes += 1
            out = result.logits[0].float()  # [n, vocab]
        assert out is not None
        return out

    def restrict(self, first: int, extra: Sequence[int]) -> int:
        """Score only the first ``first`` ids plus ``extra`` from now on; rows kept (0: all).

        For a drafter (see :mod:`specrag.decoding.vocab`): logits outside the subset are
        ``-inf``. The KV cache is unaffected, so the subset may change between calls.
        """
        self.vocab = VocabSubset.of(self.model, first, extra)
        return self.vocab.kept if self.vocab is not None else 0

    def crop(self, length: int, should_stop: Callable[[], str | None] | None = None) -> None:
        """Drop cached tokens beyond ``length``.

        A cache that cannot crop may re-read kept tokens; ``should_stop`` is asked before each
        slice of that re-read as :meth:`extend` asks it (a long re-read keeps to a budget).
        """
        drop = len(self.tokens) - length
        if drop < 0 or length < 0:
            raise ValueError(f"cannot crop to {length}: {len(self.tokens)} cached")
        if not drop:
            return
        if croppable(self.cache):
            self.cache.crop(-drop)  # transformers 5.x: negative = number of tokens to remove
            del self.tokens[length:]
            return
        # convolution/recurrent state (linear attention) cannot be cropped: restore the latest
        # snapshot at or before ``length`` and re-feed the tokens after it, or re-read them all
        kept = self.tokens[:length]
        marks = [m for m in self.marks if m.length <= length]
        if marks:
            marks[-1].restore(self.cache)
            self.tokens, self.marks = kept[: marks[-1].length], marks
            self.restores += 1
        else:
            self.cache, self.tokens, self.marks = rollback_cache(self.model), [], []
            self.refills += 1
        if len(self.tokens) < length:
            self.extend(kept[len(self.tokens) :], all_logits=False, should_stop=should_stop)

    def sync(
        self, committed: list[int], should_stop: Callable[[], str | None] | None = None
    ) -> None:
        """Crop to the longest common prefix of the cache and ``committed``."""
        self.crop(shared_prefix(self.tokens, committed), should_stop)

    def clone(self) -> LMState:
        """An independent copy (own KV cache) - used to reuse a cached document prefix."""
        other = LMState.__new__(LMState)
        other.model, other.device, other._kw = self.model, self.device, self._kw
        other.vocab = self.vocab
        other.cache = copy.deepcopy(self.cache)
        other.tokens = list(self.tokens)
        other.forward_passes = other.refills = other.restores = 0
        other.marks = []  # they name this state's layers; the copy re-reads if it must
        other.keep_marks = self.keep_marks
        return other

    def kv_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The cache's (keys, values) per layer, each ``[batch, kv_heads, tokens, head_dim]``.

        Raises ValueError for a cache with other state (recurrent, shared or indexed layers):
        only plain key/value layers are saved and restored.
        """
        layers = getattr(self.cache, "layers", [])
        if minimax_states(self.cache) is not None:
            raise ValueError("MiniMax's cache layers hold more than keys and values")
        if any(type(layer) is not DynamicLayer for layer in layers):
            kinds = sorted({type(layer).__name__ for layer in layers} - {"DynamicLayer"})
            raise ValueError(f"cache layers {', '.join(kinds)} hold more than keys and values")
        return [(layer.keys, layer.values) for layer in layers]

    @classmethod
    def from_kv(
        cls, model: Any, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> LMState:
        """A state holding ``tokens`` whose KV cache is ``kv`` (see :meth:`kv_tensors`).

        Raises ValueError (:meth:`check_kv`) before placing anything on the device when ``kv``
        is not a cache of ``model``'s shape holding ``tokens``.
        """
        cls.check_kv(model, tokens, kv)
        state = cls(model)
        for i, (keys, values) in enumerate(kv):
            state.cache.update(keys.to(state.device), values.to(state.device), i)
        state.tokens = list(tokens)
        return state

    @staticmethod
    def check_kv(
        model: Any, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        """Raise ValueError unless ``kv`` is a cache of ``model``'s shape holding ``tokens``.

        Its layers and each layer's KV heads and head size as the model's own cache holds them
        (:func:`kv_shapes`), its length per tokens.
        """
        shapes = kv_shapes(model)
        if len(kv) != len(shapes):
            raise ValueError(f"{len(kv)} cached layers for a model of {len(shapes)}")
        for (keys, values), (heads, key_dim, value_dim) in zip(kv, shapes, strict=True):
            if keys.shape[-2] != len(tokens) or values.shape[-2] != len(tokens):
                raise ValueError("KV tensors do not match the token count")
            if keys.shape[1] != heads or values.shape[1] != heads:
                raise ValueError(f"{keys.shape[1]} cached KV heads for a model of {heads}")
            if keys.shape[-1] != key_dim or values.shape[-1] != value_dim:
                raise ValueError(f"cached heads of {keys.shape[-1]} for a model's {key_dim}")

    def nbytes(self) -> int:
        """Memory held by the cache: every tensor it holds.

        Keys, values, a sparse-attention layer's indexer keys, a linear-attention layer's
        states and MiniMax's lightning states. Only keys and values were counted: a hybrid
        model's states were left out of the prefix cache's memory budget.
        """
        seen: set[int] = set()
        total = 0

        def count(value: Any) -> None:
            nonlocal total
            if isinstance(value, torch.Tensor):
                if id(value) not in seen:
                    seen.add(id(value))
                    total += value.numel() * value.element_size()
            elif isinstance(value, list | tuple):
                for item in value:
                    count(item)
            elif isinstance(value, dict):  # a linear-attention layer's states, by kind
                for item in value.values():
                    count(item)

        for layer in getattr(self.cache, "layers", []):
            for value in vars(layer).values():
                count(value)
        count(minimax_states(self.cache) or [])
        return total


_KV_SHAPES: weakref.WeakKeyDictionary[Any, list[tuple[int, int, int]]] = weakref.WeakKeyDictionary()


def kv_shapes(model: Any) -> list[tuple[int, int, int]]:
    """Per cache layer of ``model``: its KV heads, key size and value size, as its cache holds them.

    Read from a 1-token pass (once per model): the config guessed wrong for multi-query
    Falcon (no ``num_key_value_heads``: 1 head cached, all heads expected) and DeepSeek's
    latent attention, so every prefix kept on disk for them was dropped as damaged.
    """
    found = _KV_SHAPES.get(model)
    if found is None:
        probe = LMState(model, marks=1)
        with torch.inference_mode():
            probe.extend([0], all_logits=False)
        found = [(k.shape[1], k.shape[-1], v.shape[-1]) for k, v in probe.kv_tensors()]
        _KV_SHAPES[model] = found
    return found
