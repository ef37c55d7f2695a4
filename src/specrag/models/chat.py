"""``ChatLocalLM``: a LangChain chat model over a local Hugging Face causal LM.

Thin by design: it adapts messages to the model's chat template and runs
:func:`specrag.decoding.speculative.decode` on the model thread (streaming, time bounds and
log-probabilities come from :class:`~specrag.models.local.LocalChatBase`). It adds
**speculative candidates**: ``speculation="prompt"`` proposes n-grams of the prompt (the
evidence), ``"draft+prompt"`` also of a ``draft=`` text passed per call; greedy output is
unchanged, decoding needs fewer forward passes. Decoding statistics go to
``response_metadata["decoding"]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from langchain_core.messages import BaseMessage
from pydantic import Field

from specrag.decoding.candidates import NgramProposer
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import DecodeStats, Token, decode
from specrag.decoding.state import LMState
from specrag.models.loading import EMBEDDED_LM, LoadedLM, load_lm
from specrag.models.local import (
    DecodeJob,
    LocalChatBase,
    StopCheck,
    encode_chat,
    make_generator,
)
from specrag.models.options import DecodeOptions, Speculation

__all__ = ["ChatLocalLM", "LocalChatBase", "encode_chat", "make_generator"]


class ChatLocalLM(LocalChatBase):
    """A local Hugging Face causal LM as a streaming LangChain chat model.

    Per-call keyword arguments (``model.invoke(msgs, draft=..., max_time=...)``):
    ``draft`` (candidate text for ``speculation="draft+prompt"``), ``speculation``,
    ``max_time``, ``max_new_tokens``, ``temperature``, ``stop_event`` (a ``threading.Event``;
    decoding stops once it is set and ``min_tokens`` tokens exist) and ``min_tokens``.
    """

    model_name: str = Field(default=EMBEDDED_LM, description="embedded, a local path or a hub id")
    device: str = "auto"
    dtype: str = "auto"
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    speculation: Speculation = "prompt"
    max_candidates: int = 8
    seed: int | None = None

    @property
    def _llm_type(self) -> str:
        return "specrag-local-hf"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "device": self.device,
            "dtype": self.dtype,
            "temperature": self.temperature,
            "speculation": self.speculation,
        }

    def load(self) -> LoadedLM:
        """Load the model now (once per process); call before any time budget starts."""
        return load_lm(self.model_name, self.device, self.dtype)

    def _job(self, messages: list[BaseMessage], options: DecodeOptions) -> DecodeJob:
        loaded = self.load()
        temperature = self.temperature if options.temperature is None else options.temperature
        max_new = options.max_new_tokens or self.max_new_tokens
        prompt = encode_chat(loaded, messages)
        limit = loaded.max_context - 1
        if len(prompt) + max_new > limit:  # keep the chat head and the question end
            keep = max(limit - max_new, 16)
            prompt = prompt[:8] + prompt[-(keep - 8) :]
        sources: dict[str, list[int]] = {}
        draft = options.draft
        speculation = options.speculation or self.speculation
        if speculation == "draft+prompt" and draft:
            sources["draft"] = loaded.tokenizer(draft, add_special_tokens=False)["input_ids"]
        if speculation != "none":
            sources["prompt"] = prompt
        proposer = NgramProposer(sources) if sources else None
        sampler = Sampler(temperature, self.top_p)
        seed = self.seed if options.seed is None else options.seed
        generator = make_generator(loaded.device, sampler, seed)
        stats = DecodeStats()

        def produce(should_stop: StopCheck) -> Iterator[list[Token]]:
            lm = LMState(loaded.model, loaded.device)
            yield from decode(
                lm,
                prompt,
                max_new_tokens=max_new,
                sampler=sampler,
                eos_ids=loaded.eos_token_ids,
                proposer=proposer,
                max_candidates=self.max_candidates,
                should_stop=should_stop,
                generator=generator,
                stats=stats,
            )

        return DecodeJob(
            produce=produce,
            tokenizer=loaded.tokenizer,
            eos_ids=loaded.eos_token_ids,
            input_tokens=len(prompt),
            metadata=lambda: {**stats.as_dict(), "speculation": speculation},
            finish_reason=lambda: stats.finish_reason,
            model_name=loaded.name,
        )
