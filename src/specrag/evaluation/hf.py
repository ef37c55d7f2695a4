"""Hugging Face ``generate`` as a benchmark baseline, run on the model thread and timed."""

from __future__ import annotations

import time
from typing import Any

import torch

from specrag.models.loading import LoadedLM
from specrag.models.worker import MODEL_THREAD


def hf_generate(
    loaded: LoadedLM,
    prompt: list[int],
    *,
    max_new_tokens: int,
    cache: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Greedy HF ``generate`` (``kwargs``: prompt lookup, assistant model ...).

    A streamer times the first token; a forward hook counts the model's forward passes.
    ``cache`` is an optional KV cache already holding ``prompt[:-1]``.
    """
    from transformers import TextIteratorStreamer

    streamer = TextIteratorStreamer(loaded.tokenizer, skip_prompt=True, skip_special_tokens=True)
    out: dict[str, Any] = {}
    calls = [0]

    def count(*_: Any) -> None:
        calls[0] += 1

    handle = loaded.model.register_forward_pre_hook(count)

    def work() -> None:
        try:
            with torch.inference_mode():
                ids = torch.tensor([prompt], device=loaded.device)
                out["ids"] = loaded.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    **({"cache": cache} if cache is not None else {}),
                    do_sample=False,
                    streamer=streamer,
                    pad_token_id=loaded.tokenizer.eos_token_id,
                    **kwargs,
                )
        except Exception as exc:  # noqa: BLE001 - re-raised below
            out["error"] = exc
            streamer.end()  # never leave the reader waiting

    start = time.perf_counter()
    done = MODEL_THREAD.submit(work)  # the thread all model work runs on (models/worker.py)
    ttft = None
    text = ""
    try:
        for piece in streamer:
            if piece and ttft is None:
                ttft = time.perf_counter() - start
            text += piece
        done.result()
    finally:
        handle.remove()
    total = time.perf_counter() - start
    if "error" in out:
        raise out["error"]
    new = int(out["ids"].shape[1] - len(prompt))
    decode_s = total - (ttft or total)
    return {
        "answer": text.strip(),
        "new_tokens": new,
        "ttft_s": ttft,
        "total_s": total,
        "decode_s": decode_s,
        "forward_passes": calls[0],
        "tokens_per_s": (new - 1) / decode_s if decode_s > 0 and new > 1 else None,
    }
