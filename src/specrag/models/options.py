"""``DecodeOptions``: the typed per-call settings of a local decode.

Nodes build one and pass it as ``model.astream(messages, options=DecodeOptions(...))``. Plain
keyword arguments (``model.invoke(msgs, temperature=0.0)``) still work for LangChain users;
they are checked against the same fields, so a misspelt key is an error, not silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from specrag.errors import InputError, ModelLoadError

if TYPE_CHECKING:
    import torch

Speculation = Literal["none", "prompt", "draft+prompt"]
INT8_NAMES = ("int8", "qint8")  # the dtype of a drafter with int8 layers (specrag.models.int8)
# the float dtypes a local model may load in, by name: the torch dtype each one is
# (specrag.models.loading.resolve_dtype reads it; "auto" resolves per device)
FLOAT_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
FLOAT_NAMES = ("auto", *FLOAT_DTYPES)
DEVICE_FORMS = re.compile(r"auto|cpu|mps|cuda(:\d+)?")  # where it may run
DEVICE_TEXT = "auto, cpu, cuda, cuda:N, mps"  # DEVICE_FORMS, as its errors and docs name them


def resolve_device(device: str = "auto") -> torch.device:
    """Map ``auto``/``cpu``/``cuda``/``cuda:N``/``mps`` to a torch device.

    Its :class:`ModelLoadError` is one line: no such device here, or no such name. (torch is
    imported here, not with the module: per-call options need none.)
    """
    import torch

    if device in ("", "auto"):  # "cuda" as an explicit "cuda" resolves: one name per GPU
        return resolve_device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ModelLoadError(f"unknown device {device!r} (use {DEVICE_TEXT})") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} requested but CUDA is not available here")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ModelLoadError(f"device {device!r}: this machine has {count} CUDA device(s)")
        # one name per GPU: "cuda" and "cuda:0" share loaded models and KV caches
        return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"device {device!r} requested but MPS is not available here")
    if dev.type not in ("cpu", "mps"):  # torch knows more (xpu, meta): not run or tested here
        raise ModelLoadError(f"unknown device {device!r} (use {DEVICE_TEXT})")
    return dev


def check_placement(device: str, dtype: str, drafter_dtype: str, prefix: str = "") -> None:
    """Raise a one-line :class:`InputError` for a device or dtype name no model can load with.

    Whether that device exists here (CUDA available) is checked when a model loads.
    """
    if not DEVICE_FORMS.fullmatch(device):
        raise InputError(f"{prefix}device={device!r} (allowed: {DEVICE_TEXT})")
    refuse_int8_answer(dtype, "dtype", prefix)
    for setting, value, names in (
        ("dtype", dtype, FLOAT_NAMES),
        ("drafter_dtype", drafter_dtype, FLOAT_NAMES + INT8_NAMES),
    ):
        if value not in names:
            raise InputError(f"{prefix}{setting}={value!r} (allowed: {', '.join(names)})")
    if drafter_dtype in INT8_NAMES and device.startswith(("cuda", "mps")):  # "auto": at load
        raise InputError(
            f"{prefix}drafter_dtype={drafter_dtype!r} with device={device!r}: int8 dynamic "
            "quantization runs on CPU only (leave drafter_dtype=auto on a GPU)"
        )


def refuse_int8_answer(dtype: str, setting: str, prefix: str = "") -> None:
    """Raise a one-line :class:`InputError` when an answering model's ``dtype`` is int8.

    An int8 model's wide passes compute differently from its single steps
    (:mod:`specrag.models.int8`), so as the answer model it would not reproduce its own decoding.
    """
    if dtype in INT8_NAMES:
        raise InputError(
            f"{prefix}{setting}={dtype!r}: int8 is for a drafter only (set drafter_dtype=int8): "
            "an int8 model's wide passes compute differently from its steps, so as the answer "
            "model it would not reproduce its own decoding"
        )


# Keyword arguments LangChain itself may add to a model call; they are not decode settings.
# ``stream``: its per-call opt-in or opt-out of streaming (langchain-core passes it on)
_LANGCHAIN_KWARGS = ("callbacks", "tags", "metadata", "run_name", "run_id", "stream")


# LangChain's usual names for decode options
_ALIASES = {"max_tokens": "max_new_tokens"}


MAX_SEED = 2**64 - 1  # a torch.Generator's largest seed


@dataclass(frozen=True)
class DecodeOptions:
    """Per-call decode settings; ``None`` means "the model's own default"."""

    temperature: float | None = None
    max_new_tokens: int | None = None
    speculation: Speculation | None = None
    draft: str | None = None  # candidate text for speculation="draft+prompt"
    seed: int | None = None  # sampling seed (reproducible answers)
    max_time: float | None = None  # seconds; the decode loop (prefill included) stops at it
    stop_event: threading.Event | None = None  # stop once set and min_tokens exist
    min_tokens: int = 0
    stop: tuple[str, ...] = ()  # stop sequences: the text ends before the first one found
    document: str | None = None  # RAPID: the long document the target reads
    drafter_context: str | None = None  # RAPID: the retrieved text the drafter reads
    # refine/generate: the messages a separate drafter reads (e.g. fewer evidence blocks);
    # None: the answer model's own. Not for incremental answers (a prompt_feed)
    drafter_messages: tuple[Any, ...] | None = None
    # incremental answers: a PromptFeed of rebuilt message lists (the answer is re-verified
    # against each; see specrag.decoding.incremental)
    prompt_feed: Any = None
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI-style tool schemas (bind_tools)
    tool_choice: Any = None  # None/"auto", "any"/"required", or a tool name

    def __post_init__(self) -> None:
        """A per-call temperature or limit no decode can use is a one-line ValueError.

        (A NaN temperature failed deep in sampling, inf sampled uniformly, a negative one
        meant greedy.) ``max_time`` <= 0 stops at once (a budget already spent), inf never.
        """
        checks = (
            ("temperature", self.temperature),
            ("max_new_tokens", self.max_new_tokens),
            ("max_time", self.max_time),
        )
        seed = self.seed  # torch's generator takes 0 .. 2**64 - 1 (a float failed deep in it)
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED
        ):
            raise ValueError(f"seed must be an integer from 0 to 2**64 - 1, got {seed!r}")
        for name, value in checks:
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name} must be a number, got {type(value).__name__}")
            if math.isnan(float(value)):
                raise ValueError(f"{name} must be a number, got NaN")
            if name != "max_time" and (value < 0 or math.isinf(value)):
                raise ValueError(f"{name} must be >= 0 and finite, got {value!r}")

    @classmethod
    def from_call(cls, kwargs: dict[str, Any]) -> DecodeOptions:
        """Options from a call's keyword arguments (``options=`` plus loose keys)."""
        base = kwargs.get("options") or cls()
        if not isinstance(base, DecodeOptions):
            raise TypeError(f"options must be DecodeOptions, got {type(base).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        loose: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key == "options" or key in _LANGCHAIN_KWARGS or key.startswith("ls_"):
                continue
            key = _ALIASES.get(key, key)
            if key not in names:
                raise TypeError(
                    f"unknown decode option {key!r} (known: {', '.join(sorted(names))})"
                )
            if key == "stop":  # one string is one stop sequence, not its characters
                value = (value,) if isinstance(value, str) else tuple(value or ())
            if key == "tools":
                value = tuple(value or ())
            loose[key] = value
        return dataclasses.replace(base, **loose) if loose else base
