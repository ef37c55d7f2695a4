"""The ``specrag`` command's entry point.

Importing :mod:`specrag.cli` imports the package (torch, LangChain, LangGraph: seconds). A
Ctrl-C in those seconds is "interrupted" as one later is - one line on stderr, exit 130, and
under ``--json`` one JSON document on stdout - not a traceback.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    """Run the ``specrag`` command line (:func:`specrag.cli.main`)."""
    try:
        from specrag.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("\nspecrag: interrupted\n")
        if any(tok == "--json" or tok.startswith("--json=") for tok in sys.argv[1:]):
            sys.stdout.write(json.dumps({"error": "interrupted", "exit_code": 130}) + "\n")
        return 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
