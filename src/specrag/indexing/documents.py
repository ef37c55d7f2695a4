"""Reading user files and splitting text into token-aware chunks."""

from __future__ import annotations

import bisect
import codecs
import contextlib
import functools
import hashlib
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import BinaryIO, NamedTuple, TextIO

from langchain_text_splitters import RecursiveCharacterTextSplitter

from specrag.errors import InputError, first_line, one_line, short_number
from specrag.paths import user_path

SUPPORTED_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf")
PAGE_MARK = "#page="  # a PDF page's source: "<path>#page=<n>" (1-based), cited as such
UNREADABLE = "unreadable"  # the start of a skip reason for a file or folder that could not be read
HIDDEN = "hidden (name starts with '.')"  # a folder's; a hidden file named itself is indexed
BROKEN_LINK = "broken link"  # a link to nothing: reported; what it reached stays indexed
# a link to the folder being indexed or one above it: walking it would index the whole tree
# above (a link to .. in docs/ indexed everything beside docs/, the index's own files too)
LINK_ABOVE = "link to a folder above it (not followed)"
MAX_FILE_MIB_ENV = "SPECRAG_MAX_FILE_MIB"  # overrides DEFAULT_MAX_FILE_MIB
DEFAULT_MAX_FILE_MIB = 100.0  # a file is read whole into memory, then tokenized and embedded

log = logging.getLogger(__name__)


class Unreadable(InputError):
    """A file that is there but could not be read now.

    An OS error (permissions), a PDF that is damaged (cut off mid-copy) or encrypted. A
    re-index keeps what it indexed from it; a file gone, or no longer text, is pruned instead.
    """


def max_file_bytes() -> int:
    """The largest file specrag reads (``SPECRAG_MAX_FILE_MIB``, default 100 MiB)."""
    raw = os.environ.get(MAX_FILE_MIB_ENV, "").strip()
    if not raw:
        return int(DEFAULT_MAX_FILE_MIB * 2**20)
    try:
        mib = float(raw)
    except ValueError:
        mib = -1.0
    if not 0 < mib < float("inf"):
        raise InputError(f"{MAX_FILE_MIB_ENV} must be a positive number of MiB, got {raw!r}")
    return int(mib * 2**20)


def _os_error(path: Path, exc: OSError) -> InputError:
    """The one-line error for an OS error reading ``path``: gone, or unreadable now."""
    if isinstance(exc, FileNotFoundError):
        return InputError(f"file not found: {path}")
    return Unreadable(f"cannot read {path}: {exc.strerror or exc}")


def check_size(path: Path) -> None:
    """One-line ``Unreadable`` for a file past :func:`max_file_bytes` (before it is read).

    Unreadable, not a plain ``InputError``: a re-index keeps what it indexed from a file
    that has grown past the limit rather than pruning it.
    """
    try:
        st = path.stat()
    except OSError as exc:
        raise _os_error(path, exc) from exc
    check_regular(path, st)
    too_large(path, st.st_size)


NOT_REGULAR = "not a regular file (a device, pipe or socket)"


def check_regular(path: Path, st: os.stat_result) -> None:
    """One-line ``Unreadable`` unless ``st`` is a regular file's (a device, pipe or socket).

    /dev/zero never ends, a pipe waits for a writer: neither is read.
    """
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable(f"{NOT_REGULAR}: {path}")


def too_large(path: Path, size: int, cut: bool = False) -> None:
    """One-line ``Unreadable`` when ``size`` bytes are past :func:`max_file_bytes`.

    ``cut``: a read stopped just past the limit, so the file's whole size is not known.
    """
    limit = max_file_bytes()
    if size > limit:
        how = "more than the" if cut else f"{short_number(size / 2**20)} MiB, past the"
        raise Unreadable(
            f"{path} is too large: {how} {short_number(limit / 2**20)} MiB "
            f"limit (split it, or raise {MAX_FILE_MIB_ENV})"
        )


def _latin1(exc: UnicodeError) -> tuple[str, int]:
    """Decode error handler: a byte Windows-1252 leaves undefined is read as Latin-1."""
    assert isinstance(exc, UnicodeDecodeError)
    return chr(exc.object[exc.start]), exc.start + 1


_AS_LATIN1 = "specrag-latin1"
codecs.register_error(_AS_LATIN1, _latin1)


@dataclass(frozen=True)
class Skipped:
    """A file a folder index left out, and why (unsupported type, unreadable, empty)."""

    path: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        """JSON-friendly form (a name that is not UTF-8 as :func:`source_name` shows it)."""
        return {"path": source_name(self.path), "reason": source_name(self.reason)}

    @property
    def still_there(self) -> bool:
        """The file (or folder) is there but was not read: a re-index keeps what it indexed."""
        return self.reason == HIDDEN or self.reason.startswith(UNREADABLE)


def describe_skipped(skipped: list[Skipped], shown: int) -> str:
    """``a.png: unsupported ...; b.txt: empty (no text); and 3 more``: the first ``shown``."""
    text = "; ".join(one_line(f"{Path(s.path).name}: {s.reason}") for s in skipped[:shown])
    return text + (f"; and {len(skipped) - shown} more" if len(skipped) > shown else "")


@dataclass(frozen=True)
class Chunk:
    """A piece of a source document; ``score`` is set when it comes from a search."""

    id: str
    source: str
    text: str
    position: int = 0  # order within its source
    score: float = 0.0
    start: int = -1  # where the text starts in its document, where known (a given document's)

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form (used in graph state and CLI output)."""
        out: dict[str, object] = {
            "id": self.id,
            "source": self.source,
            "score": round(self.score, 4),
            "position": self.position,
            "text": self.text,
        }
        if self.start >= 0:
            out["start"] = self.start
        return out


# tags whose text is a block of its own (a line break before and after; inline ones such as
# <b> or <a> join their words with the text around them)
BLOCK_TAGS = frozenset(
    "p div li ul ol dl dt dd h1 h2 h3 h4 h5 h6 table thead tbody tfoot caption "
    "section article header footer nav aside main blockquote pre figure figcaption form "
    "fieldset legend hr title address details summary label option".split()
)


_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_TITLE_CHARS = 200  # an HTML heading longer than this is not marked as one


class _TextOnly(HTMLParser):
    """A page's visible text: blocks as paragraphs, a table's rows as lines.

    A row reads ``cell | cell``, one paragraph per table: a row's cells, and its header, stay
    together. A heading reads as Markdown's (``## Title``), one line, so that chunking keeps
    it with the section it opens (:func:`split_document`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0
        self._in_row = False  # a table row is open
        self._cells = 0  # cells so far in the open row
        self._tables = 0  # tables open
        self._heading: tuple[int, int] | None = None  # the open heading: level, first part

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        elif tag == "tr":
            self.parts.append("\n")
            self._in_row, self._cells = True, 0
        elif tag in ("td", "th"):  # "<td>Widget</td><td>10</td>" read "Widget10"
            if not self._in_row:  # a cell outside a row: a line of its own
                self.parts.append("\n")
            elif self._cells:
                self._trim()
                self.parts.append(" | ")
            self._cells += 1
        elif tag == "br":  # a line break; "<br/>" also calls handle_endtag, which adds none
            self.parts.append("\n")
        elif tag in BLOCK_TAGS and self._in_row and tag != "table":
            self._space()  # a cell's paragraphs (Word's <p> in every cell): the row stays a line
        elif tag in BLOCK_TAGS:
            self._end_heading()  # an unclosed heading ends where the next block starts
            self.parts.append("\n")
            if tag == "table":
                self._tables, self._in_row = self._tables + 1, False
            elif tag in _HEADINGS:
                self._heading = (_HEADINGS[tag], len(self.parts))

    def _space(self) -> None:
        """One space between a cell's blocks (none at a line's start or after one)."""
        if self.parts and not self.parts[-1].endswith((" ", "\n")):
            self.parts.append(" ")

    def _trim(self) -> None:
        """No space before a cell's separator or the row's end."""
        while self.parts and self.parts[-1] == " ":
            self.parts.pop()

    def _end_heading(self) -> None:
        if self._heading is None:
            return
        level, first = self._heading
        self._heading = None
        title = " ".join("".join(self.parts[first:]).split())
        if len(title) <= _TITLE_CHARS:  # a longer "heading" is a paragraph in big type
            self.parts[first:] = [f"{'#' * level} {title}"] if title else []
        self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1
        elif tag == "tr":
            self._trim()
            self._in_row = False
        elif tag in BLOCK_TAGS and self._in_row and tag != "table":
            self._space()
        elif tag in BLOCK_TAGS:
            self._end_heading()
            self.parts.append("\n")
            if tag == "table":
                self._tables, self._in_row = max(0, self._tables - 1), False

    def handle_data(self, data: str) -> None:
        if self._skip or ((self._tables or self._in_row) and data.isspace()):
            return  # a table's indentation
        self.parts.append(" ".join(data.split()) if self._in_row else data)


def html_to_text(markup: str) -> str:
    """Visible text of an HTML page."""
    parser = _TextOnly()  # it converts character references itself: "&amp;lt;" is "&lt;"
    parser.feed(markup)
    parser.close()
    text = "".join(parser.parts)
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


_SURROGATES = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with any lone surrogate (a PDF's broken text map) as U+FFFD.

    pypdf decodes text maps with ``surrogatepass``: such text could be neither hashed into a
    chunk id nor stored, and failed the whole index run at that file.
    """
    return _SURROGATES.sub("\ufffd", text)


def read_pdf_pages(path: Path) -> list[str]:
    """The text of each page of a PDF (pypdf); one-line ``InputError`` if it cannot be read."""
    check_size(path)
    try:
        from pypdf import PdfReader

        reader = PdfReader(str(path))
        # an owner password only ("no copying"; any viewer opens it): read with the empty one
        if reader.is_encrypted and not reader.decrypt(""):
            raise Unreadable(f"cannot read {path}: the PDF is encrypted")
        pages: list[str] = []
        failed: list[int] = []
        first_error = ""
        for number, page in enumerate(reader.pages, 1):
            try:  # a damaged page is left out, as a blank one is: not the whole file
                pages.append(valid_text((page.extract_text() or "").strip()))
            except Exception as exc:  # noqa: BLE001 - pypdf raises many kinds
                first_error = first_error or first_line(exc)
                failed.append(number)
                pages.append("")
        if failed and len(failed) == len(pages):
            raise Unreadable(f"cannot read PDF {path}: {first_error}")
        if failed:
            log.warning(
                "%s: page(s) %s could not be read (%s): left out",
                source_name(path),
                ", ".join(map(str, failed)),
                first_error,
            )
        return pages
    except InputError:
        raise
    except FileNotFoundError as exc:
        raise InputError(f"file not found: {path}") from exc
    except Exception as exc:  # noqa: BLE001 - pypdf raises many kinds; one line for the user
        raise Unreadable(f"cannot read PDF {path}: {first_line(exc)}") from exc


def source_name(path: str | Path) -> str:
    r"""A path as the index names its source.

    Itself, but for a file name that is not UTF-8, whose bytes show as ``\xNN`` (the store
    refuses the lone surrogates Python reads them as), the same on every run.
    """
    try:
        raw = str(path).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate outside the escapes (an NTFS name)
        raw = str(path).encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "backslashreplace")


def no_text_hint(path: Path | str) -> str:
    """What an empty file's message adds: a PDF without text is likely a scan ("": none)."""
    if Path(path).suffix.lower() == ".pdf":
        return "no page has a text layer: scanned? run OCR on it first"
    return ""


def read_records(path: Path) -> list[tuple[str, str]]:
    """``(source, text)`` records of one file (sources named by :func:`source_name`).

    One per PDF page (``path#page=n``, empty pages left out), else one for the file.
    """
    if path.suffix.lower() == ".pdf":
        pages = read_pdf_pages(path)
        blank = sum(not text for text in pages)  # no text layer: scanned, or images
        if 0 < blank < len(pages):  # none has text: the caller's "no text" error says why
            log.warning(
                "%s: %d of its %d pages %s no text (scanned? run OCR on it first): left out",
                path,
                blank,
                len(pages),
                "has" if blank == 1 else "have",
            )
        return [
            (f"{source_name(path)}{PAGE_MARK}{n}", text)
            for n, text in enumerate(pages, start=1)
            if text
        ]
    return [(source_name(path), read_text(path))]


def join_pages(pages: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """A PDF's pages as one text, and ``(offset, page)`` where each page starts in it.

    Empty pages are left out of the text (pages are numbered from 1 all the same).
    """
    parts: list[str] = []
    starts: list[tuple[int, int]] = []
    at = 0
    for n, page in enumerate(pages, start=1):
        if page:
            starts.append((at, n))
            parts.append(page)
            at += len(page) + 2  # the "\n\n" between pages
    return "\n\n".join(parts), starts


def page_of(text: str, starts: list[tuple[int, int]], passage: str, at: int = -1) -> int | None:
    """The page on which ``passage`` starts in ``text`` (:func:`join_pages`), if found.

    ``at``: where the passage's chunk starts in ``text`` (:attr:`Chunk.start`), where known; a
    passage found by its text alone is its first copy (a notice repeated on every page was
    cited with the first one's page).
    """
    if not (passage and 0 <= at and text.startswith(passage, at)):
        at = text.find(passage) if passage else -1
    if at < 0 or not starts:
        return None
    return starts[max(bisect.bisect_right([s for s, _ in starts], at) - 1, 0)][1]


def read_text(path: Path) -> str:
    """Text of a .txt/.md/.html/.pdf file; one-line ``InputError`` for anything unreadable."""
    if path.suffix.lower() == ".pdf":
        return join_pages(read_pdf_pages(path))[0]
    check_size(path)
    try:  # non-blocking: a file swapped for a pipe since the check is refused, not waited on
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            check_regular(path, os.fstat(f.fileno()))
            raw = read_bounded(f, path)  # it may have grown since its size was read
    except OSError as exc:
        raise _os_error(path, exc) from exc
    html = path.suffix.lower() in (".html", ".htm")
    text = valid_text(decode_text(raw, path, declared_charset(raw) if html else None))
    if not html:
        return text
    try:
        return valid_text(html_to_text(text))
    except Exception as exc:  # noqa: BLE001 - html.parser asserts on some markup; one line
        raise Unreadable(f"cannot read HTML {path}: {first_line(exc)}") from exc


_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def declared_charset(raw: bytes) -> str | None:
    """The text encoding an HTML page names in its first 4 KiB, if Python knows it.

    ``<meta charset=...>`` or ``<meta http-equiv=... content="...; charset=...">``. Not a
    codec that is no character set (``base64``, ``rot13``, ``hex``: Python refuses them for
    ``bytes.decode``; ``unicode_escape``, ``punycode``: they decode escapes, not a page).
    Read as browsers read them (WHATWG's encoding labels): Latin-1 and ASCII name
    Windows-1252 (Latin-1 pages full of its curly quotes read as C1 controls), and a UTF-16
    or UTF-32 label, which a page whose meta tag reads as ASCII cannot be in, is none.
    """
    found = _CHARSET.search(raw[:4096])
    if found is None:
        return None
    try:
        name = codecs.lookup(found[1].decode("ascii")).name
        "a".encode(name)  # LookupError for a bytes-to-bytes or str-to-str codec
    except (LookupError, UnicodeError):
        return None
    if name in ("iso8859-1", "ascii"):
        return "cp1252"
    if name.startswith(("utf-16", "utf-32")):
        return None
    return None if name.endswith("escape") or name in ("punycode", "idna") else name


def read_stream(stream: BinaryIO | TextIO, name: str) -> str:
    """Text read from a stream (``--document -``), bounded as a file is; ``name`` in messages."""
    return decode_text(read_bounded(stream, Path(name)), Path(name))


def read_bounded(stream: BinaryIO | TextIO, path: Path, piece: int = 2**20) -> bytes:
    """All of ``stream``, read in pieces; one-line ``Unreadable`` once past the size limit.

    In pieces: ``read(limit + 1)`` would reserve the whole limit for a 5-byte file (and fail
    with a MemoryError where the limit was raised past the memory). A text stream (a stdin
    replaced in-process) is read as UTF-8 bytes.
    """
    limit = max_file_bytes()
    parts: list[bytes] = []
    size = 0
    while part := stream.read(min(piece, limit + 1 - size)):
        parts.append(part.encode() if isinstance(part, str) else part)
        size += len(parts[-1])
        too_large(path, size, cut=True)
    return b"".join(parts)


def decode_text(raw: bytes, path: Path, declared: str | None = None) -> str:
    """Text of a file's bytes, with Windows' and old Macs' line endings as newlines.

    UTF-8 (a BOM allowed), UTF-16 or UTF-32 with its BOM, UTF-16 without one where every
    other byte of mostly-ASCII text is NUL, the ``declared`` encoding (an HTML page's meta
    charset) where the bytes are not UTF-8, else Windows-1252: a file that is not UTF-8
    (Latin-1 and Windows-1252 text from older tools) is read so with a warning (its bytes
    0x81, 0x8D, 0x8F, 0x90 and 0x9D as Latin-1), rather than refused. Binary content (a NUL
    byte in the first 8 KiB) is one ``InputError``; a NUL byte later is dropped.
    """
    text = _decode(raw, path, declared).replace("\x00", "")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _decode(raw: bytes, path: Path, declared: str | None) -> str:
    """:func:`decode_text` but for the line endings and late NUL bytes."""
    boms = (
        (codecs.BOM_UTF32_LE, "utf-32-le"),
        (codecs.BOM_UTF32_BE, "utf-32-be"),
        (codecs.BOM_UTF16_LE, "utf-16-le"),
        (codecs.BOM_UTF16_BE, "utf-16-be"),
    )
    for bom, codec in boms:
        if raw.startswith(bom):
            text = _wide_text(raw[len(bom) :], codec, path)
            if text is None:
                name = codec[:6].upper()
                raise InputError(f"not {name} text despite its byte order mark: {path}")
            return text
    head = raw[:8192]
    if b"\x00" in head:
        # mostly-ASCII UTF-16 without a BOM: a NUL in most high bytes, few in the low ones
        # (U+4E00 "一", U+3000, U+0100 have one there: one such character refused the file)
        even, odd = head[0::2].count(0), head[1::2].count(0)
        half = len(head) // 2
        few = max(1, half // 20)
        wide = "utf-16-le" if odd > 0.6 * half and even <= few else None
        wide = "utf-16-be" if even > 0.6 * half and odd <= few else wide
        text = _wide_text(raw, wide, path) if wide is not None else None
        if text is not None:
            return text
        raise InputError(f"not a text file (binary content): {path}")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    if declared is not None and declared != "utf-8":
        with contextlib.suppress(UnicodeError, LookupError):
            return raw.decode(declared)
    # UTF-8 with a few damaged bytes (a file cut mid-character, one stray byte): its valid
    # non-ASCII characters outnumber the bad bytes - read as UTF-8, the bad ones as U+FFFD
    # (as Windows-1252, "café" read "cafÃ©" throughout and its words were never found)
    text = raw.decode("utf-8-sig", errors="replace")
    bad = text.count("\ufffd") - raw.count("\ufffd".encode())
    if sum(ord(ch) > 0x7F and ch != "\ufffd" for ch in text) > bad:
        log.warning("%s: %d byte sequence(s) not UTF-8, read as U+FFFD", path, bad)
        return text
    log.warning("%s is not UTF-8: read as Windows-1252 (Latin-1)", path)
    return raw.decode("cp1252", errors=_AS_LATIN1)


def _wide_text(raw: bytes, codec: str, path: Path) -> str | None:
    """``raw`` as UTF-16/32 text, a few damaged code units as U+FFFD (with a warning).

    A file cut mid-character (a log still being written) or one lone surrogate was refused
    whole (and a re-index then dropped its indexed text); past a few damaged units in a
    thousand it is not such text: None.
    """
    try:  # whole text (nearly every file): one decode
        return raw.decode(codec)
    except UnicodeDecodeError:
        pass
    text = raw.decode(codec, errors="replace")
    bad = text.count("\ufffd") - raw.decode(codec, errors="ignore").count("\ufffd")
    if bad > max(2, len(text) // 1000):
        return None
    if bad:
        log.warning("%s: %d damaged %s code unit(s), read as U+FFFD", path, bad, codec[:6])
    return text


def require_supported(path: Path, given: str | Path) -> None:
    """One-line ``InputError`` unless ``path`` names a supported type (a named file's rule)."""
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise InputError(
            f"unsupported file type {path.suffix or '(none)'}: {given} "
            f"(supported: {', '.join(SUPPORTED_SUFFIXES)})"
        )


def collect_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand folders to their supported files; error on anything missing or unsupported."""
    return collect_files_report(paths).files


def named_path(item: str | Path) -> Path:
    """A path named on the command line (``~`` expanded; what the OS refuses: one line).

    An empty one is an error: ``Path("")`` is ``.``, and a stray ``""`` indexed the working
    folder.
    """
    if not str(item).strip():
        raise InputError('an empty path was given (the current folder is ".")')
    return user_path(str(item), "cannot read")


def link_path(path: Path) -> Path:
    """A named link's own path: its folder resolved, not the link (what the record keys it by).

    ``latest -> v2`` stays ``.../latest``; pointed elsewhere, its key is the same.
    """
    return path.parent.resolve() / path.name


def folder_prefix(path: str | Path) -> str:
    """The source prefix of a real folder's files (``/docs/``)."""
    return source_name(path).rstrip(os.sep) + os.sep


class Collected(NamedTuple):
    """What :func:`collect_files_report` found."""

    files: list[Path]
    skipped: list[Skipped]
    folders: list[str]
    """The real folders walked (a linked folder's target among them)."""
    reach: dict[str, list[str]]
    """Per named path (a folder's source prefix, a file's source), what it reached through
    links out of itself: folder prefixes and file sources (none for a named file)."""
    incomplete: list[str]
    """The named folders (prefixes) whose walk met something it could not read."""


def checked_path(item: str | Path) -> Path:
    """A named path that exists; a named file of a supported type (else one-line ``InputError``).

    The checks that read no file and walk no folder: ``index`` makes them before it opens the
    index, so a typo is told before a server that does not answer.
    """
    path = named_path(item)
    if not path.exists():
        raise InputError(f"no such file or folder: {item}")
    if not path.is_dir():
        require_supported(path, item)
    return path


def collect_files_report(paths: Iterable[str | Path]) -> Collected:
    """Folders expanded to their files; what was left out; the real folders walked; the reach.

    A file named explicitly must exist and be supported (one-line ``InputError``).
    """
    files: list[Path] = []
    skipped: list[Skipped] = []
    folders: list[str] = []
    reach: dict[str, list[str]] = {}
    incomplete: list[str] = []
    for item in paths:
        path = checked_path(item)
        if path.is_dir():
            found, left_out, walked = _walk(path)
            files += found
            skipped += left_out
            folders += walked
            own = folder_prefix(path.resolve())
            out = [p for p in map(folder_prefix, walked) if not p.startswith(own)]
            linked = [source_name(f.resolve()) for f in found]
            for s in left_out:  # a target away (a drive not mounted) is still linked to
                if s.reason == BROKEN_LINK:
                    target = os.path.realpath(s.path)
                    linked += [folder_prefix(target), source_name(target)]
            out += [f for f in linked if not f.startswith((own, *out))]
            key = own
            if path.is_symlink():  # a named link (``latest -> v2``) reaches its target: once
                key = folder_prefix(link_path(path))  # it points elsewhere,
                out.append(own)  # what it reached goes (as a link inside a folder's does)
            reach[key] = sorted({*reach.get(key, []), *out})
            if any(s.reason.startswith(UNREADABLE) for s in left_out):
                incomplete.append(key)
        else:
            files.append(path)
            if path.is_symlink():  # ``current.md -> v2.md``, as a named folder link above
                link = source_name(link_path(path))
                reach[link] = sorted({*reach.get(link, []), source_name(path.resolve())})
            else:
                reach.setdefault(source_name(path.resolve()), [])
    skipped = list(dict.fromkeys(skipped))  # once, where two named folders overlap
    return Collected(_one_per_file(files), skipped, list(dict.fromkeys(folders)), reach, incomplete)


def _one_per_file(files: Iterable[Path]) -> list[Path]:
    """Resolved ``files``, each file once: the first name given for it wins.

    One file is known by its device and inode, not its path: on a case-insensitive file system
    (macOS, Windows) ``docs/a.txt`` and ``DOCS/a.txt`` resolve to two spellings of one file,
    and a hard link is another name for the same bytes; either would be indexed twice.
    """
    seen: set[object] = set()
    out: list[Path] = []
    for path in files:
        real = path.resolve()
        try:
            st = real.stat()
            key: object = (st.st_dev, st.st_ino) if st.st_ino else str(real)
        except OSError:  # gone meanwhile: reading it reports that
            key = str(real)
        if key not in seen:
            seen.add(key)
            out.append(real)
    return out


def _walk(folder: Path) -> tuple[list[Path], list[Skipped], list[str]]:
    """A folder's supported files, what it left out, and the real folders it walked.

    Left out: other types, broken links, folders that cannot be listed, hidden entries
    (``.git``, ``.DS_Store``, ...; one entry each, a hidden folder never walked into), and
    links to ``folder`` itself or a folder above it.
    """
    top = os.path.realpath(folder)
    files: list[Path] = []
    skipped: list[Skipped] = []
    seen: dict[str, None] = {}  # real folders walked: a folder two links reach is walked once

    def unreadable(exc: OSError) -> None:  # a subfolder os.walk cannot list
        where = Path(exc.filename).absolute() if exc.filename else folder.absolute()
        skipped.append(Skipped(str(where), f"{UNREADABLE} folder ({exc.strerror or exc})"))

    for root, dirs, names in os.walk(folder, onerror=unreadable, followlinks=True):
        here = Path(root)
        real = os.path.realpath(here)
        if real in seen:
            dirs[:] = []
            continue
        seen[real] = None
        for d in sorted(d for d in dirs if d.startswith(".")):
            skipped.append(Skipped(str((here / d).absolute()), HIDDEN))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for d in [d for d in dirs if os.path.islink(here / d)]:
            target = os.path.realpath(here / d)
            if top == target or top.startswith(target.rstrip(os.sep) + os.sep):
                skipped.append(Skipped(str((here / d).absolute()), LINK_ABOVE))
                dirs.remove(d)
        for name in sorted(names):
            p = here / name
            if name.startswith("."):
                skipped.append(Skipped(str(p.absolute()), HIDDEN))
                continue
            try:  # a folder that can be listed but not entered: its entries cannot be stat'ed
                dangling = p.is_symlink() and not p.exists()
                regular = p.is_file()
            except OSError as exc:
                skipped.append(Skipped(str(p.absolute()), f"{UNREADABLE} ({exc.strerror or exc})"))
                continue
            if dangling:
                skipped.append(Skipped(str(p.absolute()), BROKEN_LINK))
            elif not regular:  # a pipe, socket or device (or a link to one: /dev/zero)
                skipped.append(Skipped(str(p.absolute()), NOT_REGULAR))
            elif p.suffix.lower() in SUPPORTED_SUFFIXES:
                files.append(p)
            else:
                kind = p.suffix.lower() or "(no extension)"
                skipped.append(Skipped(str(p.resolve()), f"unsupported type {kind}"))
    return sorted(files), skipped, list(seen)


def make_splitter(
    length: Callable[[str], int], chunk_tokens: int, overlap_tokens: int
) -> RecursiveCharacterTextSplitter:
    """A splitter that measures chunks in tokens of the given tokenizer.

    A line with no space to split at (minified text, base64) is split into characters, each
    measured: short pieces are measured once each (1.2 MB of it took minutes, a tokenizer
    call per character).
    """
    short = functools.lru_cache(maxsize=16384)(length)

    def measured(text: str) -> int:
        return short(text) if len(text) <= 8 else length(text)

    return RecursiveCharacterTextSplitter(
        chunk_size=chunk_tokens,
        chunk_overlap=overlap_tokens,
        length_function=measured,
        separators=["\n\n", "\n", ". ", "。", " ", ""],
        keep_separator="end",
    )


def chunk_ids(source: str, texts: list[str]) -> list[str]:
    """Content-hash ids: the same text from the same source always gets the same id.

    A text repeated within one source gets an occurrence suffix, so ids stay unique.
    """
    seen: dict[str, int] = {}
    out = []
    for text in texts:
        digest = hashlib.sha256(f"{source}\x00{text}".encode()).hexdigest()[:32]
        n = seen.get(digest, 0)
        seen[digest] = n + 1
        out.append(digest if n == 0 else f"{digest}-{n}")
    return out


_HEADING_LINE = re.compile(r"#{1,6}[ \t]+\S[^\n]*")


def _find_lines(text: str, lines: str) -> int:
    """Where ``lines`` stand in ``text`` as whole lines (``## Use`` is not ``## Users``), or -1."""
    found = re.search(rf"(?m)^{re.escape(lines)}[ \t]*$", text)  # a line's trailing blanks too
    return found.start() if found else -1


def _carry_headings(
    texts: list[str],
    document: str,
    fits: Callable[[str], bool],
    origins: list[int] | None = None,
) -> list[str]:
    """Chunks whose closing paragraphs are Markdown headings give them to the next chunk.

    The splitter cut a section's heading from its text when the two did not fit one chunk:
    the heading ended the chunk before (or stood alone), the section began the next without
    it. A chunk that ends inside a code fence (after an odd number of the document's ```
    fences) keeps its ``# comment`` lines; a heading that does not ``fits`` (a few tokens)
    stays where it was. ``origins`` (given): gets the index in ``texts`` of each chunk returned.
    """
    fences = [m.start() for m in re.finditer("```", document)]
    out: list[str] = []
    carried = ""
    seen = 0  # where the last chunk was found in the document (chunks come in order)
    before = ""  # the last chunk as the splitter made it
    for i, text in enumerate(texts):
        in_code = False
        if fences:  # where the chunk ends: after an odd number of fences is inside code
            at = document.find(text, seen)
            seen = at if at >= 0 else seen
            in_code = at < 0 or bisect.bisect_left(fences, at + len(text)) % 2 == 1
        made, at = text, _find_lines(text, carried) if carried else -1
        if carried and at > 0 and before.endswith(text[: at + len(carried)]):
            text = text[at:]  # the overlap repeated the chunk before's end, heading included
        elif carried and at != 0:
            # the overlap may have brought the carried headings' last lines: the rest only
            lines = carried.split("\n\n")
            have = next(
                (k for k in range(1, len(lines)) if _find_lines(text, "\n\n".join(lines[k:])) == 0),
                len(lines),
            )
            text = "\n\n".join([*lines[:have], text])
        before, carried = made, ""
        blocks = text.split("\n\n")
        cut = len(blocks)
        while cut and all(_HEADING_LINE.fullmatch(line) for line in blocks[cut - 1].split("\n")):
            cut -= 1
        heading = "\n\n".join(blocks[cut:])
        if i + 1 < len(texts) and heading and not in_code and fits(heading):
            carried, text = heading, "\n\n".join(blocks[:cut]).rstrip()
        if text:
            out.append(text)
            if origins is not None:
                origins.append(i)
    return out


def split_document(source: str, text: str, splitter: RecursiveCharacterTextSplitter) -> list[Chunk]:
    """Chunks of one document, in document order.

    A heading the splitter left at the end of a chunk (or alone) opens the next chunk
    instead, so a section's heading is searched with its text; that chunk is longer than the
    splitter's size by the heading (an eighth of the size at most: a longer one stays).
    """
    # a heading carried makes its chunk longer than the splitter's size: by an eighth at most
    length: Callable[[str], int] = getattr(splitter, "_length_function", len)
    most = max(getattr(splitter, "_chunk_size", 200) // 8, 1)
    split = [t.strip() for t in splitter.split_text(text) if t.strip()]
    origins: list[int] = []
    texts = _carry_headings(split, text, lambda heading: length(heading) <= most, origins)
    starts = _starts(text, split, texts, origins)
    return [
        Chunk(cid, source, t, position=i, start=at)
        for i, (cid, t, at) in enumerate(zip(chunk_ids(source, texts), texts, starts, strict=True))
    ]


def _starts(document: str, split: list[str], texts: list[str], origins: list[int]) -> list[int]:
    """Where each chunk starts in ``document``; -1 where it is not verbatim.

    ``split``: the splitter's chunks, each of which ends past the one before (it adds a piece
    of text to the overlap), so a copy of one inside the chunk before (a notice quoted on
    page 2, alone on page 3) is not it. ``texts`` (from ``origins[k]`` of them) lost a heading
    at their end, a repeated overlap at their start, or gained the heading of the one before.
    """
    found: list[int] = []
    last_at, last_end = -1, 0  # the last chunk found: where it starts and ends
    for text in split:
        at = document.find(text, max(last_at + 1, last_end - len(text) + 1))
        found.append(at)
        if at >= 0:
            last_at, last_end = at, at + len(text)
    out: list[int] = []
    for text, k in zip(texts, origins, strict=True):
        base = found[k]
        at = document.find(text, max(base, 0))
        if base < 0 or not base <= at < base + len(split[k]):  # it begins before: a heading
            before = found[k - 1] if k > 0 else -1  # carried from the chunk before
            at = document.find(text, before) if before >= 0 else -1
            at = at if 0 <= at <= max(base, 0) or base < 0 else -1
        out.append(at)
    return out
