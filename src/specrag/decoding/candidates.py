"""Deterministic speculative candidates: n-gram lookup in the draft and in the prompt.

The refine model verifies these candidates in one forward pass and keeps the prefix it agrees
with, so a good draft (or an answer that quotes its evidence) costs a fraction of the forward
passes of plain decoding, and a wrong one costs one pass per rejection - never the answer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Proposal:
    """Candidate tokens from one source.

    ``q`` is the proposing model's sampling distribution at each candidate position
    (``[len(tokens), vocab]``), used by speculative sampling; ``None`` means the candidates are
    deterministic (one-hot ``q``), as n-gram lookups are.
    """

    tokens: list[int]
    source: str
    q: torch.Tensor | None = None


class Proposer(Protocol):
    """Proposes up to ``k`` next tokens after ``generated``.

    Returns ``(tokens, source)`` for deterministic candidates, or a :class:`Proposal`.
    """

    def propose(  # noqa: D102
        self, generated: list[int], k: int
    ) -> tuple[list[int], str] | Proposal: ...


# A proposer may also define ``observe(candidates, emitted, pass_s)``: the decode loop then
# reports each pass (candidates verified, tokens emitted, the pass's seconds) so the proposer
# can weigh what its proposals cost (:class:`specrag.decoding.drafter.MergedProposer`).


class NgramProposer:
    """Suffix matching of the last 1..``max_ngram`` generated tokens against named sources.

    For each source a cursor remembers where the last match was, so after the model edits the
    draft (inserts or drops words) the next n-gram that matches re-aligns the draft with the
    answer. Longer matches win; at equal length, sources are tried in the order given (the
    draft first, since a draft is written to be the answer's continuation).
    """

    def __init__(
        self,
        sources: dict[str, list[int]],
        max_ngram: int = 3,
        min_ngram: int = 2,
        short_max: int = 0,
    ) -> None:
        self.sources = {name: toks for name, toks in sources.items() if toks}
        self.max_ngram = max_ngram
        # A match shorter than max_ngram proposes at most this many tokens (0: no limit): its
        # candidates are accepted less often, and where a verify pass over a few more tokens
        # costs twice a step (fp32 on CPU cores) the narrow pass is what pays.
        self.short_max = short_max
        # A single shared token is weak evidence of alignment: measured on SmolLM2 over SQuAD
        # prompts, proposing after 1-gram matches made decoding no faster than plain, while
        # requiring >= 2 shared tokens cut decode time to ~0.79x (see README, "Measured").
        self.min_ngram = min_ngram
        # index[name][n][ngram] = end positions (index right after the n-gram) in order.
        self.index: dict[str, dict[int, dict[tuple[int, ...], list[int]]]] = {}
        for name, toks in self.sources.items():
            per_n: dict[int, dict[tuple[int, ...], list[int]]] = {}
            for n in range(1, max_ngram + 1):
                table: dict[tuple[int, ...], list[int]] = defaultdict(list)
                for end in range(n, len(toks)):  # an n-gram that ends the source has no follow-up
                    table[tuple(toks[end - n : end])].append(end)
                per_n[n] = table
            self.index[name] = per_n
        self.cursor = dict.fromkeys(self.sources, 0)
        self.last_match = 0  # length of the n-gram the last proposal followed (0: none)

    @property
    def strong(self) -> bool:
        """Whether the last proposal followed a ``max_ngram``-token match.

        The one definition of a strong match: weaker ones are capped at ``short_max`` and
        judged by :class:`specrag.decoding.drafter.MergedProposer`'s pay check.
        """
        return self.last_match >= self.max_ngram

    def propose(
        self, generated: list[int], k: int, min_ngram: int | None = None
    ) -> tuple[list[int], str]:
        """Continuation of the longest n-gram match, or ``([], "")``.

        ``min_ngram``: the shortest match taken (default: the proposer's own).
        """
        self.last_match = 0
        least = self.min_ngram if min_ngram is None else min_ngram
        if k <= 0 or not self.sources:
            return [], ""
        for n in range(min(self.max_ngram, len(generated)), least - 1, -1):
            key = tuple(generated[-n:])
            for name, toks in self.sources.items():
                ends = self.index[name][n].get(key)
                if not ends:
                    continue
                # the first match at or after the cursor keeps reading order; else the first one
                end = next((e for e in ends if e >= self.cursor[name]), ends[0])
                self.cursor[name] = end
                self.last_match = n
                if self.short_max and n < self.max_ngram:
                    k = min(k, self.short_max)
                return toks[end : end + k], name
        return [], ""
