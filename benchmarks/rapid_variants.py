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

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_VARIANTS = {"default": {}, "no_cutoff": {"min_draft_confidence": 0.0}}
LENGTHS = "2048,4096"


def parse_variants(text: str) -> dict[str, dict[str, Any]]:
    """``--variants``: a JSON object of name -> ChatRapid settings (each an object)."""
    from specrag.models.rapid_chat import ChatRapid

    try:
        variants = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"rapid_variants: error: --variants is not JSON: {exc}") from None
    if not isinstance(variants, dict) or not variants:
        raise SystemExit("rapid_variants: error: --variants must be a non-empty JSON object")
    for name, settings in variants.items():
        if not isinstance(settings, dict):
            raise SystemExit(f"rapid_variants: error: variant {name!r} is not a JSON object")
        unknown = sorted(set(settings) - set(ChatRapid.model_fields))
        if unknown:
            raise SystemExit(f"rapid_variants: error: variant {name!r}: unknown {unknown}")
    return variants


def table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The summary as a Markdown table."""
    rows = [
        "| length | variant | decode vs target-only [95% CI] | vs first variant [95% CI] "
        "| acceptance | target / drafter passes per token |",
        "|---|---|---|---|---|---|",
    ]
    for length, by_name in summary.items():
        for name, s in by_name.items():
            lo, hi = s["ci95"]
            flo, fhi = s["vs_first_ci95"]
            rows.append(
                f"| {length} | {name} | {s['decode_speedup_vs_target']:.3f} [{lo:.3f}, {hi:.3f}]"
                f" | {s['vs_first']:.3f} [{flo:.3f}, {fhi:.3f}] | {s['acceptance']:.3f}"
                f" | {s['target_passes_per_token']:.3f} / {s['drafter_passes_per_token']:.3f} |"
            )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", choices=["pair", "embedded"], default="pair")
    ap.add_argument("--questions", type=int, default=5, help="HotpotQA questions (default 5)")
    ap.add_argument(
        "--drafter-dtype", default="auto", help="the pair's 0.5B (auto: as bench rapid loads it)"
    )
    ap.add_argument("--variants", default=json.dumps(DEFAULT_VARIANTS), help="JSON object")
    ap.add_argument("--lengths", default=LENGTHS, help="haystack tokens, comma-separated")
    ap.add_argument("--out", default="results/rapid_variants", help="results folder")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON document")
    args = ap.parse_args(argv)
    if args.questions < 1:
        raise SystemExit("rapid_variants: error: --questions must be >= 1")
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(
            f"rapid_variants: error: --lengths {args.lengths!r}: not integers"
        ) from None
    if not lengths or min(lengths) < 512:
        raise SystemExit("rapid_variants: error: --lengths must be token counts >= 512")
    variants = parse_variants(args.variants)

    from langchain_core.messages import HumanMessage
    from rich.console import Console

    from specrag.data.datasets import hotpot_questions, sample
    from specrag.decoding.prefix_cache import PrefixCache
    from specrag.evaluation import metrics
    from specrag.evaluation.bench_rapid import MAX_NEW, SEED, build_document, run_case
    from specrag.graph.context import MODEL_PRESETS
    from specrag.models.loading import drafter_dtype, dtype_name, load_lm
    from specrag.models.pair import installed
    from specrag.models.rapid_chat import ChatRapid

    log = Console(stderr=True)
    if args.models == "pair" and not installed():
        raise SystemExit("rapid_variants: error: the pair is not installed: run make models-pair")
    drafter_name, target_name = MODEL_PRESETS[args.models]
    target = load_lm(target_name, "auto", "float32")
    same = drafter_name == target_name  # embedded: one model in both roles, one copy
    dtype = drafter_dtype(args.drafter_dtype, "float32", "auto", same)
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
            "tokens_per_s": (meta["new_tokens"] - 1) / meta["decode_s"],
            "target_passes": meta["target_forward_passes"],
            "drafter_passes": meta["drafter_forward_passes"],
            "acceptance": meta["acceptance_rate"],
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
                f"{base['tokens_per_s']:.2f} tok/s; "
                + ", ".join(
                    f"{k} {row[k]['tokens_per_s'] / base['tokens_per_s']:.2f}x" for k in names
                )
            )
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for length in lengths:
        rs = [r for r in rows if r["length"] == length]
        speed = lambda name: {r["qid"]: r[name]["tokens_per_s"] for r in rs}  # noqa: E731
        summary[str(length)] = {}
        for name in names:
            point, ci = metrics.ratio_ci(speed(name), speed("target_only"), metrics.mean, seed=SEED)
            first, first_ci = metrics.ratio_ci(
                speed(name), speed(names[0]), metrics.mean, seed=SEED
            )
            new = sum(r[name]["new_tokens"] for r in rs)
            summary[str(length)][name] = {
                "decode_speedup_vs_target": point,
                "ci95": ci,
                "vs_first": first,
                "vs_first_ci95": first_ci,
                "acceptance": metrics.mean([r[name]["acceptance"] for r in rs]),
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
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    (out / "table.md").write_text(table(summary))
    log.print(f"results: {out / 'results.json'}, {out / 'table.md'}")
    if args.json:
        print(json.dumps(doc))
    else:
        print(table(summary), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
