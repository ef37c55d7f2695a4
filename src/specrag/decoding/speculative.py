"""Decoding verified against deterministic candidates (speculative decoding, one-hot drafts).

Each step feeds ``[last_token, c_1..c_k]`` to the model in ONE forward pass, giving the model's
distribution ``p_i`` at every candidate position. Candidate ``c_i`` is accepted

* greedy: iff ``c_i == argmax p_i`` - so the output is token-identical to plain greedy decoding;
* sampling: with probability ``min(1, p_i(c_i) / q_i(c_i))``; on rejection the replacement is
  drawn from ``normalize((p_i - q_i)+)`` - the standard speculative-sampling rule, so every
  emitted token is distributed as ``p`` (lossless). ``q_i`` is the proposing model's
  distribution (a drafter model); deterministic candidates (n-grams) have a one-hot
  ``q = e_c``: accepted with probability ``p_i(c_i)``, replacement from ``p_i`` without ``c_i``.

After the accepted prefix the model's own next token (the correction, or a bonus token when all
were accepted) is emitted, so every pass emits >= 1 token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from specrag.decoding.candidates import Proposal, Proposer
from specrag.decoding.clock import own_clock
from specrag.decoding.sampling import Sampler
from specrag.decoding.state import LMState, Stopped, settle, shared_prefix


@dataclass
class Token:
    """One emitted token: id, its log-probability under the model, and where it came from."""

    id: int
    logprob: float
    source: str  # "model", or the candidate source it was accepted from ("draft", "prompt")


@dataclass
class DecodeStats:
    """Counters of one decode, reported in metadata and benchmarks."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    forward_passes: int = 0  # passes after prefill (each emits >= 1 token)
    proposed: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # decode_s less the turns other decodes took between this one's steps (and lent calls):
    # the time this decode's own work took, what decode_speedup_vs_plain divides by
    decode_own_s: float = 0.0
    # tokens the prefill pass gave: the model's first and the draft opening's it verified;
    # ``decode_s`` (timed after that pass) made none of them
    first_step_tokens: int = 0
    finish_reason: str = ""
    plain_steps: int = 0  # passes with no candidate: plain decode steps, timed
    plain_step_s: float = 0.0  # their total time
    widest: int = 0  # the most candidates one pass verified
    cache_refills: int = 0  # crops done by re-reading the answer's context (LMState.refills)
    cache_restores: int = 0  # crops done from a snapshot of its states (LMState.restores)
    prompt_cut: int = 0  # tokens cut from the prompt's middle to fit the model's context
    answer_cap: int = 0  # new tokens the answer was capped at to fit the context (0: not)
    # an incremental decode (:mod:`specrag.decoding.incremental`): the final answer's tokens
    # by source, and one record per prompt rebuild
    sources: dict[str, int] | None = None
    rebuilds: list[dict[str, float | int]] = field(default_factory=list)
    segment: DecodeStats | None = None  # the segment being decoded (its counters are live)
    started: float = field(default_factory=time.perf_counter)  # wall clock (rebuilds' at_s)

    def count(self, source: str, candidates: int, accepted: int, hit_eos: bool) -> None:
        """Count one verified proposal of ``candidates`` tokens from ``source``.

        Candidates after an accepted end token were never judged: not counted as proposed.
        """
        judged = accepted if hit_eos else candidates
        self.proposed[source] = self.proposed.get(source, 0) + judged
        self.widest = max(self.widest, candidates)
        if accepted:
            self.accepted[source] = self.accepted.get(source, 0) + accepted

    def tokens_from(self) -> dict[str, int]:
        """Output tokens by where they came from; ``target`` = the verifier's own tokens."""
        names = {"prompt": "evidence", "model": "target"}  # prompt n-grams: the evidence text
        if self.sources is not None:
            return {names.get(k, k): v for k, v in self.sources.items()}
        out = {names.get(k, k): v for k, v in self.accepted.items()}
        out["target"] = self.new_tokens - sum(self.accepted.values())
        return out

    @property
    def passes_per_token(self) -> float:
        """Forward passes per output token (1.0 for plain decoding)."""
        # the first token comes from the prefill pass
        return (self.forward_passes + 1) / self.new_tokens if self.new_tokens else 0.0

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly summary."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "forward_passes": self.forward_passes + (1 if self.new_tokens else 0),
            "passes_per_token": round(self.passes_per_token, 4),
            "candidates_proposed": dict(self.proposed),
            "candidates_accepted": dict(self.accepted),
            "widest_proposal": self.widest,
            "tokens_from": self.tokens_from(),
            "prefill_s": round(self.prefill_s, 4),
            "decode_s": round(self.decode_s, 4),
            "decode_own_s": round(self.decode_own_s, 4),
            **({"first_step_tokens": self.first_step_tokens} if self.first_step_tokens else {}),
            "finish_reason": self.finish_reason,
            **({"cache_refills": self.cache_refills} if self.cache_refills else {}),
            **({"cache_restores": self.cache_restores} if self.cache_restores else {}),
            **({"rebuilds": list(self.rebuilds)} if self.rebuilds else {}),
            **({"prompt_cut": self.prompt_cut} if self.prompt_cut else {}),
            **({"answer_cap": self.answer_cap} if self.answer_cap else {}),
        }


def prefill(
    lm: LMState, prompt: list[int], should_stop: Callable[[], str | None] | None = None
) -> torch.Tensor:
    """Make ``lm`` hold ``prompt[:-1]`` ... ``prompt`` and return next-token logits ``[vocab]``.

    Reuses whatever prefix of ``prompt`` the cache already holds (prefix caching). A long
    prefill checks ``should_stop`` between slices and raises :class:`Stopped` when told to.
    """
    return prefill_verify(lm, prompt, [], should_stop)[-1]


def prefill_verify(
    lm: LMState,
    prompt: list[int],
    prior: list[int],
    should_stop: Callable[[], str | None] | None = None,
) -> torch.Tensor:
    """Prefill ``prompt`` and feed ``prior`` after it in the same pass.

    Returns logits ``[1 + len(prior), vocab]``: row ``i`` predicts ``prior[i]`` (the last row,
    the token after all of ``prior``), so ``prior`` - an answer decoded under an earlier
    prompt - is verified against this prompt as speculative candidates. The cached prefix the
    two prompts share is reused.
    """
    if not prompt:
        raise ValueError("cannot decode from an empty prompt")
    # one crop to the shared prefix, or before the last position when the whole prompt is
    # cached (its logits are recomputed): a cache that cannot crop may re-read, and does so
    # once, under the budget too
    lm.crop(min(shared_prefix(lm.tokens, prompt), len(prompt) - 1), should_stop)
    ids = prompt[len(lm) :] + list(prior)
    return lm.extend(ids, all_logits=False, keep=len(prior) + 1, should_stop=should_stop)


def prefill_stop(
    should_stop: Callable[[int], str | None] | None,
) -> Callable[[], str | None] | None:
    """The stop check for a prefill: no token has been generated yet."""
    if should_stop is None:
        return None
    return lambda: should_stop(0)


@dataclass
class Revise:
    """Yielded by :func:`decode` with ``prior``: keep only the first ``keep`` answer tokens.

    The tokens after them, decoded under an earlier prompt, are not what this prompt's model
    would emit: they are retracted, and the tokens yielded next replace them.
    """

    keep: int
    dropped: int


Step = list[Token] | Revise


def _verify(
    logits_all: torch.Tensor,
    cands: list[int],
    source: str,
    q: torch.Tensor | None,
    sampler: Sampler,
    generator: torch.Generator | None,
    eos_ids: tuple[int, ...],
) -> tuple[list[Token], int, bool]:
    """Accept a prefix of ``cands`` against ``logits_all`` ``[1 + len(cands), vocab]``.

    Returns the emitted tokens (the accepted candidates, then the model's correction or bonus
    token unless an accepted candidate was an end-of-sequence token), how many candidates were
    accepted, and whether an end-of-sequence candidate ended the step.
    """
    step: list[Token] = []
    logp_all = torch.log_softmax(logits_all, dim=-1)  # [1 + len(cands), vocab]
    best = logits_all.argmax(dim=-1).tolist() if sampler.greedy else []
    for i, cand in enumerate(cands):
        if sampler.greedy:
            ok = best[i] == cand
        else:
            probs = sampler.probs(logits_all[i])
            u = torch.rand((), generator=generator, device=probs.device)
            q_c = float(q[i, cand]) if q is not None else 1.0
            ok = bool(u * q_c < probs[cand])  # u < p(c) / q(c)
        if not ok:  # the model's correction replaces the first rejected candidate
            if sampler.greedy:
                nxt = best[i]
            else:
                if q is not None:
                    residual = (probs - q[i].to(probs.device)).clamp_min(0.0)
                else:
                    residual = probs.clone()
                    residual[cand] = 0.0
                total = residual.sum()
                nxt = sampler.pick(residual / total if total > 0 else probs, generator)
            step.append(Token(nxt, float(logp_all[i, nxt]), "model"))
            return step, i, False
        step.append(Token(cand, float(logp_all[i, cand]), source))
        if cand in eos_ids:
            return step, i + 1, True
    # every candidate accepted (or none proposed): the model adds its own next token
    row = len(cands)
    nxt = best[row] if sampler.greedy else sampler.pick(sampler.probs(logits_all[row]), generator)
    step.append(Token(nxt, float(logp_all[row, nxt]), "model"))
    return step, len(cands), False


def decode(
    lm: LMState,
    prompt: list[int],
    *,
    max_new_tokens: int,
    sampler: Sampler,
    eos_ids: tuple[int, ...] = (),
    proposer: Proposer | None = None,
    max_candidates: int = 8,
    shrink_k: bool = True,
    should_stop: Callable[[int], str | None] | None = None,
    generator: torch.Generator | None = None,
    stats: DecodeStats | None = None,
    prior: list[Token] | None = None,
    opening: list[int] | None = None,
) -> Iterator[Step]:
    """Yield the tokens accepted at each step (a list per forward pass).

    ``max_candidates``: candidates per pass at most; with ``shrink_k`` the next proposal may
    have one fewer after a rejection and two more after a full acceptance (a pass over many
    candidates costs more than a step on CPU cores in fp32); without, always up to
    ``max_candidates`` (where a wide pass costs about one step, a rejected candidate costs
    nothing).

    ``should_stop(n_generated)`` is checked between steps; a non-empty string it returns ends
    the decode with that ``finish_reason`` (time budget, "retrieval finished", cancellation).

    ``prior``: an answer already shown, decoded under an earlier prompt. Its tokens are
    verified as candidates in the prefill pass (deterministic proposals, so the output is
    still exactly this prompt's decode); the agreed prefix is kept (not yielded again), and a
    :class:`Revise` is yielded first when some of it is rejected.

    ``opening``: candidates for the answer's first tokens (a draft's start), verified in the
    prefill pass too (deterministic proposals, source ``"draft"``): where they are right the
    answer's first tokens cost no step of their own. Not with ``prior``, which takes that place.
    """
    stats = stats if stats is not None else DecodeStats()
    stats.prompt_tokens = len(prompt)
    t0 = own_clock()
    t1 = t0
    prior = prior or []
    before = [t.id for t in prior][:max_new_tokens]
    # room for the model's own token after them; none at all with a prior to verify
    opened = [] if prior else list(opening or [])[: max(0, max_new_tokens - 1)]
    generated: list[int] = []
    k = max_candidates
    own = {"start": 0.0, "away": 0.0}  # decoding's own clock: its start, the time at yields

    def finish(reason: str, decoded: bool = True) -> None:
        stats.finish_reason = reason
        stats.new_tokens = len(generated)
        stats.cache_refills, stats.cache_restores = lm.refills, lm.restores
        if not decoded:  # decoding never began (its clocks never started): no decode time
            stats.decode_s = stats.decode_own_s = 0.0
            return
        stats.decode_s = time.perf_counter() - t1  # wall: it spans turns
        stats.decode_own_s = own_clock() - own["start"] - own["away"]

    if max_new_tokens <= 0:  # nothing to decode: no pass runs, what was shown goes
        if prior:
            yield Revise(keep=0, dropped=len(prior))
        return finish("length", decoded=False)
    try:  # budgets apply to prefill too: a long prompt stops between prefill slices
        logits_all = settle(prefill_verify(lm, prompt, before or opened, prefill_stop(should_stop)))
    except Stopped as stop:
        stats.prefill_s = own_clock() - t0
        if before:  # nothing was verified: what was shown stays as it is ...
            generated.extend(before)
        if len(prior) > len(before):  # ... up to a lower max_new_tokens than before
            yield Revise(keep=len(before), dropped=len(prior) - len(before))
        return finish(stop.reason, decoded=False)  # prefill's time only
    stats.prefill_s = own_clock() - t0
    t1 = time.perf_counter()
    own["start"] = own_clock()

    cands, source = (opened, "draft") if opened else (before, "kept")
    first, n_accepted, hit_eos = _verify(
        logits_all, cands, source, None, sampler, generator, eos_ids
    )
    n_kept = 0 if opened else n_accepted
    if opened:
        stats.count("draft", len(opened), n_accepted, hit_eos)
    if before:
        stats.proposed["kept"] = len(before)
        stats.accepted["kept"] = n_kept
        first = [*prior[:n_kept], *first[n_kept:]]  # kept tokens keep their source
        first = first[:max_new_tokens]  # all kept at the length limit: no bonus token
    generated.extend(t.id for t in first)
    stats.first_step_tokens = len(generated)
    lm.crop(len(prompt) + len(generated) - (0 if hit_eos else 1))
    if n_kept < len(prior):  # rejected, or past a lower max_new_tokens than before
        at = own_clock()
        yield Revise(keep=n_kept, dropped=len(prior) - n_kept)
        own["away"] += own_clock() - at
    if first[n_kept:]:
        at = own_clock()
        yield first[n_kept:]
        own["away"] += own_clock() - at
    last = generated[-1]
    while True:
        if last in eos_ids:
            return finish("stop")
        if len(generated) >= max_new_tokens:
            return finish("length")
        if should_stop is not None and (reason := should_stop(len(generated))):
            return finish(reason)
        room = max_new_tokens - len(generated) - 1  # keep room for the model's own token
        out = proposer.propose(generated, min(k, room)) if proposer and room > 0 else ([], "")
        prop = out if isinstance(out, Proposal) else Proposal(*out)
        cands, source, q = prop.tokens, prop.source, prop.q
        # a proposer that spent the budget (a drafter reading its prompt) proposes nothing
        if not cands and should_stop is not None and (reason := should_stop(len(generated))):
            return finish(reason)
        t_pass = own_clock()
        logits_all = lm.extend([last, *cands])  # [1 + len(cands), vocab]
        step, n_accepted, hit_eos = _verify(
            logits_all, cands, source, q, sampler, generator, eos_ids
        )
        # the cache holds prompt + generated + ``last`` + candidates; keep only what was
        # accepted (the newly emitted model token is fed at the next step). Timed with the
        # pass, after verifying (reading the logits waits for the device: CUDA is async):
        # a cache that cannot crop re-reads what was accepted, a pass of its own, paid for
        # rejections only - the pay check must see it.
        generated.extend(t.id for t in step)
        lm.crop(len(prompt) + len(generated) - (0 if hit_eos else 1))
        pass_s = own_clock() - t_pass
        stats.forward_passes += 1
        if not cands:
            stats.plain_steps += 1
            stats.plain_step_s += pass_s
        else:
            stats.count(source, len(cands), n_accepted, hit_eos)
        if observe := getattr(proposer, "observe", None):  # a proposer that weighs its costs
            observe(len(cands), len(step), pass_s)
        if cands and shrink_k:
            k = min(k + 2, max_candidates) if n_accepted == len(cands) else max(1, k - 1)
        last = generated[-1]
        at = own_clock()
        yield step  # other decodes' turns may run before the next step: not this one's time
        own["away"] += own_clock() - at
