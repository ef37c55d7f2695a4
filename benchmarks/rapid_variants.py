"""RAPID decode with ChatRapid settings varied, paired against target-only decode.

    python benchmarks/rapid_variants.py --json                   # the pair (make models-pair)
    python benchmarks/rapid_variants.py --models embedded --json  # SmolLM2 drafting for itself
    python benchmarks/rapid_variants.py --questions 5 --drafter-dtype bfloat16 \\
        --variants '{"every_row": {"drafter_vocab": 0}, "vocab32k": {"drafter_vocab": 32768}}'

``bench rapid``'s HotpotQA haystacks (its seed; 2K and 4K tokens unless ``--lengths``). Per
(question, length): target-only greedy decode (``bench_rapid.run_case``, paying its own
prefill), then each variant through ChatRapid at eta 0 with one shared prefix cache (the first
pays the document prefill, the rest reuse it; ``decode_s`` excludes prefills either way),
variants in an order rotated per question. Before any timing a short case runs every variant
and target-only (warm-up). The figure: decode tokens/s of a variant over target-only's
(``decode_speedup_vs_target``) and over the FIRST variant's (``vs_first``: paired, same
questions), each a mean with a 95% bootstrap interval over the questions. Settings a variant
does not name keep ChatRapid's defaults.

Writes results.json and table.md to --out (default results/rapid_variants); --json prints the
same document on stdout; progress goes to stderr.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from specrag_entry import loading  # the standard library only

with loading("rapid_variants"):  # a Ctrl-C in the seconds the package loads: one line, exit 130
    from specrag.evaluation.script import Parser, ScriptError, run_script
    from specrag.models.records import write_text

DEFAULT_VARIANTS = {"default": {}, "no_cutoff": {"min_draft_confidence": 0.0}}
FIXED = {  # ChatRapid settings this script sets itself
    "target_model",
    "drafter_model",
    "device",
    "dtype",
    "drafter_dtype",
    "eta",
    "max_new_tokens",
    "prefix_cache",
}
RESERVED_NAMES = {"target_only", "qid", "length"}  # keys of a results row
LENGTHS = "2048,4096"


def parse_variants(text: str) -> dict[str, dict[str, Any]]:
    """``--variants``: a JSON object of name -> ChatRapid settings (each an object).

    Each is checked by building the ChatRapid it describes (nothing loads), so a bad name or
    value is a one-line error before any model loads.
    """
    from pydantic import ValidationError

    from specrag.models.rapid_chat import ChatRapid

    try:
        variants = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"--variants is not JSON: {exc}") from None
    if not isinstance(variants, dict) or not variants:
        raise ScriptError("--variants must be a non-empty JSON object")
    for name, settings in variants.items():
        if name in RESERVED_NAMES:
            raise ScriptError(f"{name!r} cannot name a variant")
        if not isinstance(settings, dict):
            raise ScriptError(f"variant {name!r} is not a JSON object")
        unknown = sorted(set(settings) - set(ChatRapid.model_fields))
        if unknown:
            raise ScriptError(f"variant {name!r}: unknown {unknown}")
        fixed = sorted(set(settings) & FIXED)
        if fixed:
            raise ScriptError(f"variant {name!r}: {fixed} are set here")
        try:
            ChatRapid(**settings)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(map(str, problem["loc"]))
            raise ScriptError(f"variant {name!r}: {where}: {problem['msg']}") from None
    return variants


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ci(point: float | None, ci: list[float] | None) -> str:
    return "-" if point is None or ci is None else f"{point:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The summary as a Markdown table."""
    rows = [
        "| length | variant | decode vs target-only [95% CI] | vs first variant [95% CI] "
        "| acceptance | target / drafter passes per token |",
        "|---|---|---|---|---|---|",
    ]
    for length, by_name in summary.items():
        for name, s in by_name.items():
            rows.append(
                f"| {length} | {name} | {_ci(s['decode_speedup_vs_target'], s['ci95'])}"
                f" | {_ci(s['vs_first'], s['vs_first_ci95'])} | {_num(s['acceptance'])}"
                f" | {_num(s['target_passes_per_token'])} / "
                f"{_num(s['drafter_passes_per_token'])} |"
            )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", choices=["pair", "embedded"], default="pair")
    ap.add_argument("--questions", type=int, default=5, help="HotpotQA questions (default 5)")
    ap.add_argument(
        "--drafter-dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16", "int8"],
        help="the pair's 0.5B (auto: as bench rapid loads it)",
    )
    ap.add_argument("--variants", default=json.dumps(DEFAULT_VARIANTS), help="JSON object")
    ap.add_argument("--lengths", default=LENGTHS, help="haystack tokens, comma-separated")
    ap.add_argument("--out", default="results/rapid_variants", help="results folder")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON document")
    args = ap.parse_args(argv)
    if args.questions < 1:
        raise ScriptError("--questions must be >= 1")
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        raise ScriptError(f"--lengths {args.lengths!r}: not integers") from None
    if not lengths or min(lengths) < 512:
        raise ScriptError("--lengths must be token counts >= 512")
    variants = parse_variants(args.variants)

    from langchain_core.messages import HumanMessage
    from rich.console import Console

    from specrag.data.datasets import hotpot_questions, sample
    from specrag.decoding.prefix_cache import PrefixCache
    from specrag.evaluation import metrics
    from specrag.evaluation.bench_rapid import (
        MAX_NEW,
        SEED,
        build_document,
        rapid_tokens_per_s,
        run_case,
    )
    from specrag.graph.context import MODEL_PRESETS
    from specrag.models.loading import drafter_dtype, dtype_name, load_lm
    from specrag.models.pair import installed
    from specrag.models.rapid_chat import ChatRapid

    log = Console(stderr=True)
    if args.models == "pair" and not installed():
        raise ScriptError("the pair is not installed: run make models-pair")
    drafter_name, target_name = MODEL_PRESETS[args.models]
    same = drafter_name == target_name  # embedded: one model in both roles, one copy
    # as bench rapid loads them (auto: fp32 on a CPU, bf16 on a GPU); a load error: one line
    target = load_lm(target_name, "auto", "auto")
    dtype = drafter_dtype(args.drafter_dtype, "auto", "auto", same)
    drafter = target if same else load_lm(drafter_name, "auto", dtype)
    pool = hotpot_questions()
    picked = sample(pool, args.questions, SEED)
    distractors = sample(pool, 300, SEED + 1)

    def rapid(ex: Any, document: str, cache: PrefixCache, settings: dict[str, Any]) -> dict:
        model = ChatRapid(
            target_model=target.name,
            drafter_model=drafter.name,
            dtype=dtype_name(target.dtype),
            drafter_dtype=dtype_name(drafter.dtype),
            eta=0.0,
            max_new_tokens=MAX_NEW,
            prefix_cache=cache,
            **settings,
        )
        msg = model.invoke([HumanMessage(ex.question)], document=document)
        meta = msg.response_metadata
        return {
            "new_tokens": meta["new_tokens"],
            "decode_s": meta["decode_s"],
            "tokens_per_s": rapid_tokens_per_s(meta["new_tokens"], meta["decode_s"]),
            "target_passes": meta["target_forward_passes"],
            "drafter_passes": meta["drafter_forward_passes"],
            "acceptance": meta["acceptance_rate"],
            "draft_tokens": meta["draft_tokens"],
            "accepted_tokens": meta["accepted_tokens"],
            "answer": str(msg.content).strip(),
        }

    warm = build_document(picked[0], distractors, 512, target, random.Random("warm"))
    for settings in variants.values():
        rapid(picked[0], warm, PrefixCache(), settings)
    run_case(picked[0], warm, target, 0.0, "target_only", max_new=8, drafter=drafter)
    rows, start, names = [], time.time(), list(variants)
    for qi, ex in enumerate(picked):
        for length in lengths:
            rng = random.Random(f"{SEED}:{ex.id}:{length}")
            document = build_document(ex, distractors, length, target, rng)
            base = run_case(
                ex, document, target, 0.0, "target_only", max_new=MAX_NEW, drafter=drafter
            )
            row: dict[str, Any] = {
                "qid": ex.id,
                "length": length,
                "target_only": {k: base[k] for k in ("new_tokens", "tokens_per_s", "answer")},
            }
            cache = PrefixCache()
            for name in names[qi % len(names) :] + names[: qi % len(names)]:
                row[name] = rapid(ex, document, cache, variants[name])
            rows.append(row)
            log.print(
                f"{time.time() - start:.0f}s question {qi + 1}/{len(picked)} {length}: target "
                f"{base['tokens_per_s'] or 0:.2f} tok/s; "
                + ", ".join(f"{k} {row[k]['tokens_per_s'] or 0:.2f} tok/s" for k in names)
            )
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for length in lengths:
        rs = [r for r in rows if r["length"] == length]
        # paired: the questions whose answers have a decode speed under every system
        timed = [r for r in rs if all(r[k]["tokens_per_s"] for k in ["target_only", *names])]
        speeds = lambda name: {r["qid"]: r[name]["tokens_per_s"] for r in timed}  # noqa: E731
        summary[str(length)] = {}
        for name in names:
            point, ci = metrics.ratio_ci(
                speeds(name), speeds("target_only"), metrics.mean, seed=SEED
            )
            first, first_ci = metrics.ratio_ci(
                speeds(name), speeds(names[0]), metrics.mean, seed=SEED
            )
            new = sum(r[name]["new_tokens"] for r in rs)
            proposed = sum(r[name]["draft_tokens"] for r in rs)  # pooled over answers
            summary[str(length)][name] = {
                "decode_speedup_vs_target": point,
                "ci95": ci,
                "vs_first": first,
                "vs_first_ci95": first_ci,
                "questions_timed": len(timed),
                "acceptance": (
                    sum(r[name]["accepted_tokens"] for r in rs) / proposed if proposed else None
                ),
                "target_passes_per_token": sum(r[name]["target_passes"] for r in rs) / new,
                "drafter_passes_per_token": sum(r[name]["drafter_passes"] for r in rs) / new,
            }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "models": args.models,
        "questions": args.questions,
        "drafter_dtype": str(drafter.dtype),
        "variants": variants,
        "summary": summary,
        "rows": rows,
        "files": {"results": str(out / "results.json"), "table": str(out / "table.md")},
    }
    write_text(out / "results.json", json.dumps(doc, indent=1))
    write_text(out / "table.md", table(summary))
    log.print(
        f"results: {out / 'results.json'}, {out / 'table.md'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    if args.json:
        print(json.dumps(doc))
    else:
        print(table(summary), end="")
    return 0


if __name__ == "__main__":
    sys.exit(run_script("rapid_variants", main))
