"""Greedy identity of speculative decoding on a GPU (or any device), per dtype.

    # on a machine with the package installed: prompts, then the check, in one go
    python benchmarks/gpu_identity.py run --models pair --device cuda --dtypes bfloat16,float32

    # or in two steps, the second on a bare GPU machine with torch, transformers and gguf
    # only (this checkout's src/ is used; --target/--drafter name the model files there)
    python benchmarks/gpu_identity.py prepare --models embedded --out prompts.json
    python benchmarks/gpu_identity.py run --prompts prompts.json --target M.gguf --device cuda

Writes results.json and table.md to --out (default results/identity); --json prints the
results as one JSON document on stdout; progress goes to stderr.
"""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path


def engines_only() -> None:
    """Make ``specrag.decoding`` importable where the graph's dependencies are missing.

    ``specrag/__init__`` imports the graph (langgraph, langchain, chromadb); the check needs
    only the engines. On a bare machine, ``specrag`` becomes a plain namespace over this
    checkout's ``src/specrag`` (its ``__init__`` is not run).
    """
    try:
        import specrag  # noqa: F401
    except ImportError:
        pkg = types.ModuleType("specrag")
        pkg.__path__ = [str(Path(__file__).resolve().parents[1] / "src" / "specrag")]
        sys.modules["specrag"] = pkg


def found(name: str) -> bool:
    """A file or folder that is here, or a hub id (``org/name``).

    A hub id is served by the Hugging Face cache or the hub, as the package's loader does.
    """
    local = name.startswith((".", "/", "~")) or name.endswith((".gguf", ".json"))
    return Path(name).expanduser().exists() or not local


def main(argv: list[str] | None = None) -> int:
    """The script; its failures are raised for :func:`cli` to tell."""
    engines_only()  # before the package's script helpers are imported (a bare GPU machine)
    from specrag.evaluation.script import Parser, ScriptError

    parser = Parser(prog="gpu_identity", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="write the token-id prompts (needs the full package)")
    prep.add_argument("--models", choices=["embedded", "pair"], default="embedded")
    prep.add_argument("--out", default="results/identity/prompts.json")
    prep.add_argument("--terse", type=int, default=16, help="SQuAD questions, terse answers")
    prep.add_argument("--long", type=int, default=8, help="'explain in detail' questions")
    prep.add_argument("--rapid", type=int, default=2, help="HotpotQA haystacks for RAPID")
    prep.add_argument("--rapid-tokens", type=int, default=4096)
    go = sub.add_parser("run", help="decode every prompt with every method, per dtype")
    go.add_argument("--prompts", help="a file from `prepare` (default: prepare now)")
    go.add_argument("--models", choices=["embedded", "pair"], default="embedded")
    go.add_argument("--target", help="target model file or folder (default: from the prompts)")
    go.add_argument("--drafter", help="drafter model file or folder (default: from the prompts)")
    go.add_argument("--device", default="cuda")
    go.add_argument("--dtypes", default="bfloat16,float32")
    go.add_argument("--out", default="results/identity")
    go.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(f"[identity {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    if args.command == "prepare":  # the pair not installed: one line (run_script)
        from specrag.evaluation.identity import prepare

        spec = prepare(args.models, args.terse, args.long, args.rapid, args.rapid_tokens)
        from specrag.models.records import write_text  # atomic: a cut run keeps the last

        write_text(Path(args.out), json.dumps(spec))
        n, h = len(spec["cases"]), len(spec["haystacks"])
        log(f"wrote {n} prompts and {h} haystacks to {args.out}")
        return 0

    from specrag.evaluation.identity import DTYPES, markdown, prepare, run, sources
    from specrag.models.records import write_text

    aliases = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}
    # once each: "bf16,bfloat16" ran twice and compared the second run with itself
    named = [aliases.get(d.strip(), d.strip()) for d in args.dtypes.split(",") if d.strip()]
    dtypes = list(dict.fromkeys(named))
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes:
        raise ScriptError(f"unknown dtype {unknown} (use {', '.join(DTYPES)})")
    missing = [p for p in (args.prompts, args.target, args.drafter) if p and not found(p)]
    if missing:
        raise ScriptError(f"not found: {', '.join(missing)}")
    from specrag.errors import ModelLoadError
    from specrag.models.options import resolve_device

    try:  # before the models load and the prompts are built (minutes): "cuda:3", "cdua"
        device = str(resolve_device(args.device))
    except ModelLoadError as exc:
        raise ScriptError(str(exc)) from None
    if args.prompts:
        try:  # a cut or foreign file: one line, not a traceback
            spec = json.loads(Path(args.prompts).read_text(encoding="utf-8"))
            if not isinstance(spec, dict) or not {"target", "drafter", "eos_ids", "cases"} <= set(
                spec
            ):
                raise ValueError("not a prompts file of `gpu_identity.py prepare`")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ScriptError(f"--prompts {args.prompts}: {exc}") from None
    else:
        spec = prepare(args.models)
    models = sources(spec, args.target, args.drafter)
    if missing := [m for m in dict.fromkeys(models) if not found(m)]:
        raise ScriptError(
            f"model not found here: {', '.join(missing)} (name the files with --target/--drafter)"
        )
    result = run(spec, device, dtypes, *models, progress=log)
    out = Path(args.out)
    write_text(out / "results.json", json.dumps(result, indent=1))
    write_text(out / "table.md", markdown(result))
    log(f"wrote {out / 'results.json'} and {out / 'table.md'}")
    if args.json:  # one valid JSON document (NaN: null)
        from specrag.evaluation.metrics import json_ready

        summary = json_ready({k: v for k, v in result.items() if k != "tokens"})
        print(json.dumps(summary, allow_nan=False))
    else:
        print(markdown(result))
    return 0


def cli(argv: list[str] | None = None) -> int:
    """:func:`main` with its errors as one line (and ``{"error": ...}`` with ``--json``)."""
    try:  # the package's imports (seconds where its dependencies are there): Ctrl-C is told
        engines_only()
        from specrag.evaluation.script import run_script
    except KeyboardInterrupt:  # as run_script tells it (specrag_entry is not on a bare machine)
        print("\ngpu_identity: interrupted", file=sys.stderr, flush=True)
        if "--json" in (sys.argv[1:] if argv is None else argv):
            print(json.dumps({"error": "interrupted"}), flush=True)
        return 130

    return run_script("gpu_identity", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
