"""The ``specrag`` command's entry point.

Importing :mod:`specrag.cli` imports the package (torch, LangChain, LangGraph: seconds). A
Ctrl-C in those seconds is "interrupted" as one later is - one line on stderr, exit 130, and
under ``--json`` one JSON document on stdout - not a traceback.

The CLI's environment defaults (offline hub, no telemetry) are set here, before that import:
``huggingface_hub`` reads ``HF_HUB_OFFLINE`` once, when the package first imports it, so a
default set later (in :mod:`specrag.cli`) left an uncached hub id retrying the network for a
minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator

# what the CLI assumes unless the environment says otherwise (README: "runs offline")
ENV_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "ANONYMIZED_TELEMETRY": "False",
}


def interrupted(name: str, doc: dict[str, object]) -> int:
    """Tell a Ctrl-C as ``name: interrupted`` on stderr (and ``doc`` under ``--json``): 130."""
    sys.stderr.write(f"\n{name}: interrupted\n")
    if any(tok == "--json" or tok.startswith("--json=") for tok in sys.argv[1:]):
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()
    return 130


@contextlib.contextmanager
def loading(name: str) -> Iterator[None]:
    """A ``benchmarks/*.py`` script's imports of the package (seconds), Ctrl-C told as later.

    As :func:`specrag.evaluation.script.run_script` tells it: one line, exit 130 and, under
    ``--json``, ``{"error": "interrupted"}`` - not a traceback with an empty stdout.
    """
    try:
        yield
    except KeyboardInterrupt:
        raise SystemExit(interrupted(name, {"error": "interrupted"})) from None


def main() -> int:
    """Run the ``specrag`` command line (:func:`specrag.cli.main`)."""
    for name, value in ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    try:
        from specrag.cli import main as run
    except KeyboardInterrupt:
        return interrupted("specrag", {"error": "interrupted", "exit_code": 130})
    return run()


if __name__ == "__main__":
    sys.exit(main())
