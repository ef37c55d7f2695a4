"""Hugging Face ``generate`` as a benchmark baseline, run on the model thread and timed."""

from __future__ import annotations

import time
from typing import Any

import torch

from specrag.decoding.state import sync
from specrag.models.loading import LoadedLM
from specrag.models.worker import MODEL_THREAD


def _timed_streamer(tokenizer: Any) -> Any:
    """A ``TextIteratorStreamer`` that also records ``(time, n_tokens)`` of every step."""
    from transformers import TextIteratorStreamer

    class TimedStreamer(TextIteratorStreamer):
        def __init__(self) -> None:
            super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
            self.steps: list[tuple[float, int]] = []

        def put(self, value: Any) -> None:
            if not (self.skip_prompt and self.next_tokens_are_prompt):
                self.steps.append((time.perf_counter(), int(value.numel())))
            super().put(value)

    return TimedStreamer()


def stop_on_text(tokenizer: Any, prompt_len: int, stops: tuple[str, ...]) -> Any:
    """A stopping criterion that ends ``generate`` once the new text holds one of ``stops``.

    The graph's answers stop there (``ctx.stop_sequences()``); HF baselines stop under the same
    rule, so neither side decodes tokens the other would not. It reads the whole new text,
    so a stop string inside a block of accepted speculative tokens is seen too.
    """
    from transformers import StoppingCriteria

    from specrag.models.local import first_stop

    class StopOnText(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **_: Any) -> torch.Tensor:
            text = tokenizer.decode(input_ids[0, prompt_len:], skip_special_tokens=True)
            done = first_stop(text, stops) is not None
            return torch.full(
                (input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device
            )

    return StopOnText()


def hf_generate(
    loaded: LoadedLM,
    prompt: list[int],
    *,
    max_new_tokens: int,
    cache: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Greedy HF ``generate`` (``kwargs``: prompt lookup, assistant model ...).

    Timing comes from the streamer, which HF hands the tokens of every step: ``ttft_s`` is the
    first step (the prefill pass; with speculation it can carry several tokens), ``decode_s``
    the time after it and ``tokens_per_s`` the tokens emitted after it over that time - the
    same definition as the local decoders' (tokens after the prefill pass / time after it).

    ``decode_all_s`` is the whole call but the target's own prefill pass (timed by hooks): with
    speculation HF's first step also holds the assistant's prefill and first drafts, and the
    tokens they carried, which ``decode_s`` leaves out.

    Forward hooks count the forward passes: ``forward_passes`` are the target's own,
    ``assistant_forward_passes`` those of ``assistant_model`` (counted apart even when the
    assistant is the same model object: its passes are the ones made inside the assistant's
    nested ``generate`` calls). ``cache`` is an optional KV cache holding ``prompt[:-1]``.
    """
    streamer = _timed_streamer(loaded.tokenizer)
    out: dict[str, Any] = {}
    passes = {"target": 0, "assistant": 0}
    nested = [0]  # > 0 while HF runs the assistant's generate

    first_pass: list[float] = []  # start and end of the target's first (prefill) pass

    def count(*_: Any) -> None:
        passes["assistant" if nested[0] else "target"] += 1
        if not nested[0] and not first_pass:
            first_pass.append(time.perf_counter())

    def counted(*_: Any) -> None:
        if not nested[0] and len(first_pass) == 1:
            sync(loaded.device)  # the pass has run, not only been launched
            first_pass.append(time.perf_counter())

    model = loaded.model
    generate = model.generate  # the outer call never goes through the wrapper below
    assistant: Any = kwargs.get("assistant_model")
    handles = [model.register_forward_pre_hook(count), model.register_forward_hook(counted)]
    if assistant is not None and assistant is not model:
        handles.append(assistant.register_forward_pre_hook(count))
    patched = assistant is not None and "generate" not in vars(assistant)
    if patched:
        assistant_generate = assistant.generate

        def nested_generate(*args: Any, **kw: Any) -> Any:
            nested[0] += 1
            try:
                return assistant_generate(*args, **kw)
            finally:
                nested[0] -= 1

        assistant.generate = nested_generate  # an instance attribute, removed below

    def work() -> None:
        try:
            with torch.inference_mode():
                ids = torch.tensor([prompt], device=loaded.device)
                out["ids"] = generate(
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
    text = ""
    try:
        for piece in streamer:
            text += piece
        done.result()
    finally:
        for handle in handles:
            handle.remove()
        if patched:
            del assistant.generate
    total = time.perf_counter() - start
    if "error" in out:
        raise out["error"]
    new = int(out["ids"].shape[1] - len(prompt))
    steps: list[tuple[float, int]] = streamer.steps
    ttft = steps[0][0] - start if steps else None
    decode_s = steps[-1][0] - steps[0][0] if steps else 0.0
    decode_tokens = new - steps[0][1] if steps else 0
    prefill_s = first_pass[1] - first_pass[0] if len(first_pass) == 2 else None
    return {
        "answer": text.strip(),
        "new_tokens": new,
        "output_ids": out["ids"][0, len(prompt) :].tolist(),
        "ttft_s": ttft,
        "first_step_at": steps[0][0] if steps else None,  # perf_counter() of the first step
        "total_s": total,
        "decode_s": decode_s,
        "first_step_tokens": steps[0][1] if steps else 0,
        # everything but the target's own prefill pass: an assistant's prefill and the drafts
        # that the prefill pass already verified included (as a drafter's are in the graph's
        # decode time); None when the pass was not timed
        "target_prefill_s": prefill_s,
        "decode_all_s": total - prefill_s if prefill_s is not None else None,
        "forward_passes": passes["target"],
        "assistant_forward_passes": passes["assistant"],
        "tokens_per_s": decode_tokens / decode_s if decode_s > 0 and decode_tokens > 0 else None,
    }
