"""Greedy identity of the speculative decoders on any device and dtype (the GPU check).

The claim: with greedy decoding, decoding with candidates (evidence n-grams, the merged
proposer with a drafter model) and RAPID at eta=0 emit exactly the tokens of the target
decoding alone, one token per pass. In exact arithmetic this holds by construction: a
candidate is kept only where it is the target's argmax. In floating point, the target's logits
at a position also depend on how the pass that computed them was shaped - a verify pass over
``1 + k`` tokens and a single-token step run different kernels with different reduction
orders - so where the top two logits (nearly) tie, the argmax can flip between the two. This
module counts how often that happens, per dtype, and where it does, how close the tie was.

Two steps, so that the second runs on a bare GPU machine:

* :func:`prepare` needs the whole package (datasets, prompts, tokenizer, document search): it
  writes the token-id prompts - serial-RAG prompts (terse SQuAD answers and "explain in
  detail" answers) and RAPID haystacks with the drafter's retrieved chunks;
* :func:`run` needs only torch, transformers and :mod:`specrag.decoding` (plus ``gguf`` to
  read a GGUF file): it loads the target and the drafter in each dtype and decodes every
  prompt with every method.
"""

from __future__ import annotations

import platform
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specrag.decoding.candidates import NgramProposer
from specrag.decoding.drafter import DrafterPolicy, DrafterProposer, MergedProposer
from specrag.decoding.rapid import RapidConfig, RapidStats, rapid_decode
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import DecodeStats, Step, Token, decode, prefill
from specrag.decoding.state import LMState, sync
from specrag.evaluation import metrics
from specrag.models.gguf import convert_gguf, converted_dir, is_converted

# on serial-RAG prompts; "rapid_eta0" on haystacks. "gpu_plan": the merged proposer as the
# chat model runs it where wide passes are cheap (a GPU): up to WIDE candidates per pass, none
# fewer after a rejection, n-gram matches before the drafter, 1-token matches where neither
# proposes, the drafter scoring its first DRAFTER_VOCAB ids (ChatLocalLM's wide_candidates and
# drafter_vocab) - the widest passes, where bf16 near-ties flip
METHODS = ("plain", "ngram", "merged", "gpu_plan")
WIDE, DRAFTER_VOCAB = 16, 32768
GREEDY = Sampler(0.0)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the drafter proposes wherever no strong n-gram does, from the first token on, full-length
# proposals (no confidence cut-off): this is a check of the verifier and its wide passes, not
# of the cost model (which would keep a same-size drafter out)
ALWAYS_DRAFT = DrafterPolicy(
    after_tokens=0, join_factor=0.0, min_acceptance=0.0, pay_check=False, min_confidence=0.0
)


def prepare(
    models: str = "embedded",
    terse: int = 16,
    long: int = 8,
    rapid: int = 2,
    rapid_tokens: int = 4096,
    seed: int = 7,
) -> dict[str, Any]:
    """Token-id prompts for :func:`run`, built with the package's own prompt code."""
    from specrag import prompts
    from specrag.data.datasets import hotpot_questions, sample, squad_paragraphs, squad_questions
    from specrag.evaluation.bench_pair import LONG_PROMPT, MAX_TOKENS
    from specrag.evaluation.bench_rapid import MAX_NEW, build_document
    from specrag.graph.context import MODEL_PRESETS
    from specrag.models.loading import embedded_gguf_path, load_lm
    from specrag.models.local import encode_chat
    from specrag.models.pair import PAIR, joined_gguf
    from specrag.models.rapid_chat import RAPID_INSTRUCTIONS, ChatRapid, layout

    drafter_name, target_name = MODEL_PRESETS[models]
    target = load_lm(target_name, "cpu", "float32")
    paragraphs = {p.id: p for p in squad_paragraphs()}
    rng = random.Random(seed)
    pool = list(paragraphs.values())

    def rag_case(q: Any, kind: str) -> dict[str, Any]:
        gold = [paragraphs[g] for g in q.gold_ids[:1]]
        others = [p for p in rng.sample(pool, 4) if p.title != gold[0].title][:2]
        chunks = [{"text": p.text, "source": p.title} for p in [*gold, *others]]
        rng.shuffle(chunks)
        question = LONG_PROMPT.format(question=q.question) if kind == "long" else q.question
        system = prompts.ANSWER_DETAILED_SYSTEM if kind == "long" else prompts.ANSWER_SYSTEM
        ids = encode_chat(target, prompts.evidence_messages(question, chunks, system))
        return {"id": q.id, "kind": kind, "prompt": ids, "max_new": MAX_TOKENS[kind]}

    answerable = [q for q in squad_questions() if q.answers]
    cases = [rag_case(q, "squad") for q in sample(answerable, terse, seed)]
    cases += [rag_case(q, "long") for q in sample(answerable, long, seed + 1)]

    retriever = ChatRapid()._default_retriever()
    count = lambda t: len(target.tokenizer(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    haystacks = []
    hotpot = hotpot_questions()
    for ex in sample(hotpot, rapid, seed):
        document = build_document(ex, hotpot, rapid_tokens, target, rng)
        head, doc, tail = layout(target, RAPID_INSTRUCTIONS, document, ex.question)
        chunks = retriever(document, ex.question, count, 128, 768)
        d_head, d_doc, d_tail = layout(target, RAPID_INSTRUCTIONS, chunks, ex.question)
        haystacks.append(
            {
                "id": ex.id,
                "prefix": head + doc,
                "tail": tail,
                "drafter_prompt": d_head + d_doc + d_tail,
                "max_new": MAX_NEW,
                # ChatRapid's cut-off, so the check runs the product's drafting rule
                "min_draft_confidence": ChatRapid.model_fields["min_draft_confidence"].default,
                "drafter_vocab": ChatRapid.model_fields["drafter_vocab"].default,
            }
        )

    def source(name: str) -> str:
        return str(joined_gguf(PAIR[name]) if name in PAIR else embedded_gguf_path())

    return {
        "models": models,
        "target": source(target_name),
        "drafter": source(drafter_name),
        "eos_ids": list(target.eos_token_ids),
        "cases": cases,
        "haystacks": haystacks,
    }


def _cache_root() -> Path:
    from specrag.paths import cache_dir  # stdlib only (SPECRAG_CACHE_DIR, else platformdirs)

    try:
        return cache_dir() / "models"
    except ImportError:  # a bare machine: no platformdirs, no SPECRAG_CACHE_DIR
        return Path("/tmp/specrag-cache/models")


def load_model(source: str, dtype: torch.dtype, device: torch.device) -> Any:
    """A causal LM from a model folder, a hub id, or a ``.gguf`` file.

    A GGUF file is de-quantized once to a float32 safetensors copy, and every dtype is loaded
    from that copy (cast on load): plain layers, so bf16 runs bf16 kernels (transformers can
    otherwise keep GGUF weights packed and compute in float32). The package itself converts
    once per dtype; the weights are the same de-quantized values, rounded to the dtype.
    """
    from transformers import AutoModelForCausalLM

    from specrag.errors import ModelLoadError

    path = Path(source)
    try:  # a corrupt file, a foreign folder, a hub id offline: one line (run_script)
        if path.suffix == ".gguf":
            folder = converted_dir(path, torch.float32, _cache_root())
            if not is_converted(folder):
                folder.parent.mkdir(parents=True, exist_ok=True)
                convert_gguf(path, folder, torch.float32)
            source = str(folder)
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ModelLoadError(f"cannot load model {source}: {reason}") from exc
    return model.to(device).eval()


def _collect(steps: Iterator[Step] | Iterator[list[Token]], device: torch.device) -> Decoded:
    """The tokens, and the time from the first emitted step to the end (device synced).

    Timing starts once the first step is out (its token ids were read back from the device, so
    the prefill has finished): every method is timed over the same span, its decoding.
    """
    out: list[Token] = []
    first_t, first_n = 0.0, 0
    for step in steps:
        assert isinstance(step, list), "no prior answer: decode never revises"
        out.extend(step)
        if not first_n:
            first_t, first_n = time.perf_counter(), len(out)
    sync(device)
    return Decoded(out, time.perf_counter() - first_t if first_n else 0.0, len(out) - first_n)


@dataclass
class Decoded:
    """One decode: tokens, decode seconds after the first step, tokens decoded in them."""

    tokens: list[Token]
    decode_s: float
    decode_tokens: int


def _first_difference(a: list[int], b: list[int]) -> int | None:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return n if n is not None or len(a) == len(b) else min(len(a), len(b))


def _replay(
    model: Any, prefix: list[int], prompt: list[int], plain: list[int], at: int, other: int
) -> dict[str, Any]:
    """The plain decode's logits at ``at``, replayed with the same passes as the reference.

    Returns the top-1 minus top-2 logit gap, the gap between the reference's token and the
    method's (``other``), the top logit, and whether the replay reproduced the reference token.
    """
    lm = LMState(model)
    if prefix:  # a haystack: the document prefix first, as the reference was prefilled
        lm.extend(prefix, all_logits=False)
    logits = prefill(lm, prompt)
    for token in plain[:at]:
        logits = lm.extend([token])[-1]
    top = torch.topk(logits, 2).values
    return {
        "plain_top2_logit_gap": round(float(top[0] - top[1]), 5),
        "plain_vs_method_token_logit_gap": round(float(logits[plain[at]] - logits[other]), 5),
        "top_logit": round(float(top[0]), 4),
        "replay_reproduced_plain": int(logits.argmax()) == plain[at],
    }


def _decode_case(
    method: str,
    target: Any,
    drafter: Any,
    case: dict[str, Any],
    eos: tuple[int, ...],
) -> tuple[list[Token], dict[str, Any]]:
    prompt, max_new = case["prompt"], case["max_new"]
    stats = DecodeStats()
    proposer: Any = None
    drafter_lm = None
    wide = method == "gpu_plan"
    if method != "plain":
        ngrams = NgramProposer({"prompt": prompt})
        proposer = ngrams
        if method in ("merged", "gpu_plan"):
            vocab = int(target.get_output_embeddings().weight.shape[0])
            drafter_lm = DrafterProposer(
                LMState(drafter),
                prompt,
                GREEDY,
                vocab=vocab,
                eos_ids=eos,
                vocab_first=DRAFTER_VOCAB if wide else 0,
            )
            proposer = MergedProposer(
                ngrams, drafter_lm, ALWAYS_DRAFT, ngrams_first=wide, single_matches=wide
            )
    steps = decode(
        LMState(target),
        prompt,
        max_new_tokens=max_new,
        sampler=GREEDY,
        eos_ids=eos,
        proposer=proposer,
        stats=stats,
        max_candidates=WIDE if wide else 8,  # decode's default
        shrink_k=not wide,
    )
    run = _collect(steps, next(target.parameters()).device)
    info = {
        "timed": (run.decode_s, run.decode_tokens),
        "proposed": dict(stats.proposed),
        "accepted": dict(stats.accepted),
        "target_passes": stats.forward_passes + 1,
        "new_tokens": len(run.tokens),
    }
    if drafter_lm is not None:
        info["drafter_passes"] = drafter_lm.stats.passes
    return run.tokens, info


def _rapid_case(
    target: Any, drafter: Any, hay: dict[str, Any], eos: tuple[int, ...], rapid: bool
) -> tuple[list[Token], dict[str, Any]]:
    """RAPID at eta=0, or the target alone prefilled as RAPID prefills it (prefix, then tail).

    Timed from the document prefix on: the tail's prefill, RAPID's drafter prefill, decoding.
    """
    prompt = hay["prefix"] + hay["tail"]
    lm = LMState(target)
    lm.extend(hay["prefix"], all_logits=False)
    device = next(target.parameters()).device
    sync(device)
    start = time.perf_counter()
    rs = RapidStats()
    steps: Any
    if rapid:
        steps = rapid_decode(
            lm,
            LMState(drafter),
            prompt,
            hay["drafter_prompt"],
            max_new_tokens=hay["max_new"],
            sampler=GREEDY,
            cfg=RapidConfig(
                eta=0.0,
                min_draft_confidence=hay.get("min_draft_confidence", 0.0),
                drafter_vocab=hay.get("drafter_vocab", 0),
            ),
            eos_ids=eos,
            stats=rs,
        )
    else:
        steps = decode(lm, prompt, max_new_tokens=hay["max_new"], sampler=GREEDY, eos_ids=eos)
    tokens = _collect(steps, device).tokens
    info: dict[str, Any] = {
        "timed": (time.perf_counter() - start, len(tokens)),
        "new_tokens": len(tokens),
        "proposed": {"drafter": rs.draft_tokens} if rapid else {},
        "accepted": {"drafter": rs.accepted_tokens} if rapid else {},
    }
    return tokens, info


def sources(
    spec: dict[str, Any], target: str | None = None, drafter: str | None = None
) -> tuple[str, str]:
    """The target's and the drafter's model files: as given, else the prepared ones.

    Where one model plays both roles in the prompts file, a target given here plays both.
    """
    target = target or str(spec["target"])
    if not drafter:
        drafter = target if spec["drafter"] == spec["target"] else str(spec["drafter"])
    return target, drafter


def run(
    spec: dict[str, Any],
    device: str,
    dtypes: list[str],
    target_source: str | None = None,
    drafter_source: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Decode every prepared prompt with every method in each dtype; compare to plain."""
    dev = torch.device(device)
    eos = tuple(spec["eos_ids"])
    target_src, drafter_src = sources(spec, target_source, drafter_source)
    out: dict[str, Any] = {
        "device": (
            torch.cuda.get_device_name(dev)
            if dev.type == "cuda"
            else f"{dev.type} ({platform.machine()}, {torch.get_num_threads()} threads)"
        ),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "target": Path(target_src).name,
        "drafter": Path(drafter_src).name,
        "cases": len(spec["cases"]),
        "haystacks": len(spec["haystacks"]),
        "dtypes": {},
        "tokens": {},
    }
    for name in dtypes:
        dtype = DTYPES[name]
        t0 = time.perf_counter()
        target = load_model(target_src, dtype, dev)
        drafter = target if drafter_src == target_src else load_model(drafter_src, dtype, dev)
        progress(f"{name}: models loaded in {time.perf_counter() - t0:.1f}s")
        with torch.inference_mode():
            # warm every method (kernels, allocator) before timing
            for method in METHODS if spec["cases"] else ():
                _decode_case(method, target, drafter, spec["cases"][0], eos)
            for rapid in (False, True) if spec["haystacks"] else ():
                _rapid_case(target, drafter, spec["haystacks"][0], eos, rapid)
            out["dtypes"][name], out["tokens"][name] = _run_dtype(
                spec, target, drafter, eos, progress, name
            )
        del target, drafter
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if len(dtypes) > 1:  # the reference itself across dtypes (not claimed identical)
        a, b = (out["tokens"][d]["plain"] for d in dtypes[:2])
        same = [a[k] == b[k] for k in a]
        out[f"plain_{dtypes[0]}_vs_{dtypes[1]}_same"] = f"{sum(same)}/{len(same)}"
    return out


def _run_dtype(
    spec: dict[str, Any],
    target: Any,
    drafter: Any,
    eos: tuple[int, ...],
    progress: Callable[[str], None],
    name: str,
) -> tuple[dict[str, Any], dict[str, dict[str, list[int]]]]:
    """Every case and haystack in one dtype; keys ``<kind>:<id>`` and ``haystack:<id>``."""
    tokens: dict[str, dict[str, list[int]]] = {m: {} for m in (*METHODS, "rapid_eta0")}
    infos: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in tokens}
    logprobs: dict[str, dict[str, list[float]]] = {m: {} for m in tokens}
    inputs: dict[str, tuple[list[int], list[int]]] = {}  # key -> (document prefix, prompt)
    for i, case in enumerate(spec["cases"]):
        key = f"{case['kind']}:{case['id']}"
        inputs[key] = ([], case["prompt"])
        for method in METHODS:
            toks, info = _decode_case(method, target, drafter, case, eos)
            tokens[method][key] = [t.id for t in toks]
            logprobs[method][key] = [t.logprob for t in toks]
            infos[method][key] = info
        progress(f"{name}: prompt {i + 1}/{len(spec['cases'])}")
    for hay in spec["haystacks"]:
        key = f"haystack:{hay['id']}"
        inputs[key] = (hay["prefix"], hay["prefix"] + hay["tail"])
        for method, rapid in (("plain", False), ("rapid_eta0", True)):
            toks, info = _rapid_case(target, drafter, hay, eos, rapid)
            tokens[method][key] = [t.id for t in toks]
            logprobs[method][key] = [t.logprob for t in toks]
            infos[method][key] = info
        progress(f"{name}: haystack {hay['id']}")
    summary: dict[str, Any] = {}
    divergences = []
    for method in (*METHODS[1:], "rapid_eta0"):
        same = 0
        proposed: dict[str, int] = {}
        accepted: dict[str, int] = {}
        for key, ids in tokens[method].items():
            ref = tokens["plain"][key]
            at = _first_difference(ref, ids)
            same += at is None
            for src, n in infos[method][key]["proposed"].items():
                proposed[src] = proposed.get(src, 0) + n
            for src, n in infos[method][key]["accepted"].items():
                accepted[src] = accepted.get(src, 0) + n
            if at is None:
                continue
            entry: dict[str, Any] = {"method": method, "case": key, "position": at}
            if at < min(len(ref), len(ids)):
                entry["plain"] = [ref[at], round(logprobs["plain"][key][at], 4)]
                entry["method_token"] = [ids[at], round(logprobs[method][key][at], 4)]
                entry |= _replay(target, *inputs[key], ref, at, ids[at])
            else:  # one output is a prefix of the other
                entry["lengths"] = [len(ref), len(ids)]
            divergences.append(entry)
        timed = {k: v["timed"] for k, v in infos[method].items()}
        base = {k: infos["plain"][k]["timed"] for k in timed}
        ratio, ci = metrics.ratio_ci(timed, base, metrics.per_token, seed=0)
        n = len(tokens[method])
        row: dict[str, Any] = {
            "identical": f"{same}/{n}",
            "identical_fraction": same / n if n else None,
            "proposed": proposed,
            "accepted": accepted,
            "rejected": sum(proposed.values()) - sum(accepted.values()),
            # seconds per token vs plain; RAPID: end to end from the document prefix on
            "time_per_token_vs_plain": ratio,
            "time_per_token_vs_plain_ci95": ci,
        }
        if method != "rapid_eta0":
            passes = sum(v["target_passes"] for v in infos[method].values())
            new = sum(v["new_tokens"] for v in infos[method].values())
            row["target_passes_per_token"] = passes / new if new else None
        summary[method] = row
    summary["divergences"] = divergences
    return summary, tokens


def markdown(result: dict[str, Any]) -> str:
    """A table per dtype (identical answers, proposals, time per token), then the differences."""
    lines = [
        f"device: {result['device']} | torch {result['torch']} | transformers "
        f"{result['transformers']} | target {result['target']} | drafter {result['drafter']} | "
        f"{result['cases']} RAG prompts, {result['haystacks']} RAPID haystacks",
        "",
        "| dtype | method | identical to plain | proposed | accepted | not accepted "
        "| time per token vs plain |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, rows in result["dtypes"].items():
        for method, row in rows.items():
            if method == "divergences":
                continue
            ratio, ci = row.get("time_per_token_vs_plain"), row.get("time_per_token_vs_plain_ci95")
            shown = "-" if ratio is None else f"{ratio:.2f}x"
            if ci:
                shown += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
            lines.append(
                f"| {name} | {method} | {row['identical']} | {sum(row['proposed'].values())} | "
                f"{sum(row['accepted'].values())} | {row['rejected']} | {shown} |"
            )
    lines.append("\nRAPID's time per token is end to end from the document prefix on.")
    for name, rows in result["dtypes"].items():
        for d in rows["divergences"]:
            where = (
                f"\n{name} {d['method']} on {d['case']}: first difference at token {d['position']}"
            )
            if "lengths" in d:
                lines.append(f"{where}: one output is a prefix of the other {d['lengths']}")
                continue
            lines.append(
                f"{where}: plain {d['plain']} vs {d['method_token']} (token, logprob); plain "
                f"top-2 logit gap {d['plain_top2_logit_gap']}, plain vs method token "
                f"{d['plain_vs_method_token_logit_gap']}, top logit {d['top_logit']}"
                + ("" if d["replay_reproduced_plain"] else " (replay did NOT reproduce plain)")
            )
    return "\n".join(lines) + "\n"
