"""A drafter model as a proposer, and the merged proposer of the answer (drafter + n-grams).

After retrieval the drafter reads the SAME prompt as the target (serial RAG's prompt: evidence
and question) from its own KV cache and proposes the next tokens; the target verifies them in
one pass (:func:`specrag.decoding.speculative.decode`). :class:`MergedProposer` picks, per
step, one of three sources:

* a strong n-gram match (:attr:`NgramProposer.strong`: 3 tokens) in the pre-retrieval draft
  or in the evidence: free to propose and, measured on grounded answers, the most often
  accepted;
* otherwise the drafter model, when the cost model lets it run (see :class:`DrafterPolicy`:
  it joins once the answer has run long enough to repay its prefill, proposes with its own
  adaptive length, and stops if its tokens are rarely accepted);
* otherwise a weaker n-gram match (2 tokens), or nothing (plain decoding).

Every choice depends on the tokens decoded so far and on measured times, never on the
target's own random draws, so greedy output stays identical to the target alone and sampled
output keeps the target's distribution (drafter proposals carry their ``q``; n-gram proposals
are one-hot). Because the cost model reads the clock, a seeded sampled answer with a drafter
configured is exact in distribution but not reproducible draw for draw.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specrag.decoding.candidates import NgramProposer, Proposal
from specrag.decoding.clock import own_clock
from specrag.decoding.sampling import Sampler
from specrag.decoding.state import LMState, Stopped, sync
from specrag.decoding.vocab import fit_rows

NARROW = (1, 2, 3)  # candidates per narrow verify pass measured against a wide one
CHEAP_WIDTHS = (3, 7, 11)  # the same, where a wide pass costs little more than a step


def narrow_cap(ratios: dict[int, float], acceptance: float) -> int:
    """Candidates per pass for proposals accepted at ``acceptance`` per token, 0 for no cap.

    ``ratios`` maps candidates per pass to the measured cost of that verify pass (candidates
    + 1 tokens) over a single-token step; the widest entry stands for uncapped proposals.
    Picks the entry with the most expected tokens per unit of pass cost - ``1 + a + ... +
    a^c`` over the ratio (the drafter's own steps, ~0.4x each on the pair, tip it further
    toward narrow). fp32 on 2 CPU cores is a staircase (the 1.5B: 2 candidates 1.17x a step,
    3 candidates 1.92x, 16 2.84x; SmolLM2 1.12x / 1.48x / 2.04x): 2 candidates win at 0.7.
    """
    widest = max(ratios)

    def rate(c: int) -> float:
        return sum(acceptance**i for i in range(c + 1)) / max(ratios[c], 1e-9)

    best = max(sorted(ratios), key=rate)
    return 0 if best == widest else best


@dataclass(frozen=True)
class PairCosts:
    """A drafter's measured costs as fractions of its target's.

    Measured by :func:`specrag.models.loading.pair_costs`.
    """

    step: float  # one single-token decode step
    prefill: float  # one prefill pass over the same block of prompt tokens


@dataclass
class PaidPrefills:
    """The drafter's prefill time over the target's, as paid by the answers that joined it.

    The join rule's estimate of the drafter's prefill starts from :attr:`PairCosts.prefill`,
    measured at load on a 64-token block. Real prompts are longer, and there the drafter's
    share is larger: on the pair (int8 0.5B beside the fp32 1.5B, 2 AMD EPYC cores,
    2026-12-04) the drafter's real prefills of 600-960-token prompts took 1.2-1.6x the
    estimate, so the drafter joined answers too early to repay it. One instance per pair and
    machine (:func:`specrag.models.loading.paid_prefills`, which hands each update to
    ``saved`` to keep between processes) keeps the ratio of each prefill the drafter paid when
    it joined (``window`` latest); once it holds any, :meth:`ratio` is their mean, else the
    ratio measured at load. A join booked here compares like with like: the
    drafter's first prefill of an answer against the target's prefill of as many tokens of the
    same prompt (the target's time x the drafter's share of its prompt tokens: a drafter may
    read fewer evidence blocks; :class:`MergedProposer`) (an
    incremental answer's later prompts, where the target re-reads only a changed tail, book
    nothing).
    """

    window: int = 16
    paid: deque[float] = field(default_factory=deque)
    saved: Callable[[list[float]], None] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.paid = deque(self.paid, maxlen=self.window)

    def add(self, drafter_s: float, target_s: float) -> None:
        """Book one join: the drafter's prefill took ``drafter_s``, the target's ``target_s``."""
        if drafter_s > 0 and target_s > 0:
            self.paid.append(drafter_s / target_s)
            if self.saved is not None:
                self.saved(list(self.paid))

    def ratio(self, measured: float) -> tuple[float, str]:
        """The prefill ratio to estimate with (``measured``: at load), and where it is from."""
        if not self.paid:
            return measured, "as measured at load"
        n = len(self.paid)
        return sum(self.paid) / n, f"as paid in {n} earlier join{'s' if n > 1 else ''}"


@dataclass
class DrafterStats:
    """What the drafter did in one decode."""

    passes: int = 0  # drafter forward calls (catch-up feeds and prefill slices included)
    proposed: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0  # time in drafter calls, prefill included
    unsure_stops: int = 0  # proposals ended early at a token the drafter gave < min_confidence
    vocab_rows: int = 0  # output rows the drafter scores (0: all; see specrag.decoding.vocab)
    cache_refills: int = 0  # crops done by re-reading its context (LMState.refills)
    cache_restores: int = 0  # crops done from a snapshot of its states (LMState.restores)

    def as_dict(self) -> dict[str, float | int]:
        """JSON-friendly summary."""
        return {
            "drafter_passes": self.passes,
            "drafter_proposed": self.proposed,
            "drafter_prefill_tokens": self.prefill_tokens,
            "drafter_prefill_s": round(self.prefill_s, 4),
            "drafter_s": round(self.draft_s, 4),
            "drafter_unsure_stops": self.unsure_stops,
            "drafter_vocab_rows": self.vocab_rows,
            **({"drafter_cache_refills": self.cache_refills} if self.cache_refills else {}),
            **({"drafter_cache_restores": self.cache_restores} if self.cache_restores else {}),
        }


class DrafterProposer:
    """Proposes up to ``k`` tokens with a drafter model that reads ``prompt`` + what was decoded.

    The drafter's cache is kept in step lazily: at each call it is cropped to the longest
    prefix it shares with ``prompt + generated`` and the missing tokens are fed in one pass.
    """

    def __init__(
        self,
        drafter: LMState,
        prompt: list[int],
        sampler: Sampler,
        generator: torch.Generator | None = None,
        vocab: int | None = None,
        usable: int | None = None,
        eos_ids: tuple[int, ...] = (),
        vocab_first: int = 0,
        should_stop: Callable[[], str | None] | None = None,
    ) -> None:
        """A proposer over ``drafter`` reading ``prompt``.

        ``vocab_first`` > 0: the drafter scores only the first ``vocab_first`` token ids plus
        its prompt's ids and the end tokens (:mod:`specrag.decoding.vocab`), from its first
        proposal on (a drafter that never joins does not pay for the subset's copy).
        ``should_stop``: asked between the slices of the drafter's reading of its prompt (its
        first one, and new evidence after an incremental rebuild); told to stop, it proposes
        nothing (a 4,000-token prompt's reading ran 0.76 s past the answer budget).
        """
        self.should_stop = should_stop
        self.lm = drafter
        self.eos_ids = eos_ids  # a proposal ends at an end token: nothing follows it
        self.prompt = prompt
        self.sampler = sampler
        self.generator = generator
        self.stats = DrafterStats()
        self.vocab_first = vocab_first
        self._restricted = False
        # The target's output size and the tokens the shared tokenizer really has: models of
        # one family pad their output layers differently (Qwen2.5 0.5B: 151,936 rows, 7B:
        # 152,064); q is laid out on the target's rows, padding rows never proposed.
        self.vocab = vocab
        self.usable = usable

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """The drafter's logits ``[vocab_d]`` on the target's rows ``[vocab]``, in fp32."""
        return fit_rows(logits, self.vocab, self.usable)

    @torch.inference_mode()
    def propose(self, generated: list[int], k: int, min_confidence: float = 0.0) -> Proposal:
        """The drafter's next ``k`` tokens and its distribution at each.

        ``min_confidence``: the proposal ends early, after the first token the drafter itself
        gives a probability below this (its untempered softmax; the token is still proposed):
        where the drafter is unsure it is often wrong, and on CPU every extra candidate widens
        the target's verify pass. The rule reads only the drafter's own state, so the target's
        output (greedy) and distribution (sampled) are unchanged.
        """
        if k <= 0:  # no room for a candidate: no drafter step either
            return Proposal([], "drafter")
        t0 = own_clock()
        if self.vocab_first and not self._restricted:
            self.stats.vocab_rows = self.lm.restrict(
                self.vocab_first, self.prompt + [*self.eos_ids]
            )
            self._restricted = True
        context = self.prompt + generated
        try:
            self.lm.sync(context, self.should_stop)
            if len(self.lm) == len(context):  # fully cached: recompute the last position
                self.lm.crop(len(context) - 1)
            first_fill = len(self.lm) < len(self.prompt)
            missing = context[len(self.lm) :]
            last = self.lm.extend(missing, all_logits=False, should_stop=self.should_stop)[-1]
        except Stopped:  # what it read stays cached: a later call goes on from there
            self.stats.passes = self.lm.forward_passes
            self.stats.draft_s += own_clock() - t0
            return Proposal([], "drafter")
        logits = self._fit(last)
        if first_fill:
            sync(self.lm.device)  # a GPU runs ahead of the clock
            self.stats.prefill_tokens += len(missing)
            self.stats.prefill_s += own_clock() - t0
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        while True:
            q = self.sampler.probs(logits)  # one-hot argmax when greedy
            token = self.sampler.pick(q, self.generator)
            tokens.append(token)
            rows.append(q)
            if len(tokens) >= k or token in self.eos_ids:
                break
            if min_confidence > 0 and float(torch.softmax(logits.float(), -1)[token]) < (
                min_confidence
            ):
                self.stats.unsure_stops += 1
                break
            logits = self._fit(self.lm.extend([token])[-1])
        self.stats.passes = self.lm.forward_passes  # the drafter's own counter (slices included)
        self.stats.cache_refills, self.stats.cache_restores = self.lm.refills, self.lm.restores
        self.stats.proposed += len(tokens)
        self.stats.draft_s += own_clock() - t0
        return Proposal(tokens, "drafter", None if self.sampler.greedy else torch.stack(rows))


@dataclass(frozen=True)
class DrafterPolicy:
    """When the drafter model proposes (the cost model), from times measured in the run.

    * ``max_cost_ratio``: a drafter whose single-token step costs more than this fraction of
      the target's is never used (a same-size drafter saves no time: every rejected token
      costs a drafter step on top of the target's pass);
    * joining (ski rental): the drafter's prefill of the prompt costs about its prefill
      ratio x the target's prefill of it (not its step ratio: a bf16 drafter beside an fp32
      target on cores with AMX steps at ~0.4x but prefills at ~0.1x; the ratio its earlier
      joins paid, else the one measured at load: :class:`PaidPrefills`), paid once, and only
      repaid over the tokens still to come.
      The drafter joins once the answer has decoded for ``join_factor x`` that estimated
      prefill time (and has at least ``after_tokens`` tokens): a terse answer ("1969") ends
      before it, a long one pays the prefill when most of it is still ahead. On a GPU the
      prefill costs milliseconds and the drafter joins at once;
    * ``min_acceptance``: after ``probe_steps`` drafter proposals, a drafter whose tokens are
      accepted less often than this stops proposing for the rest of the answer;
    * ``pay_check``: after ``probe_steps`` rounds of a source (the drafter, or n-gram matches
      that are not :attr:`NgramProposer.strong`), the source stops if its rounds cost more time
      per emitted token (its verify passes, plus the drafter's own steps) than a plain step of
      the target, all measured in this decode (the first round of each kind not judged; no
      verdict before two plain steps are timed, unless the proposer is given a plain step
      time). Acceptance alone does not decide it: on 2 CPU cores one verify pass of the 1.5B
      over 5 tokens cost 1.9x a single-token step and over 8 tokens 2.7x
      (benchmarks/verify_cost.py, 2026-11-30), so a drafter at 0.39x the target's step needs
      ~80% acceptance at k=4 to pay there; on a GPU wide passes cost about one step;
    * ``k``: the drafter's own proposal length, from ``start_k``: +1 after a fully accepted
      proposal, -1 after a rejection (its steps cost time; n-gram candidates are free);
    * ``min_confidence``: a proposal ends after the first token the drafter gives a probability
      below this. Measured on the pair (benchmarks/drafter_confidence.py, 2026-11-30: 801
      positions of ten "explain" answers of the 1.5B, teacher-forced): the 0.5B's argmax was
      the 1.5B's at 0.998 of the positions where it gave >= 0.9 (66% of them), 0.83-0.89 at
      0.6-0.9, 0.46-0.61 at 0.2-0.6. Replaying those answers priced with the measured costs
      (drafter step 0.38x, verify passes from benchmarks/verify_cost.py), this proposer's rule
      emits 1.25 tokens per plain-step cost with a 0.7 cut-off against 1.05 without one.
    """

    max_cost_ratio: float = 0.5
    after_tokens: int = 8
    join_factor: float = 2.0
    min_acceptance: float = 0.25
    probe_steps: int = 4
    pay_check: bool = True
    start_k: int = 4
    max_k: int = 8
    min_confidence: float = 0.7

    def decide(self, ratio: float) -> tuple[bool, str]:
        """Whether a drafter whose step costs ``ratio`` x the target's may propose, and why."""
        if ratio > self.max_cost_ratio:
            return False, (
                f"drafter step costs {ratio:.2f}x the target's (> {self.max_cost_ratio}): "
                "it would not save time"
            )
        return True, (
            f"drafter step costs {ratio:.2f}x the target's (<= {self.max_cost_ratio}); it "
            f"joins once decoding has taken {self.join_factor}x its estimated prefill"
        )

    def pays(self, seconds: float, tokens: int, plain_step_s: float) -> bool:
        """Whether rounds that took ``seconds`` to emit ``tokens`` beat plain steps."""
        return plain_step_s <= 0 or seconds <= plain_step_s * tokens


@dataclass
class Ledger:
    """Time and output of the decode steps one kind of proposal led to.

    The first round of each kind is kept apart (``first_*``) and not judged: on CPU the first
    pass at a new width, or the drafter's first step after its prefill, pays one-off set-up.
    """

    rounds: int = 0
    tokens: int = 0
    seconds: float = 0.0
    first_tokens: int = 0
    first_s: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        """Book one round."""
        if self.rounds == 0:
            self.first_tokens, self.first_s = tokens, seconds
        self.rounds += 1
        self.tokens += tokens
        self.seconds += seconds

    @property
    def judged(self) -> tuple[int, int, float]:
        """``(rounds, tokens, seconds)`` after the first round."""
        return self.rounds - 1, self.tokens - self.first_tokens, self.seconds - self.first_s

    def per_token(self) -> float:
        """Seconds per emitted token after the first round (0 before any)."""
        _, tokens, seconds = self.judged
        return seconds / tokens if tokens > 0 else 0.0


@dataclass
class MergedProposer:
    """Per step: a strong n-gram match, else the drafter (once joined), else a weak match.

    With ``ngrams_first`` (set where a wide verify pass costs about one step, so a rejected
    n-gram candidate costs nothing), an n-gram match of any length comes before the drafter,
    whose own steps cost time, and where neither proposes a match of one token does. With
    ``single_matches`` (set where a pass at the narrow width costs about one step, so a round
    that would be a plain step loses nothing by verifying a few candidates) a match of one
    token is proposed too where nothing else proposes, the drafter still coming first. With
    ``narrow`` (set where a verify pass over a few more tokens costs about twice a step:
    :func:`narrow_cap`) a drafter proposal has at most ``narrow`` tokens.

    ``prefill_s`` (the target's prefill time in this run, known after the first token) times
    the drafter's prefill ratio estimates the drafter's prefill of the whole prompt: the
    ratio, per prompt token, its earlier joins
    paid (``paid``, shared by the pair's answers: :class:`PaidPrefills`; with ``book_paid`` a
    join this proposer makes adds its own), else ``costs.prefill`` (measured at load on one block of
    tokens: :func:`specrag.models.loading.pair_costs`). The join waits for that whole-prompt
    estimate even where the drafter reads less (``prompt_share`` < 1: fewer evidence blocks):
    the wait tells a long answer from a terse one, and on terse answers the drafter's rounds do
    not repay even a small prefill (HotpotQA, 2026-12-05: a wait scaled by the share let it
    join 9 of 10 answers of 16-64 tokens, decode 1.34x HF prompt lookup's, against none and
    1.05x; ``docs/bench/2026-12-05-rag-pair-hotpot-top-block/``); the ratio it books is per
    prompt token (its prefill over the target's x ``prompt_share``). ``events`` records when
    and why the drafter joined or stopped. The decode loop reports every pass to :meth:`observe`;
    ``ledgers`` hold, per kind of step (``drafter``, ``strong``/``weak`` n-gram, ``plain``),
    its rounds, emitted tokens and seconds - what the pay check compares (``plain_step_s``:
    the target's step measured at load, the baseline until this decode has timed a plain step
    of its own).
    """

    ngrams: NgramProposer
    drafter: DrafterProposer | None = None
    policy: DrafterPolicy = field(default_factory=DrafterPolicy)
    costs: PairCosts = PairCosts(step=0.0, prefill=0.0)
    prefill_s: Callable[[], float] = lambda: 0.0
    prompt_share: float = 1.0
    paid: PaidPrefills = field(default_factory=PaidPrefills)  # default: this proposer's own
    book_paid: bool = True  # a join here adds its prefill ratio to ``paid``
    plain_step_s: float = 0.0
    ngrams_first: bool = False
    single_matches: bool = False
    narrow: int = 0
    choices: dict[str, int] = field(default_factory=dict)  # steps per chosen source
    events: list[str] = field(default_factory=list)
    ledgers: dict[str, Ledger] = field(default_factory=dict)
    _kind: str = "plain"  # the kind of the latest proposal
    _drafter_s: float = 0.0  # the drafter's own time in the latest proposal
    _weak_off: bool = False
    _started: float | None = None
    _joined: bool = False
    _book_prefill: bool = False  # joined here: its first proposal's prefill goes to ``paid``
    _stopped: bool = False
    _k: int = 0
    _last: tuple[int, list[int]] | None = None  # (position, tokens) of the last drafter proposal
    _drafter_steps: int = 0
    _drafter_accepted: int = 0
    _drafter_proposed: int = 0

    def _settle(self, generated: list[int]) -> None:
        """Count how many of the drafter's last proposal were accepted; adapt its k."""
        if self._last is None:
            return
        at, tokens = self._last
        self._last = None
        got = generated[at : at + len(tokens)]
        n = 0
        while n < len(got) and got[n] == tokens[n]:
            n += 1
        self._drafter_accepted += n
        self._drafter_proposed += len(tokens)
        self._drafter_steps += 1
        full = n == len(tokens)
        self._k = min(self.policy.max_k, self._k + 1) if full else max(1, self._k - 1)
        rate = self._drafter_accepted / max(1, self._drafter_proposed)
        if (
            not self._stopped
            and self._drafter_steps >= self.policy.probe_steps
            and rate < self.policy.min_acceptance
        ):
            self._stopped = True
            self.events.append(
                f"stopped at token {len(generated)}: acceptance {rate:.2f} < "
                f"{self.policy.min_acceptance} after {self._drafter_steps} proposals"
            )

    def _may_draft(self, generated: list[int]) -> bool:
        if self.drafter is None or self._stopped:
            return False
        if self._joined:
            return True
        now = time.perf_counter()  # wall: the wait spans turns
        if self._started is None:
            self._started = now
        ratio, basis = self.paid.ratio(self.costs.prefill)
        estimate = self.prefill_s() * ratio  # the whole prompt's, whatever the drafter reads
        waited = now - self._started
        if len(generated) >= self.policy.after_tokens and waited >= (
            self.policy.join_factor * estimate
        ):
            self._joined, self._k = True, self.policy.start_k
            self._book_prefill = self.book_paid
            self.events.append(
                f"joined at token {len(generated)} after {waited:.2f}s of decoding "
                f"(estimated drafter prefill {estimate:.2f}s); prefill ratio {ratio:.3f} "
                f"{basis}"
                + (
                    f"; it reads {self.prompt_share:.0%} of the prompt (the wait is the whole "
                    "prompt's)"
                    if self.prompt_share < 1
                    else ""
                )
            )
        return self._joined

    def propose(self, generated: list[int], k: int) -> Proposal:
        """See the class docstring."""
        self._settle(generated)
        if self._started is None:  # the join wait counts decoding time, whatever proposes
            self._started = time.perf_counter()
        tokens, source = self.ngrams.propose(generated, k)
        strong = bool(tokens) and self.ngrams.strong
        first = strong or (self.ngrams_first and bool(tokens) and not self._weak_off)
        self._drafter_s = 0.0
        if not first and self._may_draft(generated):
            drafter = self.drafter
            assert drafter is not None
            before = drafter.stats.draft_s - drafter.stats.prefill_s
            size = min(k, self._k, self.narrow or k)
            proposal = drafter.propose(generated, size, self.policy.min_confidence)
            self._drafter_s = drafter.stats.draft_s - drafter.stats.prefill_s - before
            if self._book_prefill and proposal.tokens:  # k=0 ran no prefill: not yet
                self._book_prefill = False
                # like with like: the target's time for as many prompt tokens
                self.paid.add(drafter.stats.prefill_s, self.prefill_s() * self.prompt_share)
            if proposal.tokens:  # nothing proposed (the budget stopped its reading): no round
                self._last = (len(generated), list(proposal.tokens))
            else:
                self._drafter_s = 0.0
        elif tokens and (strong or not self._weak_off):
            proposal = Proposal(tokens, source)
        elif (self.ngrams_first or self.single_matches) and not self._weak_off:
            # no drafter now and no 2-gram match: where a rejected candidate costs ~nothing a
            # single shared token is worth a try (HF's prompt lookup does the same)
            proposal = Proposal(*self.ngrams.propose(generated, k, min_ngram=1))
        else:
            proposal = Proposal([], "")
        if proposal.tokens:
            self.choices[proposal.source] = self.choices.get(proposal.source, 0) + 1
        self._kind = (
            ("drafter" if proposal.source == "drafter" else "strong" if strong else "weak")
            if proposal.tokens
            else "plain"
        )
        return proposal

    def carry_over(self, earlier: MergedProposer) -> None:
        """Continue the answer of ``earlier`` (an incremental decode's previous prompt).

        Its ledgers, choices, events, verdicts and drafter stats hold for the rest of the
        answer; its last drafter proposal is settled against the answer this prompt goes on
        (tokens a rebuild retracted count as rejected).
        """
        self.ledgers, self.choices, self.events = earlier.ledgers, earlier.choices, earlier.events
        self._stopped, self._weak_off = earlier._stopped, earlier._weak_off
        self._joined, self._k, self._started = earlier._joined, earlier._k, earlier._started
        self._drafter_steps = earlier._drafter_steps
        self._drafter_accepted = earlier._drafter_accepted
        self._drafter_proposed = earlier._drafter_proposed
        self._last = earlier._last
        if self.drafter is not None and earlier.drafter is not None:  # one answer's drafter
            self.drafter.stats = earlier.drafter.stats  # work, summed over its prompts

    def observe(self, candidates: int, emitted: int, pass_s: float) -> None:
        """The decode loop's report of the pass that verified the latest proposal."""
        kind = self._kind if candidates else "plain"
        ledger = self.ledgers.setdefault(kind, Ledger())
        ledger.add(emitted, pass_s + (self._drafter_s if kind == "drafter" else 0.0))
        rounds, tokens, seconds = ledger.judged
        if kind == "plain" or not self.policy.pay_check or rounds < self.policy.probe_steps:
            return
        plain = self.ledgers.get("plain")
        if plain is not None and plain.judged[0] >= 2:
            base, basis = plain.per_token(), f"{plain.judged[0]} plain steps"
        elif self.plain_step_s > 0:
            base, basis = self.plain_step_s, "given plain step time"
        else:
            return  # no baseline measured yet: no verdict
        if self.policy.pays(seconds, tokens, base):
            return
        cost = (
            f"{ledger.per_token():.3f}s per token over {rounds} rounds > "
            f"{base:.3f}s per plain step ({basis})"
        )
        if kind == "drafter" and not self._stopped:
            self._stopped = True
            self.events.append(f"stopped: drafter rounds cost {cost}")
        elif kind == "weak" and not self._weak_off:
            self._weak_off = True
            self.events.append(f"weak n-gram matches off: their rounds cost {cost}")
