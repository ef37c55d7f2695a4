"""Run `specrag bench load` as a script (same flags: --quick, --json, --out DIR, --fresh)."""

import sys

from specrag.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "load", *sys.argv[1:]]))
