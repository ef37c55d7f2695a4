"""Run `specrag bench rapid` as a script (same flags: --quick, --json, --out DIR, --fresh)."""

import sys

import specrag_entry  # the standard library only: a Ctrl-C while the package loads is told

if __name__ == "__main__":
    sys.argv[1:1] = ["bench", "rapid"]
    sys.exit(specrag_entry.main())
