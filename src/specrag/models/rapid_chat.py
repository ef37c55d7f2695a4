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
``mean_accepted_per_step``, ``target_forward_passes``, ``draft_tokens``, ``unsure_stops``
(rounds the confidence cut-off ended), ``prefix_cache_hit``, ``eta``, ``gamma`` and stage
timings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import AliasChoices, Field

from specrag.decoding.clock import own_clock
from specrag.decoding.prefix_cache import DEFAULT_PREFIX_CACHE, PrefixCache, prefix_key
from specrag.decoding.rapid import RapidConfig, RapidStats, Transfer, rapid_decode
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import Token, prefill_stop
from specrag.decoding.state import VERIFIER_MARKS, LMState, Stopped, sync
from specrag.defuse import break_tags, defuse
from specrag.errors import InputError, short_error
from specrag.models.loading import (
    DRAFTER_FAILED,
    EMBEDDED_LM,
    LoadedLM,
    drafter_dtype,
    load_lm,
    same_tokenizer,
)
from specrag.models.local import (
    DecodeJob,
    LocalChatBase,
    StopCheck,
    answer_fit,
    apply_template,
    leading_specials,
    make_generator,
    plain_transcript,
    special_tokens,
)
from specrag.models.options import MAX_SEED, DecodeOptions, refuse_int8_answer

# (drafter, target) pairs whose leaving out was said (a warning per pair and process)
_LEFT_OUT: set[tuple[str, str]] = set()

# (document, question, token_length, chunk_tokens, token_budget) -> the drafter's context
DrafterRetriever = Callable[[str, str, Callable[[str], int], int, int], str]

log = logging.getLogger(__name__)

_PLACEHOLDER = "\u241fSPECRAG-DOCUMENT\u241f"
NO_TOOLS = "ChatRapid answers from a document and calls no tools: use ChatLocalLM to bind tools"
RAPID_INSTRUCTIONS = (
    "Answer the question using the document. Answer directly in one or two sentences, in the "
    "same language as the question."
)


Turns = tuple[tuple[str, str], ...]  # earlier chat turns: ("user" | "assistant", text)


def split_messages(
    messages: list[BaseMessage], document: str | None
) -> tuple[str, str, str, Turns]:
    """(instructions, document, question, earlier turns) from chat messages.

    The question is the last human message; the human and AI messages before it are the
    conversation so far (a follow-up about the document reads them). The document is
    ``document``, else the system messages named ``document`` (several: joined by a blank
    line); such a message is never an instruction (one beside ``document=`` was, and the
    target read the document twice).
    """
    system = [m for m in messages if isinstance(m, SystemMessage)]
    named = [str(m.text) for m in system if m.name == "document"]
    instructions = [str(m.text) for m in system if m.name != "document"]
    doc = document if document is not None else ("\n\n".join(named) if named else None)
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    if not humans:
        raise InputError("ChatRapid needs a human message with the question")
    if not doc:
        raise InputError(
            "ChatRapid needs a document (document= or a system message named 'document')"
        )
    turns = tuple(
        ("user" if isinstance(m, HumanMessage) else "assistant", str(m.text))
        for m in messages[: humans[-1]]
        if isinstance(m, (HumanMessage, AIMessage))
    )
    question = str(messages[humans[-1]].text)
    return "\n".join(instructions) or RAPID_INSTRUCTIONS, doc, question, turns


_BLOCK_TAGS = ("document", "evidence")  # the tags that delimit user text in a prompt


def layout(
    loaded: LoadedLM, instructions: str, context: str, question: str, history: Turns = ()
) -> tuple[list[int], list[int], list[int]]:
    """Token ids ``(head, context, tail)``; the cacheable prefix is ``head + context``.

    The three parts are tokenised separately so the prefix's ids never depend on the question.
    The context, the question and earlier turns are user text: chat control tokens in them are
    defused, so a document cannot open a system turn of its own, and ``<document>`` (and
    ``<evidence>``) tags broken (:func:`~specrag.defuse.break_tags`), so none can close the
    document's block and write outside it (a review, 2026-12-07).
    """
    tok = loaded.tokenizer
    specials = special_tokens(tok)

    def user_text(text: str) -> str:
        return defuse(break_tags(text, _BLOCK_TAGS), specials)

    context = user_text(context)
    turns = [(role, user_text(text)) for role, text in (*history, ("user", question))]
    document = f"<document>\n{_PLACEHOLDER}\n</document>"
    msgs = [{"role": "system", "content": instructions}]
    if turns[0][0] != "user":  # the document opens the conversation in a user turn
        msgs.append({"role": "user", "content": document})
    for role, text in turns:
        content = f"Question: {text}" if role == "user" else text
        if len(msgs) == 1:  # the first question shares the document's turn
            content = f"{document}\n\n{content}"
        msgs.append({"role": role, "content": content})
    opening: list[int] = []  # a template writes its own BOS
    if getattr(tok, "chat_template", None):
        rendered = apply_template(tok, msgs, tokenize=False)
    else:  # as ChatLocalLM's prompt: its turns, and the BOS its tokenizer adds (a review)
        rendered, opening = plain_transcript(msgs), leading_specials(tok)
    head, tail = rendered.split(_PLACEHOLDER, 1)

    def ids(text: str) -> list[int]:
        return [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]

    return opening + ids(head), ids(context), ids(tail)


TAIL_RESERVE = 96  # tokens kept for the question's turn when a document is cut


def fit(head: list[int], body: list[int], tail: list[int], limit: int) -> tuple[list[int], bool]:
    """Middle-truncate ``body`` so the prompt fits in ``limit`` tokens.

    A cut leaves room for a tail of at least :data:`TAIL_RESERVE` tokens, so a document too
    long for the context is cut the same way for every question up to that length: its
    prefix (chat head + document) is the same, and the prefix cache serves it.
    """
    if len(head) + len(tail) >= limit:
        raise InputError("the question is too long for the model's context window")
    if len(head) + len(body) + len(tail) <= limit:
        return body, False
    room = limit - len(head) - max(len(tail), TAIL_RESERVE)
    if room <= 0:  # a context too short for the reserve
        room = limit - len(head) - len(tail)
    half = room // 2
    return body[:half] + body[len(body) - (room - half) :], True


class ChatRapid(LocalChatBase):
    """RAPID decoding (arXiv 2502.20330) over local Hugging Face models sharing a tokenizer."""

    target_model: str = EMBEDDED_LM
    drafter_model: str | None = None  # None: the target model drafts for itself
    device: str = "auto"
    dtype: str = "auto"
    drafter_dtype: str = "auto"  # see specrag.models.loading.drafter_dtype
    temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)  # sampling: the target's top-p nucleus
    max_new_tokens: int = Field(
        default=128, ge=0, validation_alias=AliasChoices("max_new_tokens", "max_tokens")
    )
    # the ranges SpecRagContext's rapid_* settings take (a NaN eta answered "" silently)
    gamma: int = Field(default=10, ge=1)  # adaptive: the first round's, within 1-16
    transfer: Transfer = "shift"
    eta: float = Field(default=5.0, ge=0.0, allow_inf_nan=False)
    alpha: float = Field(default=0.1, ge=0.0, le=1.0)
    lam: float = Field(default=0.3, ge=0.0, le=1.0)
    adaptive_gamma: bool = True
    # see SpecRagContext.rapid_drafter_confidence
    min_draft_confidence: float = Field(default=0.6, ge=0.0, le=1.0)
    # eta 0: the drafter scores these first ids + its prompt's (0: every row)
    drafter_vocab: int = Field(default=32768, ge=0)
    drafter_tokens: int = Field(default=768, ge=1)
    chunk_tokens: int = Field(default=128, ge=8)
    embedding_model: str = EMBEDDED_LM
    drafter_retriever: DrafterRetriever | None = None  # None: document search, embedding_model
    use_prefix_cache: bool = True
    _not_identity: ClassVar[frozenset[str]] = frozenset(
        {"prefix_cache", "prefix_cache_bytes", "prefix_cache_disk_bytes"}
    )
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)  # None: a new one per call
    prefix_cache: Any = None  # a PrefixCache; None = the process-wide default
    # bounds of what this model's runs read and keep in the process-wide cache, whose own
    # budgets are the process's (specrag.preload sets them; a given prefix_cache: its own)
    prefix_cache_bytes: int = 4 * 2**30
    prefix_cache_disk_bytes: int = 8 * 2**30

    @property
    def _llm_type(self) -> str:
        return "specrag-rapid"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "target": self.target_model,
            "drafter": self.drafter_model or self.target_model,
            **self._decode_identity(),
            "gamma": self.gamma,
            "transfer": self.transfer,
            "eta": self.eta,
            "alpha": self.alpha,
            "lam": self.lam,
            "drafter_tokens": self.drafter_tokens,
            "chunk_tokens": self.chunk_tokens,
            # these change answers too (a cache must not serve one model's to the other)
            "drafter_dtype": self.drafter_dtype,
            "adaptive_gamma": self.adaptive_gamma,
            "min_draft_confidence": self.min_draft_confidence,
            "drafter_vocab": self.drafter_vocab,
            "embedding_model": self.embedding_model,
            "drafter_retriever": repr(self.drafter_retriever) if self.drafter_retriever else None,
        }

    def load(self) -> tuple[LoadedLM, LoadedLM]:
        """Load target and drafter, and the drafter's document search (once per process).

        The search's embedding model too: a first call loaded it inside its ``max_time``.
        """
        target, drafter, _ = self._models()
        if self.drafter_retriever is None:
            from specrag.models.loading import load_embeddings

            load_embeddings(self.embedding_model)
        return target, drafter

    def _models(self) -> tuple[LoadedLM, LoadedLM, str]:
        """Target, drafter and why a configured drafter was left out ("" if it was not).

        A drafter that cannot load or has another tokenizer is left out (one warning per
        process), and the target drafts for itself: RAPID failed, and the long document was
        answered from its retrieved chunks only.
        """
        refuse_int8_answer(self.dtype, "dtype")  # the target's
        target = load_lm(self.target_model, self.device, self.dtype)
        name, why = self.drafter_model or self.target_model, ""
        if name != self.target_model:
            dtype = drafter_dtype(self.drafter_dtype, self.dtype, self.device, False)
            key = (name, self.device, dtype)
            why = DRAFTER_FAILED.get(key, "")
            if not why:
                try:
                    drafter = load_lm(*key)
                except Exception as exc:  # noqa: BLE001 - any load failure leaves it out
                    why = DRAFTER_FAILED[key] = short_error(exc)
                else:
                    if same_tokenizer(target, drafter):
                        return target, drafter, ""
                    why = "its tokenizer is not the target's"
            if (name, target.name) not in _LEFT_OUT:  # one warning per pair and process
                _LEFT_OUT.add((name, target.name))
                log.warning(
                    "RAPID's drafter %s is left out (%s): the target drafts for itself", name, why
                )
            why = f"{name}: {why}"
        dtype = drafter_dtype(self.drafter_dtype, self.dtype, self.device, True)
        return target, load_lm(self.target_model, self.device, dtype), why

    def _default_retriever(self) -> DrafterRetriever:
        """The default: document search with ``embedding_model`` (imported only when needed)."""
        from specrag.indexing.document_search import drafter_context
        from specrag.models.loading import load_embeddings

        embeddings = load_embeddings(self.embedding_model)

        def retrieve(
            document: str, question: str, count: Any, chunk_tokens: int, budget: int
        ) -> str:
            return drafter_context(  # chunks cached per tokenizer: the target's counts them
                document, question, embeddings, count, chunk_tokens, budget, self.target_model
            )

        return retrieve

    def config(self) -> RapidConfig:
        """The engine configuration of this model."""
        return RapidConfig(
            gamma=self.gamma,
            transfer=self.transfer,
            eta=self.eta,
            alpha=self.alpha,
            lam=self.lam,
            adaptive_gamma=self.adaptive_gamma,
            min_draft_confidence=self.min_draft_confidence,
            drafter_vocab=self.drafter_vocab,
        )

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        """Not supported: RAPID answers from a document (``ChatLocalLM`` calls tools)."""
        raise NotImplementedError(NO_TOOLS)

    def _job(self, messages: list[BaseMessage], options: DecodeOptions) -> DecodeJob:
        # ChatLocalLM's options were taken and ignored (a forced tool_choice answered in text;
        # a review, 2026-12-07): refused, as bind_tools is
        if options.tools or options.tool_choice is not None:
            raise ValueError(NO_TOOLS)
        unused = [
            name
            for name in ("speculation", "draft", "drafter_messages", "prompt_feed")
            if getattr(options, name) is not None
        ]
        if unused:
            raise ValueError(
                f"{', '.join(f'{name}=' for name in unused)} not used by ChatRapid (its drafter "
                "reads drafter_context=, the retrieved chunks): use ChatLocalLM for them"
            )
        target, drafter, left_out = self._models()
        instructions, document, question, history = split_messages(messages, options.document)
        max_new = self._max_new(options)
        cfg = self.config()
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
        head, doc_ids, tail = layout(target, instructions, document, question, history)
        # an answer limit past the context caps the answer, as ChatLocalLM does
        limit = min(target.max_context, drafter.max_context) - 1
        prompt_len = len(head) + len(doc_ids) + len(tail)
        capped = answer_fit(max_new, prompt_len, limit)
        if capped < max_new:
            log.warning(
                "the answer is capped at %d tokens (max_new_tokens %d): the models read %d "
                "tokens at most, and the prompt has %d",
                capped,
                max_new,
                limit + 1,
                prompt_len,
            )
            max_new = capped
        doc_ids, truncated = fit(head, doc_ids, tail, target.max_context - max_new - 1)
        if truncated:
            log.warning("document middle-truncated to fit %d tokens", target.max_context)
        d_head, d_ids, d_tail = layout(drafter, instructions, drafter_context, question, history)
        d_ids, _ = fit(d_head, d_ids, d_tail, drafter.max_context - max_new - 1)
        target_prompt = head + doc_ids + tail
        drafter_prompt = d_head + d_ids + d_tail
        temperature = self.temperature if options.temperature is None else options.temperature
        sampler = Sampler(float(temperature), self.top_p)
        seed = self.seed if options.seed is None else options.seed
        generator = make_generator(target.device, sampler, seed)
        cache: PrefixCache = self.prefix_cache or DEFAULT_PREFIX_CACHE
        # the process-wide cache is shared by runs: this run's budgets bound only what it reads
        # and keeps there; the cache's own budgets are the process's (preload sets them), so
        # one run's 0 never empties the others' (a given prefix_cache keeps its own budgets)
        mine: dict[str, int] = {}
        if self.prefix_cache is None:
            mine = {"memory": self.prefix_cache_bytes, "disk": self.prefix_cache_disk_bytes}
        stats = RapidStats()
        hit = {"value": False}

        def produce(should_stop: StopCheck) -> Iterator[list[Token]]:
            if max_new <= 0:  # nothing to decode: neither model reads the document
                stats.finish_reason = "length"
                return
            prefix = head + doc_ids
            key = prefix_key(target.kv_key, prefix)
            t1 = own_clock()  # a hit on disk reads and checks the file: its time too
            target_state = cache.get(key, target.model, **mine) if self.use_prefix_cache else None
            # a hit may be partial: an earlier call's budget stopped its document prefill
            hit["value"] = target_state is not None and len(target_state) == len(prefix)
            if target_state is None:
                target_state = LMState(target.model, target.device, marks=VERIFIER_MARKS)
            if self.use_prefix_cache and len(target_state) < len(prefix):
                try:  # the budget applies to the document prefill too ...
                    target_state.extend(
                        prefix[len(target_state) :],
                        all_logits=False,
                        should_stop=prefill_stop(should_stop),
                    )
                except Stopped as stop:
                    # ... and what was prefilled is kept: the next question continues it
                    cache.put(key, target_state, **mine)
                    stats.finish_reason = stop.reason
                    return
                cache.put(key, target_state, **mine)
            sync(target.device)  # a GPU runs ahead of the clock
            timings["prefix_s"] = round(own_clock() - t1, 4)
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
                usable=len(target.tokenizer),
            )

        def metadata() -> dict[str, Any]:
            return {
                **stats.as_dict(),
                "prefix_cache_hit": hit["value"],
                "eta": cfg.eta,
                "gamma": cfg.first_gamma,  # the first round's (a larger one starts at 16)
                "transfer": cfg.transfer,
                "target_prompt_tokens": len(target_prompt),
                "drafter_prompt_tokens": len(drafter_prompt),
                "document_truncated": truncated,
                **({"drafter_left_out": left_out} if left_out else {}),
                **timings,
            }

        return DecodeJob(
            produce=produce,
            tokenizer=target.tokenizer,
            eos_ids=target.eos_token_ids,
            device=target.device,
            input_tokens=len(target_prompt),
            metadata=metadata,
            finish_reason=lambda: stats.finish_reason,
            model_name=f"rapid:{target.name}<-{drafter.name}",
            flatten=True,
        )
