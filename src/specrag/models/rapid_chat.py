"""``ChatRapid``: RAPID long-context decoding as a LangChain chat model.

Inputs:

* the **document**: the ``document=`` keyword of ``invoke``/``stream``, or a
  ``SystemMessage(content=<document>, name="document")`` among the messages;
* the **question**: the last human message; other system messages are instructions;
* optionally ``drafter_context=`` (the retrieved text the drafter reads). Without it the
  document is chunked and searched here (all-MiniLM-L6-v2 by default).

The target reads ``instructions + <document> + question``; the drafter reads the same layout with
the retrieved chunks in place of the document. Prompts are document-first, so a second question
on the same document reuses the target's cached KV prefix (``prefix_cache_hit`` in metadata).
Decoding statistics land in ``response_metadata``: ``acceptance_rate``,
``mean_accepted_per_step``, ``target_forward_passes``, ``draft_tokens``, ``prefix_cache_hit``,
``eta``, ``gamma`` and stage timings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from specrag.decoding.drafter import NARROW, narrow_cap
from specrag.decoding.prefix_cache import DEFAULT_PREFIX_CACHE, PrefixCache, prefix_key
from specrag.decoding.rapid import RapidConfig, RapidStats, Transfer, rapid_decode
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import Token, prefill_stop
from specrag.decoding.state import LMState, Stopped
from specrag.defuse import defuse
from specrag.errors import InputError
from specrag.models.loading import (
    EMBEDDED_LM,
    LoadedLM,
    drafter_dtype,
    load_lm,
    pair_costs,
    pass_ratios,
    same_tokenizer,
    wide_pass_ratio,
)
from specrag.models.local import (
    DecodeJob,
    LocalChatBase,
    StopCheck,
    make_generator,
    special_tokens,
)
from specrag.models.options import DecodeOptions

# (document, question, token_length, chunk_tokens, token_budget) -> the drafter's context
DrafterRetriever = Callable[[str, str, Callable[[str], int], int, int], str]

log = logging.getLogger(__name__)

_PLACEHOLDER = "\u241fSPECRAG-DOCUMENT\u241f"
RAPID_INSTRUCTIONS = (
    "Answer the question using the document. Answer directly in one or two sentences, in the "
    "same language as the question."
)


def split_messages(messages: list[BaseMessage], document: str | None) -> tuple[str, str, str]:
    """(instructions, document, question) from chat messages."""
    doc = document
    instructions = []
    for m in messages:
        if isinstance(m, SystemMessage) and m.name == "document" and doc is None:
            doc = str(m.text)
        elif isinstance(m, SystemMessage):
            instructions.append(str(m.text))
    humans = [m for m in messages if isinstance(m, HumanMessage)]
    if not humans:
        raise InputError("ChatRapid needs a human message with the question")
    if not doc:
        raise InputError(
            "ChatRapid needs a document (document= or a system message named 'document')"
        )
    return "\n".join(instructions) or RAPID_INSTRUCTIONS, doc, str(humans[-1].text)


def layout(
    loaded: LoadedLM, instructions: str, context: str, question: str
) -> tuple[list[int], list[int], list[int]]:
    """Token ids ``(head, context, tail)``; the cacheable prefix is ``head + context``.

    The three parts are tokenised separately so the prefix's ids never depend on the question.
    The context and the question are user text: chat control tokens in them are defused, so
    a document cannot open a system turn of its own.
    """
    tok = loaded.tokenizer
    specials = special_tokens(tok)
    context, question = defuse(context, specials), defuse(question, specials)
    user = f"<document>\n{_PLACEHOLDER}\n</document>\n\nQuestion: {question}"
    msgs = [{"role": "system", "content": instructions}, {"role": "user", "content": user}]
    if getattr(tok, "chat_template", None):
        rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    else:
        rendered = f"{instructions}\n\n{user}\n\nAnswer:"
    head, tail = rendered.split(_PLACEHOLDER, 1)

    def ids(text: str) -> list[int]:
        return [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]

    return ids(head), ids(context), ids(tail)


def fit(head: list[int], body: list[int], tail: list[int], limit: int) -> tuple[list[int], bool]:
    """Middle-truncate ``body`` so the prompt fits in ``limit`` tokens."""
    room = limit - len(head) - len(tail)
    if room <= 0:
        raise InputError("the question is too long for the model's context window")
    if len(body) <= room:
        return body, False
    half = room // 2
    return body[:half] + body[len(body) - (room - half) :], True


class ChatRapid(LocalChatBase):
    """RAPID decoding (arXiv 2502.20330) over local Hugging Face models sharing a tokenizer."""

    target_model: str = EMBEDDED_LM
    drafter_model: str | None = None  # None: the target model drafts for itself
    device: str = "auto"
    dtype: str = "auto"
    drafter_dtype: str = "auto"  # see specrag.models.loading.drafter_dtype
    temperature: float = 0.0
    max_new_tokens: int = 128
    gamma: int = 10
    transfer: Transfer = "shift"
    eta: float = 5.0
    alpha: float = 0.1
    lam: float = 0.3
    adaptive_gamma: bool = True
    min_draft_confidence: float = 0.0
    wide_pass_cheap: float = 1.5  # as ChatLocalLM: a wider pass at most this x a step is cheap
    narrow_acceptance: float = 0.7  # per-token acceptance the gamma cap is planned for
    drafter_tokens: int = 768
    chunk_tokens: int = 128
    embedding_model: str = EMBEDDED_LM
    drafter_retriever: DrafterRetriever | None = None  # None: document search, embedding_model
    use_prefix_cache: bool = True
    seed: int | None = None
    prefix_cache: Any = None  # a PrefixCache; None = the process-wide default

    @property
    def _llm_type(self) -> str:
        return "specrag-rapid"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "target": self.target_model,
            "drafter": self.drafter_model or self.target_model,
            "gamma": self.gamma,
            "transfer": self.transfer,
            "eta": self.eta,
        }

    def load(self) -> tuple[LoadedLM, LoadedLM]:
        """Load target and drafter (once per process)."""
        target = load_lm(self.target_model, self.device, self.dtype)
        name = self.drafter_model or self.target_model
        dtype = drafter_dtype(
            self.drafter_dtype, self.dtype, self.device, name == self.target_model
        )
        drafter = load_lm(name, self.device, dtype)
        self._gamma_plan(target, drafter)  # measured here, outside the first answer's budget
        return target, drafter

    def _gamma_plan(self, target: LoadedLM, drafter: LoadedLM) -> dict[str, Any]:
        """Draft tokens per verify pass, from the measured cost of verify passes.

        With a drafter that is not the target, where the widest pass gamma can reach (``gamma``;
        with ``adaptive_gamma`` up to ``RapidConfig.max_gamma``) costs more than
        ``wide_pass_cheap`` x a step (fp32 on CPU cores: a staircase, ~3x for the 1.5B of the
        pair), passes of 2-4 tokens are timed too and gamma is capped at the width with the
        most expected tokens per unit of cost - the verify pass plus the drafter's own steps
        (its measured step ratio), at ``narrow_acceptance`` per token
        (:func:`specrag.decoding.drafter.narrow_cap`; knowledge transfer makes one more drafter
        pass per round than it charges). Elsewhere (a GPU; bf16 on CPUs with AMX) and for a
        target drafting for itself gamma is as configured: that drafter reads the retrieved
        chunks while the target reads the whole document, a difference the step ratio, timed
        on a short cache, would not see. Measured once per model and process.
        """
        widest = max(self.gamma, RapidConfig.max_gamma) if self.adaptive_gamma else self.gamma
        as_set = f"gamma {self.gamma} as configured"
        if drafter.key == target.key:
            return {"gamma_cap": 0, "why": f"the target drafts for itself: {as_set}"}
        ratio = wide_pass_ratio(target, widest + 1)
        width = f"a {widest + 1}-token pass costs {ratio:.2f}x a step"
        plan: dict[str, Any] = {"wide_pass_ratio": round(ratio, 3), "gamma_cap": 0}
        if ratio <= self.wide_pass_cheap:
            return {**plan, "why": f"{width} (<= {self.wide_pass_cheap}): {as_set}"}
        step = pair_costs(drafter, target).step
        ratios = pass_ratios(target, (*(c for c in NARROW if c < widest), widest))
        cap = narrow_cap(ratios, self.narrow_acceptance, draft_cost=step)
        plan.update(
            drafter_step_ratio=round(step, 3),
            pass_ratio_by_candidates={c: round(r, 3) for c, r in ratios.items()},
            gamma_cap=cap,
        )
        if not cap:
            return {**plan, "why": f"{width}, but the widest passes still give most per cost"}
        return {
            **plan,
            "why": f"{width} (> {self.wide_pass_cheap}); with drafter steps at {step:.2f}x, "
            f"{cap} draft tokens per pass give the most tokens per cost (a {cap + 1}-token "
            f"pass costs {ratios[cap]:.2f}x a step)",
        }

    def _planned_config(
        self, target: LoadedLM, drafter: LoadedLM
    ) -> tuple[RapidConfig, dict[str, Any]]:
        """The engine configuration with gamma capped as :meth:`_gamma_plan` says, and the plan."""
        plan = self._gamma_plan(target, drafter)
        cap = plan["gamma_cap"]
        cfg = self.config(**({"gamma": min(self.gamma, cap), "max_gamma": cap} if cap else {}))
        return cfg, plan

    def _default_retriever(self) -> DrafterRetriever:
        """The default: document search with ``embedding_model`` (imported only when needed)."""
        from specrag.indexing.document_search import drafter_context
        from specrag.models.loading import load_embeddings

        embeddings = load_embeddings(self.embedding_model)

        def retrieve(
            document: str, question: str, count: Any, chunk_tokens: int, budget: int
        ) -> str:
            return drafter_context(document, question, embeddings, count, chunk_tokens, budget)

        return retrieve

    def config(self, **overrides: Any) -> RapidConfig:
        """The engine configuration of this model (``overrides`` replace fields)."""
        fields = (
            "gamma",
            "transfer",
            "eta",
            "alpha",
            "lam",
            "adaptive_gamma",
            "min_draft_confidence",
        )
        return RapidConfig(**{**{f: getattr(self, f) for f in fields}, **overrides})

    def _job(self, messages: list[BaseMessage], options: DecodeOptions) -> DecodeJob:
        target, drafter = self.load()
        if not same_tokenizer(target, drafter):
            raise InputError("RAPID needs target and drafter models with the same tokenizer")
        instructions, document, question = split_messages(messages, options.document)
        max_new = options.max_new_tokens or self.max_new_tokens
        cfg, plan = self._planned_config(target, drafter)
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        drafter_context = options.drafter_context
        if drafter_context is None:
            retriever = self.drafter_retriever or self._default_retriever()
            tok = target.tokenizer
            drafter_context = retriever(
                document,
                question,
                lambda t: len(tok(t, add_special_tokens=False)["input_ids"]),
                self.chunk_tokens,
                self.drafter_tokens,
            )
        timings["retrieve_s"] = round(time.perf_counter() - t0, 4)
        head, doc_ids, tail = layout(target, instructions, document, question)
        doc_ids, truncated = fit(head, doc_ids, tail, target.max_context - max_new - 1)
        if truncated:
            log.warning("document middle-truncated to fit %d tokens", target.max_context)
        d_head, d_ids, d_tail = layout(drafter, instructions, drafter_context, question)
        d_ids, _ = fit(d_head, d_ids, d_tail, drafter.max_context - max_new - 1)
        target_prompt = head + doc_ids + tail
        drafter_prompt = d_head + d_ids + d_tail
        temperature = self.temperature if options.temperature is None else options.temperature
        sampler = Sampler(float(temperature))
        seed = self.seed if options.seed is None else options.seed
        generator = make_generator(target.device, sampler, seed)
        cache: PrefixCache = self.prefix_cache or DEFAULT_PREFIX_CACHE
        stats = RapidStats()
        hit = {"value": False}

        def produce(should_stop: StopCheck) -> Iterator[list[Token]]:
            prefix = head + doc_ids
            key = prefix_key(target.key, prefix)
            target_state = cache.get(key, target.model) if self.use_prefix_cache else None
            # a hit may be partial: an earlier call's budget stopped its document prefill
            hit["value"] = target_state is not None and len(target_state) == len(prefix)
            t1 = time.perf_counter()
            if target_state is None:
                target_state = LMState(target.model, target.device)
            if self.use_prefix_cache and len(target_state) < len(prefix):
                try:  # the budget applies to the document prefill too ...
                    target_state.extend(
                        prefix[len(target_state) :],
                        all_logits=False,
                        should_stop=prefill_stop(should_stop),
                    )
                except Stopped as stop:
                    # ... and what was prefilled is kept: the next question continues it
                    cache.put(key, target_state)
                    stats.finish_reason = stop.reason
                    return
                cache.put(key, target_state)
            timings["prefix_s"] = round(time.perf_counter() - t1, 4)
            yield from rapid_decode(
                target_state,
                LMState(drafter.model, drafter.device),
                target_prompt,
                drafter_prompt,
                max_new_tokens=max_new,
                sampler=sampler,
                cfg=cfg,
                eos_ids=target.eos_token_ids,
                should_stop=should_stop,
                generator=generator,
                stats=stats,
            )

        def metadata() -> dict[str, Any]:
            return {
                **stats.as_dict(),
                "prefix_cache_hit": hit["value"],
                "eta": cfg.eta,
                "gamma": cfg.gamma,
                "max_gamma": cfg.max_gamma if cfg.adaptive_gamma else cfg.gamma,
                "verify": plan,
                "transfer": cfg.transfer,
                "target_prompt_tokens": len(target_prompt),
                "drafter_prompt_tokens": len(drafter_prompt),
                "document_truncated": truncated,
                **timings,
            }

        return DecodeJob(
            produce=produce,
            tokenizer=target.tokenizer,
            eos_ids=target.eos_token_ids,
            input_tokens=len(target_prompt),
            metadata=metadata,
            finish_reason=lambda: stats.finish_reason,
            model_name=f"rapid:{target.name}<-{drafter.name}",
            flatten=True,
        )
