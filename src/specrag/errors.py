"""User-facing errors: each carries one line that the CLI prints without a traceback."""

import re


class SpecRagError(Exception):
    """An error whose message is meant for the user as-is (one line, actionable)."""


class ModelLoadError(SpecRagError):
    """A model could not be found or loaded."""


class IndexError_(SpecRagError):
    """The vector index is missing, unreadable or inconsistent."""


class InputError(SpecRagError, ValueError):
    """The user's question, document or configuration is not acceptable.

    A ``ValueError`` too: the LangGraph API server passes a ``ValueError``'s message on to its
    client and hides other types' ("An internal error occurred" for a context's bad value).
    """


class DataDirError(SpecRagError):
    """The data dir, or a file specrag keeps there (thread checkpoints), cannot be used."""


def joined_lines(text: str) -> str:
    """``text``'s non-blank lines joined by spaces (a library's multi-line message: one line)."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


# control characters, and the invisible marks that reorder a terminal line (bidi overrides)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def one_line(text: str) -> str:
    r"""``text`` with its control characters escaped (``\n``, ``\x1b``, ``\u202e``).

    A file name may hold them; a line that prints one must stay one line, with no terminal
    codes, read in the order it was written.
    """
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def short_number(value: float) -> str:
    """``value`` as a message shows it: one decimal at most, 3 digits below 0.1.

    "0.001s", not "0.0s"; "3600s", not "3.6e+03s".
    """
    return f"{value:.1f}".removesuffix(".0") if abs(value) >= 0.1 else f"{value:.3g}"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none.

    An exception without a message that was raised from (or during) another says that one's:
    chromadb's bare ``ValueError`` over a connect timeout read "ValueError" alone.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        lines = str(cause).strip().splitlines()
        if lines:
            return (
                lines[0] if cause is exc else f"{short_type(exc)} ({short_type(cause)}: {lines[0]})"
            )
        # `raise ... from None` hides the context: so does this
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return short_type(exc)


def short_error(exc: BaseException) -> str:
    """``Type: first line`` of an exception (``IndexError_`` shown as ``IndexError``)."""
    return f"{short_type(exc)}: {first_line(exc)}" if str(exc).strip() else first_line(exc)


def short_type(exc: BaseException) -> str:
    """An exception's type name as a user reads it (``IndexError_`` is ``IndexError``)."""
    return type(exc).__name__.rstrip("_")
