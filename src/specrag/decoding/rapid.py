"""RAPID: Retrieval-Augmented sPeculative Decoding (arXiv 2502.20330).

The *target* reads the whole long document; the *drafter* (same tokenizer; the same model, a
smaller or a larger one) reads only the chunks retrieved for the question. Each step the
drafter proposes up to ``gamma`` tokens from its own KV cache, and the target scores all of
them in one forward pass over its own KV cache.

Knowledge transfer (the paper's inference-time "retrieval-augmented target distribution"):
with target logits ``z``, target distribution ``p = softmax(z / T)`` and drafter distribution
``q`` at the same position,

* ``transfer="shift"`` (reference code, default): ``p_hat = softmax(z / T + eta * (q - p) * m)``
  with ``m = [q >= alpha * max(q)]`` - the shift only touches tokens the drafter finds
  plausible. Draft token ``d`` is accepted when ``u <= p_hat(d) / q(d)``; on rejection the
  replacement is drawn from ``normalize(max(p - q, p - p_hat)+)`` (the reference rule);
* ``transfer="mixture"`` (with ``eta > 0``): ``p_hat = (1 - lam) * p + lam * q``, accepted when
  ``u <= p_hat(d) / q(d)``, residual ``normalize((p_hat - q)+)`` - exact sampling from
  ``p_hat``;
* ``eta = 0`` (whatever the rule) or ``transfer="none"``: ``p_hat = p``, standard
  speculative sampling, which is lossless: greedy output is token-identical to target-only
  greedy decoding and sampled output has the target's distribution.

Greedy mode accepts ``d`` iff ``d == argmax p_hat`` and corrects with ``argmax p_hat``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from specrag.decoding.clock import own_clock
from specrag.decoding.sampling import Sampler, token_logprob
from specrag.decoding.speculative import Token, prefill, prefill_stop
from specrag.decoding.state import LMState, Stopped, settle
from specrag.decoding.vocab import fit_rows

Transfer = Literal["shift", "mixture", "none"]


@dataclass(frozen=True)
class RapidConfig:
    """RAPID decoding settings (defaults follow the paper's reference code where it has one)."""

    gamma: int = 10  # draft tokens per step (reference: 10)
    transfer: Transfer = "shift"
    eta: float = 5.0  # transfer strength for "shift" (paper: 5-50); 0 = off for any rule
    alpha: float = 0.1  # shift only where q >= alpha * max(q) (reference: 0.1)
    lam: float = 0.3  # drafter weight for "mixture"
    adaptive_gamma: bool = True  # +1 after a fully accepted step, -1 after a rejection
    max_gamma: int = 16
    # a round stops drafting before a position where the drafter's max(q) is below this (its
    # first draft token is always proposed; 0 = off); it reads only q, so eta 0 stays lossless
    min_draft_confidence: float = 0.0
    drafter_vocab: int = 0  # > 0 and lossless: the drafter scores these first ids + its prompt's

    @property
    def first_gamma(self) -> int:
        """The first round's draft length: ``gamma``, within ``max_gamma`` where it adapts."""
        return min(self.gamma, max(self.max_gamma, 1)) if self.adaptive_gamma else self.gamma

    @property
    def lossless(self) -> bool:
        """True when the output follows the target alone (no knowledge transfer)."""
        return (
            self.transfer == "none"
            or self.eta == 0
            or (self.transfer == "mixture" and self.lam == 0)
        )


@dataclass
class RapidStats:
    """Counters of one RAPID decode."""

    new_tokens: int = 0
    steps: int = 0  # verification passes of the target (after prefill)
    draft_tokens: int = 0  # proposed by the drafter
    accepted_tokens: int = 0  # draft tokens accepted by the target
    drafter_passes: int = 0
    drafter_vocab_rows: int = 0  # output rows the drafter scored (0: all)
    unsure_stops: int = 0  # rounds that stopped drafting at an unsure position
    cache_refills: int = 0  # crops of either model done by re-reading (LMState.refills)
    cache_restores: int = 0  # crops of either model done from a state snapshot (restores)
    target_prefill_s: float = 0.0
    drafter_prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str = ""
    prefilled: bool = False  # the target's prompt was read (a budget may stop its prefill)
    drafter_prefilled: bool = False  # and the drafter's

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_per_step(self) -> float:
        """Mean accepted draft tokens per verification pass."""
        return self.accepted_tokens / self.steps if self.steps else 0.0

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly summary."""
        return {
            "new_tokens": self.new_tokens,
            # each model's prefill (its slices count as one pass, as in HF's count: the
            # assistant's prefill is among its passes) and each step
            "target_forward_passes": self.steps + int(self.prefilled),
            "drafter_forward_passes": self.drafter_passes + int(self.drafter_prefilled),
            "drafter_vocab_rows": self.drafter_vocab_rows,
            "unsure_stops": self.unsure_stops,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_per_step": round(self.mean_accepted_per_step, 4),
            "target_prefill_s": round(self.target_prefill_s, 4),
            "drafter_prefill_s": round(self.drafter_prefill_s, 4),
            "decode_s": round(self.decode_s, 4),
            "finish_reason": self.finish_reason,
            **({"cache_refills": self.cache_refills} if self.cache_refills else {}),
            **({"cache_restores": self.cache_restores} if self.cache_restores else {}),
        }


def transfer_distribution(
    target_logits: torch.Tensor,  # [n, vocab]
    draft_probs: torch.Tensor,  # [n, vocab]
    cfg: RapidConfig,
    sampler: Sampler,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(p, p_hat)``, each ``[n, vocab]``: the target's and the transfer distribution.

    Sampling, both are the ``sampler``'s: tempered and cut to its top-p nucleus (``p`` is
    what plain sampling draws from). Greedy, ``p`` is the untempered softmax the shift rule
    moves; only its argmax is read.
    """
    greedy = sampler.greedy
    scaled = target_logits if greedy else sampler.scaled(target_logits)
    p = torch.softmax(scaled, dim=-1)
    if not greedy:
        p = sampler.nucleus(p)
    if cfg.lossless:
        return p, p
    if cfg.transfer == "mixture":
        return p, (1.0 - cfg.lam) * p + cfg.lam * draft_probs
    mask = draft_probs >= cfg.alpha * draft_probs.max(dim=-1, keepdim=True).values
    p_hat = torch.softmax(scaled + cfg.eta * (draft_probs - p) * mask, dim=-1)
    return p, p_hat if greedy else sampler.nucleus(p_hat)


def rapid_decode(
    target: LMState,
    drafter: LMState,
    target_prompt: list[int],
    drafter_prompt: list[int],
    *,
    max_new_tokens: int,
    sampler: Sampler,
    cfg: RapidConfig,
    eos_ids: tuple[int, ...] = (),
    should_stop: Callable[[int], str | None] | None = None,
    generator: torch.Generator | None = None,
    stats: RapidStats | None = None,
    usable: int | None = None,
) -> Iterator[list[Token]]:
    """Yield the tokens emitted by each verification step.

    ``target`` may already hold a prefix of ``target_prompt`` (document prefix cache).
    ``usable``: the shared tokenizer's size; the drafter's distribution is laid out on the
    target's output rows with rows past it masked (:func:`specrag.decoding.vocab.fit_rows`:
    models of one family pad their output layers differently).
    """
    st = stats if stats is not None else RapidStats()
    greedy = sampler.greedy
    rows: int | None = None  # the target's output width, known after its prefill

    def draft_dist(logits: torch.Tensor) -> torch.Tensor:  # drafter q at one position, [vocab]
        logits = fit_rows(logits, rows, usable)  # fp32, on the target's rows
        return torch.softmax(logits, dim=-1) if greedy else sampler.probs(logits)

    t_start: float | None = None  # when decoding began, after both prefills
    generated: list[int] = []

    def finish(reason: str) -> None:
        st.finish_reason = reason
        st.new_tokens = len(generated)
        st.decode_s = 0.0 if t_start is None else time.perf_counter() - t_start  # wall
        st.cache_refills = target.refills + drafter.refills
        st.cache_restores = target.restores + drafter.restores

    if max_new_tokens <= 0:  # nothing to decode: neither model runs
        return finish("length")
    before = prefill_stop(should_stop)

    def drafter_prefill() -> torch.Tensor:
        t0 = own_clock()
        if cfg.drafter_vocab and cfg.lossless:  # with transfer q shapes the answer: all rows
            # counted in the drafter's prefill: it copies the kept rows
            st.drafter_vocab_rows = drafter.restrict(cfg.drafter_vocab, [*drafter_prompt, *eos_ids])
        d0 = settle(prefill(drafter, drafter_prompt, before))
        st.drafter_prefill_s = own_clock() - t0
        st.drafter_prefilled = True
        return d0

    try:  # budgets apply to both prefills
        t0 = own_clock()
        z0 = settle(prefill(target, target_prompt, before))  # [vocab]
        rows = z0.shape[-1]
        st.target_prefill_s = own_clock() - t0
        st.prefilled = True
        # with transfer the drafter's q shapes the first token; without, the first token is
        # the target's own and comes before the drafter reads its prompt (which it may never
        # need: an end token first, one token asked for, a budget)
        q0 = None if cfg.lossless else draft_dist(drafter_prefill())[None]
    except Stopped as stop:
        return finish(stop.reason)
    if q0 is not None:
        t_start = time.perf_counter()

    # First token: from the transfer distribution at the prompt's last position.
    _, p_hat0 = transfer_distribution(z0[None], q0 if q0 is not None else z0[None], cfg, sampler)
    first = int(p_hat0[0].argmax()) if greedy else sampler.pick(p_hat0[0], generator)
    generated.append(first)
    yield [Token(first, token_logprob(z0, first), "target")]
    if t_start is None:  # lossless: the drafter's prefill, if a draft can follow
        # (room for a draft token and the target's token after it: two tokens asked for
        # end with the target's own second one, as the loop's last round does)
        if first not in eos_ids and len(generated) + 1 < max_new_tokens:
            try:
                drafter_prefill()
            except Stopped as stop:
                return finish(stop.reason)
        t_start = time.perf_counter()  # decode_s: the tokens after the first, as with transfer
    # adaptive: within max_gamma from the start (a success took a gamma of 100 down to 16)
    gamma = cfg.first_gamma
    while True:
        last = generated[-1]
        if last in eos_ids:
            return finish("stop")
        if len(generated) >= max_new_tokens:
            return finish("length")
        if should_stop is not None and (reason := should_stop(len(generated))):
            return finish(reason)
        room = max_new_tokens - len(generated) - 1
        # --- draft: up to gamma tokens, keeping q at every position (+1 for the bonus) ----
        drafts: list[int] = []
        q_rows: list[torch.Tensor] = []
        if cfg.lossless and room == 0:
            # the last token: nothing to draft, and without transfer no drafter q is read
            q_rows.append(z0.new_zeros(1))
        else:
            # the drafter catches up on what it has not read: the newest token, and the previous
            # round's last draft token when it skipped it (below)
            d_logits = drafter.extend(generated[len(drafter) - len(drafter_prompt) :])[-1]
            st.drafter_passes += 1
            while True:
                q = draft_dist(d_logits)
                q_rows.append(q)
                if len(drafts) >= min(gamma, room):
                    break
                if drafts and should_stop is not None and should_stop(len(generated)):
                    break  # a long draft (a large gamma) ends at the budget too: verify it
                if (
                    drafts
                    and cfg.min_draft_confidence > 0
                    and float(q.max()) < cfg.min_draft_confidence
                ):
                    st.unsure_stops += 1
                    break
                d = sampler.pick(q, generator)
                drafts.append(d)
                if d in eos_ids:
                    q_rows.append(q)  # no bonus after EOS; keeps rows aligned with target rows
                    break
                if cfg.lossless and len(drafts) >= min(gamma, room):
                    # the drafter's q after its last token only shapes the transfer
                    # distribution of the bonus position; without transfer it is never read,
                    # so that drafter pass is not paid (the placeholder row keeps rows aligned)
                    q_rows.append(q)
                    break
                d_logits = drafter.extend([d])[-1]
                st.drafter_passes += 1
        st.draft_tokens += len(drafts)
        # --- verify: one target pass over [last, d_1..d_g] ---------------------------------
        z = target.extend([last, *drafts])  # [g + 1, vocab]
        st.steps += 1
        q_all = torch.stack(q_rows[: len(drafts) + 1])  # [g + 1, vocab]
        p, p_hat = transfer_distribution(z, q_all, cfg, sampler)
        step: list[Token] = []
        hit_eos = False
        n_acc = 0
        for i, d in enumerate(drafts):
            if greedy:
                ok = int(p_hat[i].argmax()) == d
            else:
                u = float(torch.rand((), generator=generator, device=p.device))
                ok = u * float(q_all[i, d]) < float(p_hat[i, d])  # p_hat 0: never, even at u = 0
            if not ok:
                if greedy:
                    nxt = int(p_hat[i].argmax())
                else:
                    if cfg.transfer == "mixture":
                        resid = (p_hat[i] - q_all[i]).clamp_min(0)
                    else:
                        resid = torch.maximum(p[i] - q_all[i], p[i] - p_hat[i]).clamp_min(0)
                    total = resid.sum()
                    resid = resid / total if total > 0 else p_hat[i]
                    nxt = sampler.pick(resid, generator)
                step.append(Token(nxt, token_logprob(z[i], nxt), "target"))
                gamma = max(1, gamma - 1) if cfg.adaptive_gamma else gamma
                break
            n_acc += 1
            step.append(Token(d, token_logprob(z[i], d), "drafter"))
            if d in eos_ids:
                hit_eos = True
                break
        else:  # all accepted: bonus token from the last position
            row = p_hat[len(drafts)]
            nxt = int(row.argmax()) if greedy else sampler.pick(row, generator)
            step.append(Token(nxt, token_logprob(z[len(drafts)], nxt), "target"))
            if cfg.adaptive_gamma and drafts:
                gamma = min(cfg.max_gamma, gamma + 1)
        st.accepted_tokens += n_acc
        generated.extend(t.id for t in step)
        keep = len(generated) - (0 if hit_eos else 1)  # the newest token is fed next step
        target.crop(len(target_prompt) + keep)
        drafter.crop(min(len(drafter), len(drafter_prompt) + keep))
        yield step
