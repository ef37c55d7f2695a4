"""The edges of the ``benchmarks/*.py`` scripts, as the ``specrag`` command has them.

A usage error or a known failure is one ``NAME: error: ...`` line on stderr and exit 2; with
``--json`` the script also prints ``{"error": ...}`` on stdout (one JSON document on stdout,
whatever happens). Ctrl-C is one line and exit 130. A package error (a model that does not
load, the pair not installed) and an ``OSError`` (an ``--out`` that cannot be written) are
known failures. Anything else (a bug, a CUDA out-of-memory error) keeps its traceback on stderr
and exits 1; with ``--json`` it prints ``{"error": "TYPE: first line"}`` on stdout first.
Standard library and ``specrag.errors`` only: ``gpu_identity.py`` runs on a bare GPU machine
where the package's dependencies are missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from specrag.errors import SpecRagError, joined_lines, one_line  # stdlib only: bare machine too


class ScriptError(Exception):
    """A failure a script tells in one line (its message is the line)."""


class Parser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are :class:`ScriptError` (one line, not usage + exit 2).

    Abbreviated options are off: ``--js`` is not ``--json`` (``run_script`` looks for the
    whole flag to know that an error goes to stdout as JSON too).
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def, override]
        """As argparse's; what it reads is kept for :meth:`print_help` (``--help --json``)."""
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def print_help(self, file: object = None) -> None:
        """The usage text; with ``--json`` on the line, one document: ``{"help": text}``."""
        if "--json" in getattr(self, "_argv", sys.argv[1:]):
            print(json.dumps({"help": self.format_help()}), flush=True)
        else:
            super().print_help(file)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        """Raise the usage error for :func:`run_script` to tell."""
        raise ScriptError(f"{message} (see --help)")


def run_script(
    name: str, main: Callable[[list[str]], int], argv: Sequence[str] | None = None
) -> int:
    """``main(argv)``, its exit status; failures told as the module docstring says."""
    args = list(sys.argv[1:] if argv is None else argv)

    def fail(line: str, code: int) -> int:
        # as the specrag command: Ctrl-C's line starts on a line of its own (after a bar's)
        # its control characters escaped (a path's newline made two lines, as in the CLI)
        said = f"\n{name}: interrupted" if code == 130 else f"{name}: error: {one_line(line)}"
        print(said, file=sys.stderr, flush=True)
        if "--json" in args:
            print(json.dumps({"error": line}), flush=True)
        return code

    try:
        return main(args)
    except ScriptError as exc:
        return fail(str(exc), 2)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except SpecRagError as exc:  # the package's own errors (a library's lines joined, as the
        # CLI's); a bug keeps its traceback
        return fail(joined_lines(str(exc)), 2)
    except OSError as exc:  # a results folder that cannot be written, a full disk
        # a rename's target (filename2), not the temporary file it came from (gone by now)
        where = exc.filename2 or exc.filename
        return fail(f"{exc.strerror or exc}: {where}" if where else str(exc), 2)
    except Exception as exc:  # a bug keeps its traceback; stdout still gets one document
        if "--json" in args:
            said = str(exc).strip().splitlines()
            line = f"{type(exc).__name__}: {said[0]}" if said else type(exc).__name__
            print(json.dumps({"error": line}), flush=True)
        raise
