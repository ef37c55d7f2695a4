"""``ChatLocalLM``: a LangChain chat model over a local Hugging Face causal LM.

Thin by design: it adapts messages to the model's chat template and runs
:func:`specrag.decoding.speculative.decode` on the model thread (streaming, time bounds and
log-probabilities come from :class:`~specrag.models.local.LocalChatBase`). It adds
**speculative candidates**: ``speculation="prompt"`` proposes n-grams of the prompt (the
evidence), ``"draft+prompt"`` also of a ``draft=`` text passed per call; greedy output is
unchanged, decoding needs fewer forward passes. With ``drafter_model`` a smaller model of the
same tokenizer reads the same prompt and proposes tokens too (:mod:`specrag.decoding.drafter`:
one proposer merges drafter, draft and evidence; a cost model measured from both models' step
times decides whether the drafter runs). Decoding statistics go to
``response_metadata["decoding"]``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import AliasChoices, Field

from specrag.decoding.candidates import NgramProposer
from specrag.decoding.drafter import (
    CHEAP_WIDTHS,
    NARROW,
    DrafterPolicy,
    DrafterProposer,
    MergedProposer,
    narrow_cap,
)
from specrag.decoding.incremental import decode_incremental
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import DecodeStats, Step, decode, prefill_stop
from specrag.decoding.state import VERIFIER_MARKS, LMState
from specrag.errors import short_error
from specrag.models.loading import (
    DRAFTER_FAILED,
    EMBEDDED_LM,
    LoadedLM,
    costs_check,
    drafter_dtype,
    load_lm,
    loaded_lm,
    paid_prefills,
    pair_costs,
    same_tokenizer,
    timed,
    wide_check,
    wide_pass_ratio,
)
from specrag.models.local import (
    DecodeJob,
    LocalChatBase,
    StopCheck,
    answer_fit,
    chat_head,
    encode_chat,
    make_generator,
)
from specrag.models.options import MAX_SEED, DecodeOptions, Speculation, refuse_int8_answer
from specrag.models.tools import (
    forced_prefix,
    plain_choice,
    supports_tools,
    tool_choice_name,
    tool_names,
)
from specrag.models.worker import MODEL_THREAD

log = logging.getLogger(__name__)

# Verify the draft's first tokens in the prefill pass (measured on the pair:
# docs/bench/2026-12-05-draft-opening/); False only to measure without.
DRAFT_OPENING = True


__all__ = ["ChatLocalLM", "LocalChatBase", "encode_chat", "make_generator"]


class ChatLocalLM(LocalChatBase):
    """A local Hugging Face causal LM as a streaming LangChain chat model.

    Per-call keyword arguments (``model.invoke(msgs, draft=..., max_time=...)``):
    ``draft`` (candidate text for ``speculation="draft+prompt"``), ``speculation``,
    ``max_time``, ``max_new_tokens``, ``temperature``, ``stop_event`` (a ``threading.Event``;
    decoding stops once it is set and ``min_tokens`` tokens exist) and ``min_tokens``.
    """

    model_name: str = Field(
        default=EMBEDDED_LM,
        validation_alias=AliasChoices("model_name", "model"),  # LangChain's usual name too
        description="embedded, a local path or a hub id",
    )
    device: str = "auto"
    dtype: str = "auto"
    temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(
        default=256, ge=0, validation_alias=AliasChoices("max_new_tokens", "max_tokens")
    )
    speculation: Speculation = "prompt"
    max_candidates: int = 8
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)  # None: a new one per call
    drafter_model: str | None = Field(
        default=None, description="a smaller model with the same tokenizer that proposes tokens"
    )
    drafter_dtype: str = Field(
        default="auto",
        description="the drafter's dtype (auto: int8 for an fp32 or bf16 target on an x86 "
        "CPU, else the model's dtype; see specrag.models.loading.drafter_dtype)",
    )
    drafter_max_cost_ratio: float = 0.5
    drafter_after_tokens: int = 8
    drafter_join_factor: float = 2.0
    drafter_pay_check: bool = True
    drafter_confidence: float = 0.7
    drafter_vocab: int = 32768  # the drafter scores these first ids + its prompt's (0: all)
    wide_pass_cheap: float = 1.5
    single_match_cost: float = 1.1  # 1-token matches where a narrow pass costs <= this x a step
    wide_candidates: int = 16
    narrow_acceptance: float = 0.7

    @property
    def _llm_type(self) -> str:
        return "specrag-local-hf"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            **self._decode_identity(),
            "speculation": self.speculation,
            "drafter_model": self.drafter_model,
        }

    def load(self) -> LoadedLM:
        """Load the model (and drafter) now, once per process; call before any budget starts.

        Also measures (once per machine, kept in the cache dir; read once per process) what a
        wide verify pass costs and what the drafter's step and prefill cost beside the model's,
        which the decode reads (:meth:`_verify_plan`, :meth:`_drafter_plan`), so the first
        answer does not pay for measuring them.
        """
        loaded = load_lm(self.model_name, self.device, self.dtype)
        if loaded.dtype == torch.qint8:  # int8: plain decoding, its drafter is never used
            return loaded
        self._drafter()  # a drafter that cannot load is left out (the answer still runs)
        if self.speculation != "none":
            self._drafter_plan(loaded, self.speculation)
            self._verify_plan(loaded, self.speculation)
        return loaded

    def prompt_fits(self, messages: list[BaseMessage], max_new_tokens: int) -> bool:
        """Whether decoding ``messages`` reads the whole prompt (no cut in its middle).

        The decoder's own rule: an answer limit past the context is capped to what the prompt
        leaves, the prompt keeping at least half the context (:func:`answer_fit`); past that
        the prompt is cut in the middle. An answer node first leaves out its last evidence
        instead (:func:`specrag.nodes.answer.fit_evidence`).
        """
        loaded = load_lm(self.model_name, self.device, self.dtype)  # its tokenizer only
        n, limit = len(encode_chat(loaded, messages)), loaded.max_context - 1
        return n + answer_fit(max_new_tokens, n, limit) <= limit

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: Any = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools: their schemas go through the model's chat template.

        The model answers with ``<tool_call>`` blocks, parsed into ``AIMessage.tool_calls``
        (malformed ones into ``invalid_tool_calls``). ``tool_choice`` naming a tool (or
        "any"/"required" with one tool) forces that call: the answer starts inside the call's
        block, so only the arguments are generated. Raises ``ValueError`` for a model whose
        chat template has no tool support: at once where the model is loaded or no event loop
        runs; else at the first call (an agent's async step binds its tools on the loop,
        where a load would block it for seconds).
        """
        try:
            asyncio.get_running_loop()
            loaded = loaded_lm(self.model_name, self.device, self.dtype)
        except RuntimeError:  # no loop to block: load now, refuse now
            loaded = self.load()
        if loaded is not None and not supports_tools(loaded.tokenizer):
            raise ValueError(no_tools_message(loaded.name))
        schemas = tuple(convert_to_openai_tool(t) for t in tools)
        tool_choice_name(tool_choice, schemas)  # an unknown tool name fails here, not later
        DecodeOptions.from_call(dict(kwargs))  # and an unknown keyword (strict=True) too
        return self.bind(tools=schemas, tool_choice=tool_choice, **kwargs)

    def _drafter_dtype(self) -> str:
        same = self.drafter_model == self.model_name
        return drafter_dtype(self.drafter_dtype, self.dtype, self.device, same)

    def _policy(self) -> DrafterPolicy:
        return DrafterPolicy(
            self.drafter_max_cost_ratio,
            self.drafter_after_tokens,
            self.drafter_join_factor,
            pay_check=self.drafter_pay_check,
            min_confidence=self.drafter_confidence,
        )

    def _drafter(self) -> tuple[LoadedLM | None, str]:
        """The drafter, loaded once per process; or None and why it could not be loaded.

        The drafter only proposes tokens: one that cannot load (a wrong path, a broken file)
        is left out with one warning, and the answer model decodes alone.
        """
        if not self.drafter_model:
            return None, "no drafter configured"
        key = (self.drafter_model, self.device, self._drafter_dtype())
        if key in DRAFTER_FAILED:
            return None, DRAFTER_FAILED[key]
        try:
            return load_lm(*key), ""
        except Exception as exc:  # noqa: BLE001 - any load failure leaves the drafter out
            why = DRAFTER_FAILED[key] = short_error(exc)
            log.warning("the drafter %s is left out: %s", self.drafter_model, why)
            return None, why

    def _drafter_plan(
        self, loaded: LoadedLM, speculation: str
    ) -> tuple[LoadedLM | None, dict[str, Any]]:
        """The drafter to use (or None) and the cost model's decision, for the stats."""
        if not self.drafter_model:
            return None, {"drafter": None, "drafter_used": False, "why": "no drafter configured"}
        if speculation == "none":
            return None, {
                "drafter": self.drafter_model,
                "drafter_used": False,
                "why": "speculation=none (plain decoding)",
            }
        drafter, failed = self._drafter()
        if drafter is None:
            return None, {
                "drafter": self.drafter_model,
                "drafter_used": False,
                "why": f"the drafter could not be loaded: {failed}",
            }
        info: dict[str, Any] = {"drafter": drafter.name}
        if drafter.key == loaded.key:
            return None, {**info, "drafter_used": False, "why": "drafter is the answer model"}
        if not same_tokenizer(drafter, loaded):
            return None, {**info, "drafter_used": False, "why": "tokenizers differ"}
        costs = pair_costs(drafter, loaded)
        use, why = self._policy().decide(costs.step)
        info["cost_ratio"] = round(costs.step, 3)  # the step ratio (this key since protocol 2)
        info["prefill_ratio"] = round(costs.prefill, 3)  # timed at load, or kept from then
        info["costs_timed"] = timed((drafter, loaded), costs_check())
        paid, basis = paid_prefills(drafter, loaded).ratio(costs.prefill)
        info["prefill_ratio_used"] = {"ratio": round(paid, 3), "basis": basis}
        return (drafter if use else None), {**info, "drafter_used": use, "why": why}

    def _verify_plan(
        self, loaded: LoadedLM, speculation: str, drafter: bool = True
    ) -> dict[str, Any]:
        """How many candidates a pass verifies, from the measured cost of verify passes.

        Where a ``wide_candidates + 1``-token pass costs at most ``wide_pass_cheap`` x a
        single step (a GPU; bf16 on CPUs with AMX), proposals run to ``wide_candidates``
        tokens without shrinking after a rejection, and n-gram matches of any length come
        before the drafter; elsewhere (fp32 on CPU cores) ``max_candidates``, adapted per pass.
        Either way passes of a few narrower widths are timed too (:data:`NARROW` candidates
        where wide passes are dear, :data:`CHEAP_WIDTHS` where they are cheap): where a
        narrower pass gives more tokens per unit of its cost (:func:`narrow_cap`), the
        drafter's proposals and weak n-gram matches stop at that width; strong matches, mostly
        accepted, run on. Cheap is not flat: on 2 AMD EPYC cores with the packed fp32 layout
        (2026-12-04) the 1.5B's passes of 4 / 8 / 12 / 17 tokens on a 900-token cache cost
        0.90 / 1.06 / 1.12 / 1.37x a step, and weak matches run to 16 candidates had ~1.2
        accepted. Where the pass at the narrow width costs at most ``single_match_cost`` x a
        step (that machine: a 4-token pass 0.77-0.90x a step, timed in two processes, while the
        17-token pass read 1.46x in one and 1.53x in the other - either side of
        ``wide_pass_cheap``) a 1-token n-gram match is proposed too where nothing else
        proposes: that round would be a plain step (``single_matches``; the pay check turns
        weak matches off for an answer whose rounds cost more per token than its plain steps).
        Both are the merged proposer's: without a ``drafter`` n-gram matches of 2+ tokens
        propose alone (a review, 2026-12-07: the plan promised 1-token matches that never ran).
        """
        if speculation == "none":
            return {"max_candidates": 0, "why": "speculation=none (plain decoding)"}
        ratio = wide_pass_ratio(loaded, self.wide_candidates + 1)
        cheap = ratio <= self.wide_pass_cheap
        width = f"a {self.wide_candidates + 1}-token pass costs {ratio:.2f}x a step"
        widths = [c for c in (CHEAP_WIDTHS if cheap else NARROW) if c < self.wide_candidates]
        ratios = {c: wide_pass_ratio(loaded, c + 1) for c in widths}
        ratios[self.wide_candidates] = ratio
        narrow = narrow_cap(ratios, self.narrow_acceptance)
        # a round nothing else proposes in is a plain step: where a pass at the narrow width
        # costs about as much, a 1-token match's candidates cost nothing when rejected
        single = drafter and (
            cheap or ratios[narrow or self.wide_candidates] <= self.single_match_cost
        )
        capped = (
            f"; {'drafter and weak' if drafter else 'weak'} n-gram proposals stop at {narrow} "
            f"(a {narrow + 1}-token pass costs {ratios[narrow]:.2f}x a step)"
            if narrow
            else ""
        )
        plan: dict[str, Any] = {
            "wide_pass_ratio": round(ratio, 3),
            "timed": timed((loaded,), wide_check(self.wide_candidates + 1)),
            "cheap": cheap,
            "layout": loaded.layout,
            "pass_ratio_by_candidates": {c: round(r, 3) for c, r in sorted(ratios.items())},
            "narrow_candidates": narrow,
            "single_matches": single,
        }
        if cheap:
            return {
                **plan,
                "max_candidates": max(self.max_candidates, self.wide_candidates),
                "why": f"{width} (<= {self.wide_pass_cheap}): up to {self.wide_candidates} "
                "candidates per pass, "
                + (
                    "n-gram matches before the drafter, 1-token matches where neither proposes"
                    if drafter
                    else "n-gram matches of 2+ tokens (no drafter)"
                )
                + capped,
            }
        at = (narrow or self.wide_candidates) + 1
        singles = (
            f"; 1-token matches where nothing else proposes (a {at}-token pass costs <= "
            f"{self.single_match_cost}x a step)"
            if single
            else ""
        )
        return {
            **plan,
            "max_candidates": self.max_candidates,
            "why": f"{width} (> {self.wide_pass_cheap}): up to {self.max_candidates} "
            "candidates, fewer after a rejection"
            + capped
            + singles
            + ("" if drafter else "; no drafter"),
        }

    def _job(self, messages: list[BaseMessage], options: DecodeOptions) -> DecodeJob:
        if options.document is not None or options.drafter_context is not None:
            # they were taken and ignored: the answer came without the document (a review,
            # 2026-12-07)
            raise ValueError(
                "document= and drafter_context= are RAPID's: ChatLocalLM reads the messages "
                "only (use ChatRapid to answer from a long document)"
            )
        loaded = self.load()
        temperature = self.temperature if options.temperature is None else options.temperature
        asked = max_new = self._max_new(options)
        # tool_choice "none": the model answers in words, as if no tool were bound
        tools = () if plain_choice(options.tool_choice) == "none" else options.tools
        if tools and not supports_tools(loaded.tokenizer):
            raise ValueError(no_tools_message(loaded.name))
        forced = forced_prefix(options.tool_choice, tools) if tools else ""
        limit = loaded.max_context - 1
        stats = DecodeStats()
        warned = False  # of the answer's cap, once per answer

        def encode(msgs: list[BaseMessage]) -> list[int]:
            nonlocal max_new, warned
            ids = encode_chat(loaded, msgs, tools, forced)
            # Each prompt of an incremental answer is fitted on its own, as serial RAG would
            # fit it (a longer later prompt lowers the limit instead of losing its middle).
            fit = answer_fit(asked, len(ids), limit)
            if fit < asked:
                if not warned:
                    warned = True
                    log.warning(
                        "the reply is capped at %d tokens (max_new_tokens %d): %s reads %d "
                        "tokens at most, and the prompt has %d",
                        fit,
                        asked,
                        loaded.name,
                        loaded.max_context,
                        len(ids),
                    )
            # the cap of the prompt read last: a later, shorter prompt of an incremental
            # answer lifts it (a stale one stayed in the stats; a review, 2026-12-07)
            stats.answer_cap = fit if fit < asked else 0
            max_new = fit
            if len(ids) + max_new > limit:  # keep the chat head and the question end
                keep = max(limit - max_new, 16)
                head = min(chat_head(loaded, msgs, ids, tools, forced) or 8, keep // 2)
                if not stats.prompt_cut:  # once per answer (an incremental one re-encodes)
                    log.warning(
                        "the prompt (%d tokens) was cut to %d in the middle: %s reads %d "
                        "tokens at most, %d of them for the answer",
                        len(ids),
                        keep,
                        loaded.name,
                        loaded.max_context,
                        max_new,
                    )
                stats.prompt_cut = max(stats.prompt_cut, len(ids) - keep)
                ids = ids[:head] + ids[-(keep - head) :]
            return ids

        prompt = encode(messages)
        draft_ids: list[int] = []
        speculation = options.speculation or self.speculation
        if loaded.dtype == torch.qint8:  # its wide passes compute differently from its steps
            speculation = "none"  # (specrag.models.int8): a verify pass could change its answer
        if speculation == "draft+prompt" and options.draft:
            draft_ids = loaded.tokenizer(options.draft, add_special_tokens=False)["input_ids"]

        def ngram_sources(ids: list[int]) -> dict[str, list[int]]:
            sources = {"draft": draft_ids} if draft_ids else {}
            return {**sources, "prompt": ids} if speculation != "none" else sources

        feed = options.prompt_feed
        if feed is not None and loaded.dtype == torch.qint8:  # a rebuild checks the answer
            refuse_int8_answer("int8", "dtype", "an incremental answer: ")  # in one wide pass
        sampler = Sampler(temperature, self.top_p)
        seed = self.seed if options.seed is None else options.seed
        generator = make_generator(loaded.device, sampler, seed)
        drafter, plan = self._drafter_plan(loaded, speculation)
        merged: MergedProposer | None = None
        drafter_prompt = prompt
        if drafter is not None and options.drafter_messages and feed is None:
            ids = encode_chat(loaded, list(options.drafter_messages), tools, forced)
            if len(ids) + max_new <= limit:  # else the answer model's prompt (cut to fit)
                drafter_prompt = ids
                plan = {**plan, "drafter_prompt_tokens": len(ids), "prompt_tokens": len(prompt)}
        if drafter is not None and drafter.max_context < loaded.max_context:
            # a drafter that reads fewer tokens than the target: it proposes only where the
            # whole prompt and answer fit in its context (an incremental prompt may grow)
            room = drafter.max_context
            if feed is not None or len(drafter_prompt) + max_new > room - 1:
                drafter = None
                plan = {
                    **plan,
                    "drafter_used": False,
                    "why": f"the prompt and answer ({len(drafter_prompt)} + {max_new} tokens"
                    f"{', and later prompts' if feed is not None else ''}) may not fit the "
                    f"drafter's context of {room} tokens",
                }

        verify = self._verify_plan(loaded, speculation, drafter is not None)

        def produce(should_stop: StopCheck) -> Iterator[Step]:
            draft_lm = LMState(drafter.model, drafter.device) if drafter is not None else None

            def make_proposer(ids: list[int], drafter_ids: list[int] | None = None) -> Any:
                """The proposer for prompt ``ids``; a drafter reads ``drafter_ids`` if given."""
                nonlocal merged
                earlier = merged  # an incremental decode's previous prompt, if any
                found = ngram_sources(ids)
                narrow = verify.get("narrow_candidates", 0)
                if draft_lm is None or drafter is None:
                    return NgramProposer(found, short_max=narrow) if found else None
                # built on the model thread; after a rebuild the drafter's cache is cropped
                # to the prefix it shares with the new prompt, as the target's is
                merged = MergedProposer(
                    NgramProposer(found, short_max=narrow),
                    DrafterProposer(
                        draft_lm,
                        drafter_ids or ids,
                        sampler,
                        generator,
                        vocab=loaded.output_rows,
                        usable=len(loaded.tokenizer),
                        eos_ids=loaded.eos_token_ids,
                        vocab_first=self.drafter_vocab,
                        should_stop=prefill_stop(should_stop),
                    ),
                    self._policy(),
                    costs=pair_costs(drafter, loaded),
                    # the running segment's prefill (an incremental decode sums it later)
                    prefill_s=lambda: (stats.segment or stats).prefill_s,
                    prompt_share=len(drafter_ids or ids) / max(1, len(ids)),
                    paid=paid_prefills(drafter, loaded),
                    # a later prompt's segment prefill reads only the changed tail
                    book_paid=earlier is None,
                    ngrams_first=bool(verify.get("cheap")),
                    single_matches=bool(verify.get("single_matches")),
                    narrow=narrow,
                )
                if earlier is not None:
                    merged.carry_over(earlier)
                return merged

            lm = LMState(loaded.model, loaded.device, marks=VERIFIER_MARKS)
            common: dict[str, Any] = {
                "max_new_tokens": max_new,
                "sampler": sampler,
                "eos_ids": loaded.eos_token_ids,
                "max_candidates": verify["max_candidates"] or self.max_candidates,
                "shrink_k": not verify.get("cheap"),
                "generator": generator,
            }
            if feed is None:
                yield from decode(
                    lm,
                    prompt,
                    proposer=make_proposer(prompt, drafter_prompt),
                    should_stop=should_stop,
                    stats=stats,
                    # the draft's start is verified in the prefill pass: where it is right the
                    # answer's first tokens cost no step (a few tokens more in that pass)
                    opening=draft_ids[: common["max_candidates"]] if DRAFT_OPENING else None,
                    **common,
                )
            else:
                yield from decode_incremental(
                    lm,
                    prompt,
                    feed,
                    encode,
                    make_proposer=make_proposer,
                    should_stop=should_stop,
                    stats=stats,
                    answer_cap=lambda: max_new,  # encode() lowers it for a longer prompt
                    others_waiting=lambda: MODEL_THREAD.others_waiting,
                    **common,
                )

        return DecodeJob(
            produce=produce,
            tokenizer=loaded.tokenizer,
            eos_ids=loaded.eos_token_ids,
            device=loaded.device,
            input_tokens=len(prompt),
            metadata=lambda: {
                **stats.as_dict(),
                "speculation": speculation,
                "verify": verify,
                "proposer": {
                    **plan,
                    **(merged.drafter.stats.as_dict() if merged and merged.drafter else {}),
                    "steps_by_source": dict(merged.choices) if merged else None,
                    "drafter_events": list(merged.events) if merged else [],
                    # per kind of step: rounds, emitted tokens, seconds (the pay check's view)
                    "cost_ledger": {
                        kind: {"rounds": x.rounds, "tokens": x.tokens, "s": round(x.seconds, 4)}
                        for kind, x in merged.ledgers.items()
                    }
                    if merged
                    else None,
                },
                "decode_speedup_vs_plain": speedup_vs_plain(stats, loaded.step_s),
            },
            finish_reason=lambda: stats.finish_reason,
            model_name=loaded.name,
            tools=tool_names(tools),
            forced=forced,
        )


def speedup_vs_plain(stats: DecodeStats, step_s: float) -> dict[str, Any] | None:
    """Decode-time speedup over plain decoding, from this run's counters.

    Plain decoding takes one target step per token after the first (the first comes from the
    prefill, as do the draft opening's tokens that pass verified: no step of either is in
    ``decode_s``, so neither is counted here). The step time is this run's own: the mean of
    its passes that verified no candidate (plain steps, at this context length); with none,
    the step time measured at load (a short cache: an underestimate, so the ratio errs low).
    Divided by the decode time this run took, drafter time and verification passes included.
    """
    decoded = stats.new_tokens - max(stats.first_step_tokens, 1)
    if decoded < 1 or stats.decode_s <= 0:
        return None
    if stats.plain_steps >= 2:
        step, basis = stats.plain_step_s / stats.plain_steps, f"{stats.plain_steps} plain steps"
    elif step_s > 0:
        step, basis = step_s, "step measured at load"
    else:
        return None
    # its own decode time: concurrent calls' steps between its own are not its cost (the
    # wall decode_s read plain decoding as 0.32x beside two others; a review, 2026-12-07)
    ratio = decoded * step / (stats.decode_own_s or stats.decode_s)
    return {"ratio": round(ratio, 3), "plain_step_s": round(step, 4), "basis": basis}


def no_tools_message(name: str) -> str:
    """The error for a model whose chat template cannot render tools."""
    return (
        f"model {name!r} cannot call tools: its chat template has no tool support "
        "(use a tool-capable model, e.g. the pair's 'qwen2.5-coder-1.5b': `make models-pair`)"
    )
