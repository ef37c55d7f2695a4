"""Run `specrag bench rag` as a script: python benchmarks/rag.py [--quick] [--json] [--out DIR]."""

import sys

from specrag.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "rag", *sys.argv[1:]]))
