"""Run `specrag bench load` as a script: python benchmarks/load.py [--quick] [--json] [--out DIR]."""

import sys

from specrag.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "load", *sys.argv[1:]]))
