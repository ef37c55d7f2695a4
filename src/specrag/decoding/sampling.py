"""Turning logits into the distribution a decoder samples from."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampler:
    """Greedy when ``temperature == 0``; otherwise tempered sampling with optional top-p."""

    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        """True when decoding picks the argmax."""
        return self.temperature <= 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Sampling distribution for ``logits [..., vocab]`` (one-hot argmax when greedy)."""
        if self.greedy:
            out = torch.zeros_like(logits)
            out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
            return out
        return self.nucleus(torch.softmax(self.scaled(logits), dim=-1))

    def scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` over the temperature, the top one at 0 first (what softmax reads).

        The same distribution; without the shift a tiny temperature (1e-40) turned the logits
        into infinities and the softmax into NaN (and one below float32's smallest, 0/0).
        """
        tiny = torch.finfo(logits.dtype).tiny  # 1e-46 rounds to 0 in float32: 0/0 is NaN
        top = logits.max(dim=-1, keepdim=True).values
        return (logits - top) / max(self.temperature, tiny)

    def nucleus(self, probs: torch.Tensor) -> torch.Tensor:
        """``probs [..., vocab]`` cut to the top-p nucleus and renormalised (as is at top_p 1)."""
        if self.top_p >= 1.0:
            return probs
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < self.top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        return probs / probs.sum(-1, keepdim=True)

    def pick(self, probs: torch.Tensor, generator: torch.Generator | None) -> int:
        """Draw one token id from ``probs [vocab]``."""
        if self.greedy:
            return int(probs.argmax())
        return int(torch.multinomial(probs, 1, generator=generator))


def token_logprob(logits: torch.Tensor, token: int) -> float:
    """Log-probability of ``token`` under the model's untempered distribution."""
    return float(torch.log_softmax(logits, dim=-1)[token])
