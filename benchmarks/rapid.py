"""Run `specrag bench rapid` as a script: python benchmarks/rapid.py [--quick] [--json] [--out DIR]."""

import sys

from specrag.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "rapid", *sys.argv[1:]]))
