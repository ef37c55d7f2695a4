"""A drafter that computes only some rows of its output layer (FR-Spec-style head trim).

A drafter's output layer can be a large share of its step: Qwen2.5-0.5B's is 151,936 x 896
(136M of its 494M weights). A proposal only has to be likely, not complete, so a drafter may
score a subset of the vocabulary: the first ``first`` token ids (BPE vocabularies number their
tokens roughly by merge order, so the low ids are the common ones) plus every id of the
drafter's own prompt (the evidence's names and numbers) and the end tokens. Logits outside the
subset are ``-inf``: the drafter never proposes those tokens, and its distribution ``q`` is its
softmax over the subset - exactly the distribution its proposals are drawn from, so the target's
verification stays lossless (greedy output identical, sampled output the target's
distribution). Measured on the pair (2026-12-01; see README): the first 32,768 ids cover
90-93% of the 1.5B's answer tokens, with the prompt's ids 99.1-99.5%. RAPID's knowledge
transfer (eta > 0) reads ``q`` into the answer's own distribution, so there the drafter keeps
every row (:func:`specrag.decoding.rapid.rapid_decode` trims only when lossless).

Only the drafter's :class:`~specrag.decoding.state.LMState` carries a subset; the model's own
output layer is swapped for the duration of that state's forward calls, so a model shared by
drafter and target (the embedded model drafting for itself) scores every row for the target.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class VocabSubset(nn.Module):
    """The output rows a drafter computes, as the output layer it swaps in (see :func:`scoring`).

    Holds the rows' ids and a copy of their weights; its forward computes those rows and fills
    the rest with ``-inf``.
    """

    def __init__(
        self, ids: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int
    ) -> None:
        super().__init__()
        self.ids = ids  # [k] long, sorted, unique
        self.weight = weight  # [k, hidden]
        self.bias = bias  # [k] or None
        self.rows = rows  # the full output size

    @property
    def kept(self) -> int:
        """How many rows are computed."""
        return int(self.ids.numel())

    @classmethod
    def of(cls, model: Any, first: int, extra: Iterable[int]) -> VocabSubset | None:
        """The first ``first`` ids plus ``extra`` of ``model``'s output layer.

        None (score every row) when ``first`` is 0, when the output layer is not a linear layer
        with floating-point weights (quantized heads are left alone), or when the subset would
        keep half the rows or more (too little to save).
        """
        head = model.get_output_embeddings() if first > 0 else None
        if not isinstance(head, nn.Linear) or not head.weight.is_floating_point():
            return None
        rows = head.weight.shape[0]
        ids = set(range(min(first, rows))) | {i for i in extra if 0 <= i < rows}
        if 2 * len(ids) >= rows:
            return None
        index = torch.tensor(sorted(ids), dtype=torch.long, device=head.weight.device)
        with torch.no_grad():
            weight = head.weight.index_select(0, index).contiguous()
            bias = head.bias.index_select(0, index) if head.bias is not None else None
        return cls(index, weight, bias, rows)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # noqa: D102
        # as rows of a 2-D input: a 3-D one ([1, 1, hidden], the last position of a prefill)
        # took a slower bf16 kernel on CPU, measured 155 ms against 4 ms
        part = F.linear(hidden.reshape(-1, hidden.shape[-1]), self.weight, self.bias)  # [n, k]
        out = part.new_full((part.shape[0], self.rows), float("-inf"))
        out.index_copy_(-1, self.ids, part)
        return out.view(*hidden.shape[:-1], self.rows)


def fit_rows(logits: torch.Tensor, rows: int | None, usable: int | None = None) -> torch.Tensor:
    """A drafter's logits ``[..., vocab_d]`` laid out on its target's ``rows``, in fp32.

    Models of one family pad their output layers differently (Qwen2.5-0.5B: 151,936 rows, 7B:
    152,064) around one tokenizer of ``usable`` real tokens. Rows past ``usable`` (padding) and
    past the drafter's own width are ``-inf``, so the drafter's distribution ``q`` - exactly
    the distribution its proposals are drawn from - has the target's width and never proposes
    an id the target has no row for. ``rows`` None: unchanged (fp32).
    """
    logits = logits.float()  # a drafter may run in another dtype than the target
    if rows is None or (logits.shape[-1] == rows and (usable or rows) >= rows):
        return logits  # the same rows and no padding to mask
    n = min(rows, logits.shape[-1], usable or logits.shape[-1])
    out = logits.new_full((*logits.shape[:-1], rows), float("-inf"))
    out[..., :n] = logits[..., :n]
    return out


@contextmanager
def scoring(model: Any, subset: VocabSubset | None) -> Iterator[None]:
    """While inside, ``model``'s output layer computes only ``subset``'s rows (None: all)."""
    if subset is None:
        yield
        return
    full = model.get_output_embeddings()
    model.set_output_embeddings(subset)
    try:
        yield
    finally:
        model.set_output_embeddings(full)
