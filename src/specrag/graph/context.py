"""Run-time settings: ONE dataclass, rendered by LangGraph Studio as a form.

Pass it as ``graph.ainvoke(inputs, context=SpecRagContext(...))``. Every field has a default
that runs fully offline on the embedded models.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from specrag import prompts
from specrag.errors import InputError
from specrag.models.options import DEVICE_TEXT, FLOAT_NAMES, INT8_NAMES, check_placement

COUNT_MAX = 2**24  # the most any count setting may be (tokens, chunks, MiB, characters)
DAY_S = 86400.0  # the most any duration may be: longer waits overflow the OS's timers


def _f(
    default: Any,
    description: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    allowed: str = "",
) -> Any:
    """A field with its description (Studio's form) and its allowed numeric range.

    ``allowed`` names the values a text field takes where its type does not (``device``).

    A whole-number setting with no upper bound of its own gets :data:`COUNT_MAX`: a count
    past what any store or tensor library takes (2**31 failed every search as an
    "OverflowError" inside retrieval) is refused with the other bad values.
    """
    if le is None and isinstance(default, int) and not isinstance(default, bool):
        le = COUNT_MAX
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le)) if v is not None}
    named = {"allowed": allowed} if allowed else {}
    return field(default=default, metadata={"description": description, **bounds, **named})


def _range_text(meta: Any) -> str:
    parts = []
    if "gt" in meta:
        parts.append(f"> {meta['gt']}")
    if "ge" in meta:
        parts.append(f">= {meta['ge']}")
    if "le" in meta:
        parts.append(f"<= {meta['le']}")
    return " and ".join(parts)


# models preset -> (draft_model, answer_model)
MODEL_PRESETS: dict[str, tuple[str, str]] = {
    "embedded": ("embedded", "embedded"),
    "pair": ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"),
}


@dataclass(kw_only=True, frozen=True)  # checked once, in __post_init__: no unchecked edits
class SpecRagContext:
    """Models, budgets, thresholds and prompts of one specrag run."""

    # --- models ---------------------------------------------------------------------------
    models: Literal["embedded", "pair"] = _f(
        "embedded",
        "Model preset: 'embedded' = SmolLM2-135M-Instruct drafts and answers; 'pair' = "
        "Qwen2.5-Coder-0.5B-Instruct drafts (before and after retrieval, and for RAPID), "
        "Qwen2.5-Coder-1.5B-Instruct answers (install: `make models-pair`).",
    )
    draft_model: str = _f(
        "",
        "Drafter: empty = from `models`; 'embedded' (SmolLM2-135M-Instruct), "
        "'qwen2.5-coder-0.5b'/'qwen2.5-coder-1.5b' (the pair), 'hf:<hub id or path>' for any "
        "local Hugging Face causal LM, or 'provider:model' for init_chat_model "
        "(e.g. 'openai:gpt-4o-mini'). An explicit value wins over the preset.",
    )
    answer_model: str = _f(
        "", "Answer (target) model: empty = from `models`; same forms as draft_model."
    )
    device: str = _f(
        "auto",
        "Device for local language models: auto = the current CUDA GPU where there is one, "
        "else the CPU. The embedding model (`embedding_model`) runs on the CPU whatever this "
        "says.",
        allowed=DEVICE_TEXT,
    )
    dtype: str = _f(
        "auto",
        "dtype for local models: auto (fp32 on CPU, bf16 on a GPU with native bf16, else fp32), "
        "float32, bfloat16, float16 "
        "(or fp32, bf16, fp16).",
        allowed=", ".join(FLOAT_NAMES),
    )
    drafter_dtype: str = _f(
        "auto",
        "dtype of a drafter that is not the answer model: auto (int8 where the answer model "
        "runs fp32 or bf16 on an x86 CPU - it only proposes, the answer model verifies - else "
        "dtype), "
        "float32, bfloat16, float16 (or fp32, bf16, fp16), int8 or qint8 (CPU only).",
        allowed=", ".join(FLOAT_NAMES + INT8_NAMES),
    )
    embedding_model: str = _f(
        "embedded", "Embeddings: 'embedded' (all-MiniLM-L6-v2) or a sentence-transformers path/id."
    )
    index_dir: str = _f("", "Chroma directory; empty = index/ in the data dir (SPECRAG_DATA_DIR).")
    index_url: str = _f(
        "",
        "A Chroma server (http://HOST:PORT of `chroma run --path DIR --port N`) holding the "
        "index instead of index_dir: one index shared by processes and hosts.",
    )
    collection: str = _f(
        "specrag",
        "Chroma collection name: 3-512 letters, digits, '.', '_' or '-', starting and ending "
        "with a letter or digit (at most 200 in a local index, whose files beside it are named "
        "after it).",
    )
    # --- retrieval ------------------------------------------------------------------------
    top_k: int = _f(3, "Chunks retrieved per question.", ge=1, le=10_000)
    retrieval: Literal["dense", "bm25", "hybrid"] = _f(
        "hybrid",
        "dense: MiniLM embeddings; bm25: lexical (bm25s, kept in step with the index); hybrid: "
        "both fused by reciprocal rank fusion. hybrid is the default: recall@3 0.915 vs dense "
        "0.843 (+0.072 [+0.063, +0.080]) and bm25 0.895 on all 5,928 answerable SQuAD v2 dev "
        "questions (bench retrieval, 2026-11-30).",
    )
    relevance_threshold: float = _f(
        0.2, "Minimum cosine similarity for a chunk to count as evidence.", ge=-1.0, le=1.0
    )
    retrieval_timeout_s: float = _f(
        3.0,
        "Retrieval budget; past it the run takes the fallback route (or answers from the "
        "relevant evidence earlier batches found; a long document still takes "
        "rapid_generate).",
        gt=0,
        le=DAY_S,
    )
    added_retrieval_latency_s: float = _f(
        0.0,
        "INJECTED delay before retrieval results return (models a remote store; benchmarks).",
        ge=0,
        le=DAY_S,
    )
    added_batch_latency_s: float = _f(
        0.0,
        "INJECTED delay before each retrieval batch after the first (models slower sources: "
        "a remote store, a reranker; benchmarks).",
        ge=0,
        le=DAY_S,
    )
    answer_policy: Literal["wait", "incremental"] = _f(
        "wait",
        "wait: the answer starts once retrieval has returned every batch; incremental: it "
        "starts from the first batch, each later batch (past incremental_grace_s) rebuilds the "
        "prompt and re-verifies the tokens so far (retracting what the new evidence changes); "
        "greedy answers are identical.",
    )
    incremental_grace_s: float = _f(
        0.1,
        "incremental: before its first prefill the answer takes in the batches already there "
        "or arriving within this many seconds (part of the answer budget); they join the first "
        "prompt (no rebuild). A local store delivers the rest within it; a slower source "
        "costs at most this much of the first token's time.",
        ge=0,
        le=DAY_S,
    )
    # --- draft ----------------------------------------------------------------------------
    draft_policy: Literal["until_retrieval", "complete", "off"] = _f(
        "until_retrieval",
        "until_retrieval: draft while retrieval runs and stop within one token (or 20 ms) of it "
        "delivering evidence (a failed or empty retrieval lets the draft run on: it may be the "
        "answer); complete: draft to the end or the budget; off: no draft.",
    )
    draft_timeout_s: float = _f(
        2.0, "Draft budget (the decode loop itself stops at it).", gt=0, le=DAY_S
    )
    draft_temperature: float = _f(0.8, "Draft sampling temperature.", ge=0)
    draft_max_tokens: int = _f(64, "Maximum draft tokens.", ge=1)
    min_draft_tokens: int = _f(
        6, "A draft with fewer tokens is not usable (route: generate).", ge=0
    )
    confidence_threshold: float = _f(
        0.35,
        "Drafts with confidence exp(mean token log-prob) below this go to generate.",
        ge=0,
        le=1,
    )
    # --- answer ---------------------------------------------------------------------------
    refine_mode: Literal["verify", "rewrite"] = _f(
        "verify",
        "verify: answer from the evidence with the generate prompt; the draft only feeds "
        "speculative candidates (greedy output = serial RAG). rewrite: the verifier reads and "
        "edits the draft (can copy its errors).",
    )
    speculation: Literal["draft+prompt", "prompt", "none"] = _f(
        "draft+prompt", "Candidate sources for draft-guided decoding of the answer."
    )
    refine_temperature: float = _f(
        0.0,
        "Temperature of refine/generate (0 = greedy: answers identical to serial RAG and "
        "reproducible). Chosen from the full bench rag run of 2026-11-30: T=0.2 gained nothing "
        "measurable (contains-gold -0.017 [-0.050, 0.000], F1 +0.006 [-0.010, 0.024], n=60).",
        ge=0,
    )
    answer_max_tokens: int = _f(128, "Maximum answer tokens.", ge=1)
    stop_at_invented_turns: bool = _f(
        True,
        "End draft and answer text before an invented next turn ('\\nQuestion:', "
        "'\\nUser:', ...) or evidence block ('<evidence'; see prompts.INVENTED_TURNS).",
    )
    answer_timeout_s: float = _f(
        60.0,
        "One answer budget for the run: refine or rapid_generate, and a generate that runs "
        "after either failed, share it (prefill included).",
        gt=0,
        le=DAY_S,
    )
    drafter_max_cost_ratio: float = _f(
        0.5,
        "A separate drafter proposes answer tokens only if its measured decode step costs at "
        "most this fraction of the answer model's (a same-size drafter would not save time).",
        gt=0,
    )
    drafter_after_tokens: int = _f(
        8, "The drafter joins the answer's decoding no earlier than this many tokens.", ge=0
    )
    drafter_join_factor: float = _f(
        2.0,
        "Ski rental: the drafter joins once the answer has decoded for this many times its "
        "estimated prefill (target prefill x the drafter's prefill ratio: as its earlier joins "
        "on this machine paid it, else as measured at load); 0 = as soon as "
        "drafter_after_tokens allows. A terse "
        "answer never pays the drafter's prefill (measured on the pair, see README).",
        ge=0,
    )
    drafter_pay_check: bool = _f(
        True,
        "Time every verify pass; after 4 rounds the drafter (or n-gram matches shorter than 3 "
        "tokens) stops if its rounds cost more seconds per emitted token than a plain step "
        "of the same answer (on CPU a wide pass costs ~2x a step: see README).",
    )
    drafter_confidence: float = _f(
        0.7,
        "A drafter proposal ends after the first token the drafter itself gives a probability "
        "below this (0 = always k tokens): unsure drafter tokens are often rejected and widen "
        "the verify pass (measured on the pair: see README).",
        ge=0,
        le=1,
    )
    drafter_evidence: int = _f(
        0,
        "Evidence blocks a separate drafter reads in refine/generate: the top-ranked this many "
        "(0 = all, the answer model's whole prompt). Fewer blocks make its prefill cheaper but "
        "its proposals fewer; the answer model still reads every block and verifies every "
        "token, so answers are unchanged (on the pair's long set 1 block was level with all: "
        "see README).",
        ge=0,
    )
    drafter_vocab: int = _f(
        32768,
        "Output rows a separate drafter scores (refine/generate, and RAPID at rapid_eta 0): the "
        "first this many token ids plus every id of its prompt and the end tokens; 0 = all "
        "rows. A smaller output layer makes each drafter step cheaper; the target still "
        "verifies every token, so answers are unchanged (measured on the pair: see README).",
        ge=0,
    )
    history_tokens: int = _f(
        384,
        "Chat interface: earlier turns given to the draft and answer prompts, newest first, "
        "up to this many answer-model tokens (0 = none).",
        ge=0,
    )
    query_rewrite: Literal["off", "concat", "model"] = _f(
        "concat",
        "Follow-up questions with history: 'concat' searches with the previous question "
        "prepended, 'model' asks the draft model for a self-contained query (within half the "
        "retrieval budget; concat if it is late or fails), 'off' searches "
        "the question as asked. It reads the history history_tokens keeps (0: none, so no "
        "rewrite). Default chosen from the multi-turn check in the README.",
    )
    max_question_chars: int = _f(2000, "Longer questions are rejected.", ge=1)
    # --- long documents (RAPID) -------------------------------------------------------------
    long_document_tokens: int = _f(
        1024,
        "Documents longer than this (target-model tokens) take the rapid_generate route "
        "(with a local answer model; a remote one answers from the retrieved chunks).",
        ge=0,
    )
    rapid_gamma: int = _f(
        10,
        "RAPID draft tokens per step, at the start: it adapts (+1 after a fully accepted "
        "step, -1 after a rejection) within 1-16, so a larger value starts at 16.",
        ge=1,
    )
    rapid_transfer: Literal["shift", "mixture", "none"] = _f(
        "shift", "RAPID knowledge-transfer rule (applied when rapid_eta > 0)."
    )
    rapid_eta: float = _f(
        0.0,
        "RAPID shift strength (0 = lossless: the target's own answer). Chosen from the full "
        "bench rapid run of 2026-11-30 (5 questions per length): eta=5 halved F1 at 2K and 8K "
        "(0.10 vs 0.18, 0.09 vs 0.19) for no end-to-end gain on CPU.",
        ge=0,
    )
    rapid_drafter_confidence: float = _f(
        0.6,
        "RAPID: a round stops drafting before a position where the drafter's most likely "
        "token has a probability below this (its first draft token is always proposed; 0 = "
        "off): an unsure draft token is often rejected and each wasted one costs a drafter "
        "step (measured on the pair: see README).",
        ge=0,
        le=1,
    )
    rapid_drafter_tokens: int = _f(
        768, "Token budget of retrieved chunks given to the RAPID drafter.", ge=1
    )
    rapid_chunk_tokens: int = _f(128, "Chunk size (tokens) for splitting a long document.", ge=8)
    prefix_cache_mib: int = _f(
        4096,
        "RAPID: memory (MiB) for long documents' KV prefixes kept across questions in this "
        "process, on the answer model's device (GPU memory on CUDA), least recently used "
        "dropped first; a prefix larger than this is not kept; 0 = none. Runs share the "
        "cache: a run's value bounds what it reads and keeps, within the cache's own budget "
        "(4096 until `preload` sets it; the CLI: from its run's settings).",
        ge=0,
    )
    prefix_cache_disk_mib: int = _f(
        8192,
        "RAPID: disk (MiB) for the same prefixes in the cache dir (`prefix-kv/`), so a new "
        "process skips a repeated document's prefill; least recently used pruned first; 0 = "
        "none (set by `preload`, as the CLI does: prunes every saved prefix - the folder is "
        "shared by the processes on this machine). Shared as prefix_cache_mib is (8192 until "
        "`preload` sets it).",
        ge=0,
    )
    seed: int = _f(
        -1,
        "Sampling seed; -1 draws a new one per run (reported in the output as `seed`). The "
        "answer's seed; the draft's own is drawn from it (the draft's tokens are the answer's "
        "candidates: one random stream for both skewed sampled answers).",
        ge=-1,
        le=2**64 - 1,  # torch.Generator's largest
    )
    # --- prompts ----------------------------------------------------------------------------
    draft_prompt: str = _f(prompts.DRAFT_SYSTEM, "System prompt of the draft.")
    answer_prompt: str = _f(prompts.ANSWER_SYSTEM, "System prompt of generate / verify.")
    rewrite_prompt: str = _f(prompts.REWRITE_SYSTEM, "System prompt of rewrite refine.")

    def __post_init__(self) -> None:
        """Check every field in one place: its type, its allowed values, its range."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value, hint = getattr(self, f.name), hints[f.name]
            if typing.get_origin(hint) is Literal:
                allowed = typing.get_args(hint)
                if value not in allowed:
                    raise InputError(
                        f"invalid configuration: {f.name}={value!r} "
                        f"(allowed: {', '.join(map(str, allowed))})"
                    )
                continue
            if hint is bool:
                ok = isinstance(value, bool)
            elif hint is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif hint is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
                try:  # an int too large for a float (10**400) raised OverflowError here
                    ok = ok and math.isfinite(value)
                except OverflowError:
                    ok = False
            else:
                ok = isinstance(value, str) if hint is str else True
            if not ok:
                kinds = {bool: "true or false", int: "a whole number", float: "a finite number"}
                raise InputError(
                    f"invalid configuration: {f.name}={value!r} "
                    f"(expected {kinds.get(hint, getattr(hint, '__name__', hint))})"
                )
            meta = f.metadata
            if (
                ("ge" in meta and value < meta["ge"])
                or ("gt" in meta and value <= meta["gt"])
                or ("le" in meta and value > meta["le"])
            ):
                raise InputError(
                    f"invalid configuration: {f.name}={value!r} (allowed: {_range_text(meta)})"
                )

        for name in ("draft_model", "answer_model", "embedding_model"):
            # kept stripped, as checked: 'embedded ' passed the check below, then every run
            # failed to load it (Studio's form, a dict context; the CLI strips --set values)
            object.__setattr__(self, name, getattr(self, name).strip())
        check_placement(self.device, self.dtype, self.drafter_dtype, "invalid configuration: ")
        from specrag.models.registry import SPEC_FORMS, is_known_spec

        for name in ("draft_model", "answer_model"):
            spec = getattr(self, name)
            if spec.endswith(":") or spec.startswith(":"):  # 'hf:' read the current folder
                raise InputError(
                    f"invalid configuration: {name}={spec!r} names no model "
                    "(use 'hf:<hub id or path>' or 'provider:model')"
                )
            if not is_known_spec(spec):  # told before any model loads, not after the index opened
                raise InputError(
                    f"invalid configuration: unknown model {name}={spec!r} (use {SPEC_FORMS})"
                )
        if not self.embedding_model:
            raise InputError(
                "invalid configuration: embedding_model='' names no model "
                "(use 'embedded' or a sentence-transformers path or hub id)"
            )
        from specrag.paths import looks_like_path, user_path

        # a path the OS refuses (too long, ~user of no such user, a folder it may not enter):
        # told here, not as an unexpected error where the index or the model first opens
        if self.index_dir:
            user_path(self.index_dir, "invalid configuration: index_dir")
        if looks_like_path(self.embedding_model):
            user_path(self.embedding_model, "invalid configuration: embedding_model")

    @classmethod
    def from_overrides(cls, overrides: dict[str, Any]) -> SpecRagContext:
        """Build from ``{"field": value}`` (e.g. CLI ``--set key=value``), coercing strings."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in fields:
                raise InputError(unknown_key(key, fields))
            default = fields[key].default
            if isinstance(value, str) and not isinstance(default, str):
                try:
                    if isinstance(default, bool):
                        flags = {"1": True, "true": True, "yes": True, "on": True}
                        flags.update({"0": False, "false": False, "no": False, "off": False})
                        if value.lower() not in flags:
                            raise ValueError(value)
                        value = flags[value.lower()]
                    elif isinstance(default, int):
                        value = int(value)
                    elif isinstance(default, float):
                        value = float(value)
                except ValueError as exc:
                    expected = (
                        "true or false"
                        if isinstance(default, bool)
                        else "a whole number"
                        if isinstance(default, int)
                        else "a number"
                    )
                    raise InputError(
                        f"invalid configuration: {key}={value!r} (expected {expected})"
                    ) from exc
            kwargs[key] = value
        return cls(**kwargs)

    @property
    def draft_spec(self) -> str:
        """The drafter's model spec: ``draft_model``, or the ``models`` preset's drafter."""
        return self.draft_model or MODEL_PRESETS[self.models][0]

    @property
    def drafter_runs(self) -> bool:
        """Whether a run may call the draft model: to draft, or to rewrite a follow-up query.

        Such a model loads before the run (``prepare``, ``preload``), outside every budget.
        """
        return self.draft_policy != "off" or self.query_rewrite == "model"

    @property
    def answer_spec(self) -> str:
        """The answer model's spec: ``answer_model``, or the ``models`` preset's target."""
        return self.answer_model or MODEL_PRESETS[self.models][1]

    @property
    def draft_dtype(self) -> str:
        """The dtype the drafter loads in (``drafter_dtype`` resolved; see the field)."""
        from specrag.models.loading import drafter_dtype

        same = self.draft_spec == self.answer_spec
        return drafter_dtype(self.drafter_dtype, self.dtype, self.device, same)

    def stop_sequences(self) -> tuple[str, ...]:
        """Stop sequences for draft and answer calls."""
        return prompts.INVENTED_TURNS if self.stop_at_invented_turns else ()

    def describe(self) -> list[tuple[str, Any, str]]:
        """(name, value, description) for every field - the README table and `specrag config`."""
        return [
            (f.name, getattr(self, f.name), f.metadata.get("description", ""))
            for f in dataclasses.fields(self)
        ]

    @classmethod
    def allowed(cls) -> dict[str, str]:
        """What each field accepts, as text ("" where any value of its type does)."""
        hints = typing.get_type_hints(cls)
        out = {}
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if typing.get_origin(hint) is Literal:
                out[f.name] = ", ".join(map(str, typing.get_args(hint)))
            elif hint is bool:
                out[f.name] = "true, false"
            elif "allowed" in f.metadata:
                out[f.name] = f.metadata["allowed"]
            else:
                out[f.name] = _range_text(f.metadata)
        return out


def unknown_key(key: str, names: typing.Iterable[str]) -> str:
    """The error line of a setting no context has, with the closest name if one is close."""
    close = difflib.get_close_matches(key, list(names), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown config key {key!r}{hint} (see `specrag config`)"


def _refusing_unknown_keys(init: typing.Callable[..., None]) -> typing.Callable[..., None]:
    """``init`` that refuses an unknown keyword in one :class:`InputError` line.

    ``SpecRagContext(nosuch=1)`` and a graph run's ``context={"nosuch": 1}`` (LangGraph builds
    the context from the dict) raised Python's TypeError, unlike every other bad setting.
    """
    names = frozenset(f.name for f in dataclasses.fields(SpecRagContext))

    @functools.wraps(init)
    def checked(self: SpecRagContext, *args: Any, **kwargs: Any) -> None:
        if unknown := sorted(set(kwargs) - names):
            raise InputError(unknown_key(unknown[0], names))
        init(self, *args, **kwargs)

    return checked


SpecRagContext.__init__ = _refusing_unknown_keys(SpecRagContext.__init__)  # type: ignore[method-assign]


# Kept although not "printable": the joiners inside Persian and Indic words and emoji sequences
JOINERS = "\u200c\u200d"


def _question_char(ch: str) -> str:
    """``ch`` as a question keeps it.

    A space of any kind (a no-break space pasted from a web page, U+3000 in CJK text) as a
    space, a control or format character as nothing.
    """
    if ch.isprintable() or ch in "\n\t" or ch in JOINERS:
        return ch
    return " " if ch.isspace() else ""


def validate_question(question: str, max_chars: int) -> str:
    """The question without control characters, or a one-line :class:`InputError`.

    Raised when it is empty or longer than ``max_chars`` (the CLI, the graph's ``prepare``
    and the tool check it alike).
    """
    if question is not None and not isinstance(question, str):  # a graph input of JSON
        raise InputError(f"the question must be text, not {type(question).__name__}")
    cleaned = "".join(_question_char(ch) for ch in question or "").strip()
    if not cleaned.strip(JOINERS + " \n\t"):  # joiners alone are no question either
        raise InputError("the question is empty")
    if len(cleaned) > max_chars:
        raise InputError(f"the question is {len(cleaned)} characters long (max {max_chars})")
    return cleaned
