"""Bad input gives one clear line on stderr, a non-zero exit, no traceback, index untouched."""

import re
import time

import pytest

from specrag.cli import main
from specrag.errors import InputError


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))


LOADING = re.compile(r"loading models \(.*\) \.\.\.")


def one_line_error(capsys, code, expected_code=2):
    """The one stderr line; stdout holds nothing, or under --json the error as one document."""
    import json

    captured = capsys.readouterr()
    assert code == expected_code
    lines = [line for line in captured.err.strip().splitlines() if line.strip()]
    if lines and LOADING.fullmatch(lines[0]):  # the note said before models load: not the
        lines = lines[1:]  # error (a model that fails to load fails after it)
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("specrag: error:")
    assert "Traceback" not in captured.err
    if captured.out:
        doc = json.loads(captured.out)
        assert lines[0].startswith(f"specrag: error: {doc['error']}")
        assert doc["exit_code"] == code
    return lines[0]


@pytest.mark.parametrize("question", ["", "   \n\t "])
def test_empty_question(capsys, question):
    assert "empty" in one_line_error(capsys, main(["ask", question]))


def test_question_too_long(capsys):
    line = one_line_error(capsys, main(["ask", "x" * 50, "--set", "max_question_chars=10"]))
    assert "max 10" in line
    line = one_line_error(capsys, main(["ask", "x" * 11, "--set", "max_question_chars=10"]))
    assert "max 10" in line
    from specrag.graph.context import validate_question

    assert validate_question("x" * 10, 10) == "x" * 10  # at the limit: taken


def test_no_index_yet(capsys, tmp_path):
    line = one_line_error(capsys, main(["ask", "Who?", "--index-dir", str(tmp_path / "none")]))
    assert "no index" in line and "specrag index" in line
    assert not (tmp_path / "none").exists()  # nothing created


def test_unknown_config_key(capsys):
    assert "unknown config key 'nope'" in one_line_error(
        capsys, main(["ask", "q", "--set", "nope=1"])
    )


def test_bad_config_value(capsys):
    assert "expected a whole number" in one_line_error(
        capsys, main(["ask", "q", "--set", "top_k=many"])
    )


@pytest.mark.parametrize(
    "setting, expected",
    [
        ("top_k=1.5", "expected a whole number"),
        ("relevance_threshold=nan", "expected a finite number"),
        ("draft_timeout_s=inf", "expected a finite number"),
    ],
)
def test_numbers_that_are_not_the_kind_a_field_takes(capsys, setting, expected):
    assert expected in one_line_error(capsys, main(["ask", "q", "--set", setting]))


def test_missing_file_to_index(capsys, tmp_path):
    line = one_line_error(capsys, main(["index", str(tmp_path / "missing.txt")]))
    assert "no such file" in line
    assert not (tmp_path / "data").exists()


def test_binary_file_to_index(capsys, tmp_path):
    bad = tmp_path / "blob.txt"
    bad.write_bytes(b"\x00\x01\x02binary")
    assert "binary" in one_line_error(capsys, main(["index", str(bad)]))


def test_unsupported_file_type(capsys, tmp_path):
    image = tmp_path / "x.png"
    image.write_bytes(b"\x89PNG")
    assert "unsupported file type .png" in one_line_error(capsys, main(["index", str(image)]))


def test_unreadable_pdf(capsys, tmp_path):
    pdf = tmp_path / "x.pdf"
    pdf.write_bytes(b"%PDF")  # PDFs are indexed now (issue 11): a broken one is one line
    assert "cannot read PDF" in one_line_error(capsys, main(["index", str(pdf)]))


def test_an_unreadable_pdf_is_one_line_in_a_real_process_too(tmp_path):
    """In a process of its own (the CLI's logging, not pytest's), pypdf's own warning about
    the file ("EOF marker not found") came before specrag's error line."""
    import subprocess
    import sys

    pdf = tmp_path / "x.pdf"
    pdf.write_bytes(b"%PDF")
    done = subprocess.run(
        [sys.executable, "-c", "from specrag.cli import main; raise SystemExit(main())"]
        + ["index", str(pdf), "--index-dir", str(tmp_path / "idx")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("specrag: error: cannot read PDF")


@pytest.mark.parametrize(
    "command",
    [
        "",  # config --json itself: more than a buffer
        "c.cmd_config = lambda a: c.print_json({'a': 1})",  # a small JSON: found at the flush
        "c.cmd_config = lambda a: c.out.print('answer')",  # rich's console (ask without --json)
    ],
)
def test_a_reader_that_stops_early_is_no_error(command):
    """`specrag config --json | head -c 10` printed a BrokenPipeError as specrag's error."""
    import os
    import subprocess
    import sys

    code = f"import specrag.cli as c; {command or 'pass'}; raise SystemExit(c.main())"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "config", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the CLI writes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and err == "", err


def test_bad_bench_flags_fail_before_any_model_loads(capsys, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("x")
    line = one_line_error(capsys, main(["bench", "load", "--out", str(blocked / "sub")]))
    assert "--out" in line and "cannot make the folder" in line
    bad_dtype = ["bench", "rapid", "--dtype", "fp8", "--out", str(tmp_path)]
    line = one_line_error(capsys, main(bad_dtype))
    assert "unknown dtype 'fp8'" in line and "int8" not in line
    line = one_line_error(capsys, main(["bench", "retrieval", "--models", "pair"]))
    assert "--models does not apply" in line


def test_an_empty_folder_says_what_it_skipped(capsys, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.png").write_bytes(b"x")
    (tmp_path / "d" / "b.txt").write_text("")
    line = one_line_error(capsys, main(["index", str(tmp_path / "d"), "--json"]))
    assert "skipped 2" in line and "b.txt: empty" in line and "see --json" not in line


def test_missing_document(capsys, tmp_path):
    line = one_line_error(capsys, main(["ask", "q", "--document", str(tmp_path / "nope.txt")]))
    assert "file not found" in line


def test_an_error_line_prints_no_terminal_codes(capsys, tmp_path):
    """Only line breaks were handled: a file name's ESC codes (or a bidi override, which
    reverses the rest of the line) reached the terminal in the error line (a review,
    2026-12-07). They are escaped there; the --json document keeps the name as it is."""
    import json

    name = "a\x1b[31mred\u202eevil.txt"
    line = one_line_error(capsys, main(["ask", "q", "--document", str(tmp_path / name)]))
    assert "\x1b" not in line and "\u202e" not in line
    assert "a\\x1b[31mred\\u202eevil.txt" in line
    main(["ask", "q", "--document", str(tmp_path / name), "--json"])
    assert name in json.loads(capsys.readouterr().out)["error"]


@pytest.mark.parametrize("kind", ["too long", "no such user", "no entry"])
def test_a_path_the_os_refuses_is_bad_input(capsys, tmp_path, monkeypatch, kind):
    """A file name over 255 bytes, ``~nosuchuser/...`` or a file under a folder that may not
    be entered ended as an unexpected OSError / RuntimeError (exit 1) wherever it was given
    (a new-user review, 2026-12-05)."""
    import os

    if kind == "too long":
        name = str(tmp_path / ("a" * 300))
    elif kind == "no such user":
        name = "~nosuchuser-specrag/x.txt"
    else:
        name = str(tmp_path / "locked" / "x.txt")
        real_stat = os.stat

        def stat(path, *a, **k):  # root may enter any folder: the OS's answer, simulated
            if str(path).startswith(str(tmp_path / "locked")):
                raise PermissionError(13, "Permission denied")
            return real_stat(path, *a, **k)

        monkeypatch.setattr(os, "stat", stat)
    for argv, what in (
        (["ask", "q", "--document", name], "--document"),
        (["index", name], "cannot read"),
        (["ask", "q", "--index-dir", name], "index_dir"),
        (["ask", "q", "--set", f"answer_model=hf:{name}"], "model path"),
        (["config", "--set", f"embedding_model={name}"], "embedding_model"),
        (["bench", "rag", "--out", name], "--out"),
    ):
        if what == "--out" and kind != "no such user":
            continue  # a folder it creates: a long or locked one fails as "cannot create"
        line = one_line_error(capsys, main(argv))
        assert what in line and name in line, line


def test_ask_names_a_document_whose_file_name_is_not_utf8_as_index_does(
    capsys, tmp_path, monkeypatch
):
    import json
    import os

    import specrag.cli
    from specrag.indexing.document_search import DOCUMENT_SOURCE

    doc = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9.txt")
    pathlib_doc = __import__("pathlib").Path(doc)
    pathlib_doc.write_text("Paris is the capital of France.")

    async def run_graph(*a, **k):
        return {"answer": "Paris.", "citations": [{"n": 1, "source": DOCUMENT_SOURCE, "score": 1}]}

    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: None)
    monkeypatch.setattr(specrag.cli, "run_graph", run_graph)
    assert main(["--json", "ask", "Capital?", "--document", doc]) == 0
    source = json.loads(capsys.readouterr().out)["sources"][0]["source"]
    assert source.endswith("caf\\xe9.txt"), source  # as `index` names it, not a surrogate
    source.encode("utf-8")  # printable on a strict UTF-8 stdout


def test_a_document_of_an_unsupported_type(capsys, tmp_path):
    """--document takes the file types `index` takes (it read a .csv that index refused)."""
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n")
    line = one_line_error(capsys, main(["ask", "q", "--document", str(table)]))
    assert "unsupported file type .csv" in line and "supported: .txt" in line


def test_bad_model_path(capsys, tmp_path):
    doc = tmp_path / "d.txt"
    doc.write_text("some text")
    line = one_line_error(
        capsys,
        main(["ask", "q", "--document", str(doc), "--set", "answer_model=hf:/no/such/model"]),
    )
    assert "/no/such/model" in line
    assert "model path not found" in line


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["bench", "rapid", "--models", "pair", "--sets", "long"], "bench rag --models pair"),
        (["bench", "rag", "--sets", "long"], "bench rag --models pair"),
        (["bench", "rag", "--models", "pair", "--sets", "long,trivia"], "unknown set(s) trivia"),
        (["bench", "rag", "--models", "pair", "--sets", ","], "(none given)"),
        (["bench", "rag", "--dtype", "bf16"], "--dtype applies to"),
        (["bench", "load", "--dtype", "bf16"], "--dtype applies to"),
        (["bench", "rapid", "--dtype", "bogus"], "unknown dtype 'bogus'"),
        (["bench", "rag", "--models", "pair", "--dtype", "bogus"], "unknown dtype 'bogus'"),
        (["bench", "rapid", "--dtype", "int8"], "int8 is for a drafter only"),
        (["ask", "Who?", "--set", "dtype=int8"], r"set drafter_dtype=int8"),
    ],
)
def test_bad_bench_sets(capsys, argv, expected):
    assert expected in one_line_error(capsys, main(argv))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["ask", "hi", "--models", "foo"], "argument --models: invalid choice: 'foo'"),
        (["bench", "nope"], "argument which: invalid choice: 'nope'"),
        (["ask", "hi", "--bogus"], "unrecognized arguments: --bogus (see `specrag ask --help`)"),
        ([], "the following arguments are required: command"),
    ],
)
def test_usage_errors_are_one_line(capsys, argv, expected):
    """argparse's own errors too: one line naming the --help to read, not a usage block."""
    line = one_line_error(capsys, main(argv))
    assert expected in line and "--help`)" in line, line


def test_an_empty_thread_id_is_refused(capsys):
    """`--thread ""` ran without a checkpoint, silently (a new-user review, 2026-12-03)."""
    line = one_line_error(capsys, main(["ask", "hi", "--thread", " "]))
    assert "--thread needs a conversation id" in line


def test_a_thread_id_that_is_not_text_is_refused_before_any_model_loads(capsys, monkeypatch):
    """A review (2026-12-06): ``--thread $'\\xff'`` (a lone surrogate in Python) loaded the
    models, recorded the thread's settings, then failed in SQLite with a UnicodeEncodeError
    (exit 1, an unexpected error's line)."""
    import specrag.cli

    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: pytest.fail("loaded models"))
    for thread in ("\udcff", "a\tb"):
        line = one_line_error(capsys, main(["ask", "hi", "--thread", thread]))
        assert "--thread" in line and "UTF-8 text without control characters" in line, line
    for thread in (
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0645",
        "a\u00a0b",
        "\U0001f468\u200d\U0001f373",
    ):
        assert specrag.cli.thread_id_ok(thread)  # joiners and a no-break space are text


def test_an_ask_on_a_thread_in_use_waits_for_it_and_says_so(capsys, monkeypatch, tmp_path):
    """Two `ask --thread t` at once lost one's turn (a review, 2026-12-06): the second now
    waits for the first - saying so on stderr - and records its settings once it runs."""
    import asyncio
    import threading

    import specrag.cli
    from specrag import persistence
    from specrag.persistence import thread_lock
    from specrag.runner import thread_settings

    doc = tmp_path / "doc.txt"
    doc.write_text("Paris is the capital of France.")
    ran = threading.Event()

    async def run_graph(*a, **k):
        ran.set()
        raise InputError("stopped here")

    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: None)
    monkeypatch.setattr(specrag.cli, "run_graph", run_graph)
    held, release = threading.Event(), threading.Event()

    async def hold():  # another run on the thread
        async with thread_lock("t-busy"):
            held.set()
            await asyncio.to_thread(release.wait, 30)

    other = threading.Thread(target=asyncio.run, args=(hold(),))
    other.start()
    assert held.wait(30)
    told = threading.Event()  # the asker met the lock (a sleep raced it on a loaded machine)
    real_lock = persistence.thread_lock

    def lock(thread, on_wait=None):
        def waiting():
            on_wait()
            told.set()

        return real_lock(thread, waiting)

    monkeypatch.setattr(persistence, "thread_lock", lock)
    codes = []
    asker = threading.Thread(
        target=lambda: codes.append(
            main(
                ["ask", "Capital?", "--thread", "t-busy", "--document", str(doc), "--set", "seed=4"]
            )
        )
    )
    asker.start()
    assert told.wait(30)
    time.sleep(0.2)  # it keeps waiting
    assert not ran.is_set() and thread_settings("t-busy") == {}  # waiting, nothing recorded
    release.set()
    other.join(30)
    asker.join(30)
    assert ran.is_set() and thread_settings("t-busy") == {"seed": "4"}
    captured = capsys.readouterr()
    note = "'t-busy' is in use by another run: waiting for it to finish"
    assert captured.err.count(note) == 1  # told once, not at every poll (a mutation review)
    assert "stopped here" in captured.err and codes == [2]


def test_resume_without_an_interrupted_run(capsys):
    line = one_line_error(capsys, main(["ask", "--thread", "never-run", "--resume"]))
    assert "thread 'never-run' has no interrupted run to resume" in line


def test_resume_with_a_document(capsys, tmp_path):
    doc = tmp_path / "d.txt"
    doc.write_text("text")
    line = one_line_error(
        capsys, main(["ask", "--thread", "t", "--resume", "--document", str(doc)])
    )
    assert "drop --document" in line


def test_resume_goes_on_with_the_settings_its_run_started_with(capsys):
    """--resume reads the thread's kept settings (--models, --set, ...); flags given now win."""
    from specrag.runner import save_thread_settings, thread_settings

    save_thread_settings("t-set", {"seed": "-5"})  # as if its run had started with them
    assert thread_settings("t-set") == {"seed": "-5"} and thread_settings("other") == {}
    line = one_line_error(capsys, main(["ask", "--thread", "t-set", "--resume"]))
    assert "seed" in line  # the kept setting was applied (and is out of range)
    line = one_line_error(capsys, main(["ask", "--thread", "t-set", "--resume", "--set", "seed=3"]))
    assert "has no interrupted run to resume" in line  # the flag given now replaced it


def test_a_resume_that_waited_while_another_run_took_the_thread_is_refused(capsys, monkeypatch):
    """A review (2026-12-07): `--resume` read the thread's settings (its models, budgets)
    before it waited for the thread; a run started meanwhile (and interrupted) saved its own,
    and the resume went on with that run using the older run's models."""
    import specrag.cli
    from specrag.runner import Unfinished, save_thread_settings

    save_thread_settings("t-race", {"seed": "3"})  # the interrupted run this resume read

    async def unfinished(thread):
        return Unfinished(("answer",), "Paris is the capital of France.")

    def another_run_starts(*a, **k):  # while this one loaded its models
        save_thread_settings("t-race", {"seed": "4"})

    async def run_graph(*a, **k):
        raise AssertionError("resumed with the settings of a run before the latest")

    monkeypatch.setattr(specrag.cli, "unfinished_run", unfinished)
    monkeypatch.setattr(specrag.cli, "preload", another_run_starts)
    monkeypatch.setattr(specrag.cli, "run_graph", run_graph)
    line = one_line_error(capsys, main(["ask", "--thread", "t-race", "--resume"]))
    assert "was run again while this --resume waited" in line, line


def test_a_thread_keeps_its_settings_only_once_its_run_starts(capsys, monkeypatch, tmp_path):
    """A command that fails before its run (a model that does not load, no index) must not
    replace the settings of the thread's interrupted run, which --resume goes on with."""
    import specrag.cli
    from specrag.errors import ModelLoadError
    from specrag.runner import save_thread_settings, thread_settings

    doc = tmp_path / "doc.txt"
    doc.write_text("Paris is the capital of France.")
    save_thread_settings("t-run", {"models": "pair"})  # the interrupted run's

    def no_load(*a, **k):
        raise ModelLoadError("cannot load")

    monkeypatch.setattr(specrag.cli, "preload", no_load)
    ask = ["ask", "Capital?", "--thread", "t-run", "--document", str(doc), "--set", "seed=3"]
    assert "cannot load" in one_line_error(capsys, main(ask))
    assert thread_settings("t-run") == {"models": "pair"}  # kept as it was
    seen = {}

    async def run_graph(*a, **k):
        seen.update(thread_settings("t-run"))
        raise InputError("stopped here")

    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: None)
    monkeypatch.setattr(specrag.cli, "run_graph", run_graph)
    assert "stopped here" in one_line_error(capsys, main(ask))
    assert seen == {"seed": "3"}  # saved before the run: this command's own settings


# what result_json makes of a document run's result, for the CLI tests that fake the run
DOCUMENT_VIEW = {
    "answer": "The garden.",
    "route": "generate",
    "reason": "r",
    "sources": [{"n": 1, "source": "document", "score": 0.5}],
    "timings": {"load_s": 0.0},
}


def test_asks_load_time_counts_the_models_the_cli_loaded_first(capsys, monkeypatch, tmp_path):
    """A mutation review (2026-12-08): `load_s` holding only what the run itself loaded
    passed every unit test, yet the CLI loads the models before the run: `--json` said
    ~0 s after a load of seconds."""
    import json

    import specrag.cli

    doc = tmp_path / "doc.txt"
    doc.write_text("Paris is the capital of France.")
    view = {**DOCUMENT_VIEW, "timings": {"load_s": 0.25}}  # what the run loaded itself

    async def run_graph(*a, **k):
        return {}

    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: time.sleep(0.1))
    monkeypatch.setattr(specrag.cli, "run_graph", run_graph)
    monkeypatch.setattr(specrag.cli, "result_json", lambda result: json.loads(json.dumps(view)))
    assert main(["ask", "Capital?", "--document", str(doc), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["timings"]["load_s"] >= 0.35  # both loads


def test_a_resumed_document_run_cites_the_file_its_first_process_read(
    capsys, monkeypatch, tmp_path
):
    """A new user's report (2026-12-05): `ask --document contract.txt --thread t` cited
    "contract.txt"; the same run after `--resume` cited "document" (the graph's name for a
    given text), since --resume takes no --document."""
    import json
    import types

    import specrag.cli
    from specrag.runner import thread_document

    doc = tmp_path / "contract.txt"
    doc.write_text("Clause 15: the tenant keeps the garden.")
    view = DOCUMENT_VIEW

    async def run_graph(*a, **k):
        if not a[0]:  # the resumed run (no question)
            return {}
        raise KeyboardInterrupt  # the first process stops mid-run

    async def unfinished_run(thread):
        return types.SimpleNamespace(needs_index=False, document=doc.read_text())

    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: None)
    monkeypatch.setattr(specrag.cli, "run_graph", run_graph)
    monkeypatch.setattr(specrag.cli, "unfinished_run", unfinished_run)
    monkeypatch.setattr(specrag.cli, "result_json", lambda result: json.loads(json.dumps(view)))
    monkeypatch.chdir(tmp_path)  # named as typed: the first run cites "contract.txt" too
    ask = ["ask", "Clause 15?", "--document", "contract.txt", "--thread", "t-doc", "--json"]
    assert main(ask) == 130  # Ctrl-C
    assert thread_document("t-doc") == "contract.txt"
    capsys.readouterr()
    assert main(["ask", "--thread", "t-doc", "--resume", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sources"][0]["source"] == "contract.txt"


def test_a_resumed_pdf_run_cites_the_page_its_first_process_would_have(
    capsys, monkeypatch, tmp_path
):
    """A review (2026-12-06): a PDF run resumed cited "contract.pdf" where its first process
    cites "contract.pdf#page=2": the page starts were not kept with the thread."""
    import json
    import types

    import specrag.cli
    from specrag.indexing.documents import join_pages

    pages = ["Clause 1: rent is due monthly.", "Clause 15: the tenant keeps the garden."]
    text, starts = join_pages(pages)
    import specrag.indexing.documents as documents

    monkeypatch.setattr(documents, "read_pdf_pages", lambda path: pages)
    (tmp_path / "contract.pdf").write_bytes(b"%PDF-1.4 stand-in")
    cited = {"chunks": [{"id": "c2", "text": pages[1]}], "citations": [{"n": 1, "id": "c2"}]}

    async def run_graph(*a, **k):
        if not a[0]:  # the resumed run (no question)
            return cited
        raise KeyboardInterrupt  # the first process stops mid-run

    async def unfinished_run(thread):
        return types.SimpleNamespace(needs_index=False, document=text)

    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: None)
    monkeypatch.setattr(specrag.cli, "run_graph", run_graph)
    monkeypatch.setattr(specrag.cli, "unfinished_run", unfinished_run)
    monkeypatch.setattr(
        specrag.cli, "result_json", lambda result: json.loads(json.dumps(DOCUMENT_VIEW))
    )
    monkeypatch.chdir(tmp_path)
    ask = ["ask", "Clause 15?", "--document", "contract.pdf", "--thread", "t-pdf", "--json"]
    assert main(ask) == 130
    capsys.readouterr()
    assert main(["ask", "--thread", "t-pdf", "--resume", "--json"]) == 0
    (source,) = json.loads(capsys.readouterr().out)["sources"]
    assert source["source"] == "contract.pdf#page=2" and source["page"] == 2


def test_an_index_given_with_resume_replaces_the_saved_one(tmp_path):
    import argparse

    from specrag.cli import make_context

    args = argparse.Namespace(set=["seed=4"], index_dir=str(tmp_path), index_url=None, models=None)
    saved = {"index_url": "http://localhost:8000", "seed": "2", "top_k": "2"}
    ctx = make_context(args, saved)
    assert (ctx.index_url, ctx.index_dir, ctx.seed, ctx.top_k) == ("", str(tmp_path), 4, 2)


def test_no_index_is_told_before_the_embedding_model_loads(capsys, monkeypatch, tmp_path):
    import importlib

    services = importlib.import_module("specrag.graph.services")  # specrag.graph: the graph

    def loading(*a, **k):
        raise AssertionError("the embedding model loaded before the index was checked")

    monkeypatch.setattr(services, "load_embeddings", loading)
    line = one_line_error(capsys, main(["ask", "Who?", "--index-dir", str(tmp_path / "none")]))
    assert "no index" in line


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("answer_model=bogus:x", "cannot create chat model 'bogus:x': Unable to infer"),
        ("draft_model=anthropic:claude-x", "needs the langchain-anthropic package"),
        # LangChain's fallback, langchain-community's ChatOllama, is gone from community 0.4:
        # it failed after 21 s, "module ... has no attribute ChatOllama" (a new user)
        ("answer_model=ollama:llama3", "needs the langchain-ollama package"),
    ],
)
def test_a_provider_model_langchain_cannot_build_is_told_before_the_index_opens(
    capsys, monkeypatch, setting, expected
):
    """Any `provider:model` passed the settings check and failed once the index's embedding
    model had loaded (in `demo`, after indexing 1,204 paragraphs; a new-user review)."""
    import importlib

    services = importlib.import_module("specrag.graph.services")  # specrag.graph: the graph

    def opening(*a, **k):
        raise AssertionError("the index opened before the model spec was checked")

    monkeypatch.setattr(services, "open_index", opening)
    assert expected in one_line_error(capsys, main(["ask", "Who?", "--set", setting]))


def test_resume_with_a_question(capsys):
    line = one_line_error(capsys, main(["ask", "Who?", "--thread", "t", "--resume"]))
    assert "drop the question, or drop --resume" in line


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("dtype=foo", "dtype='foo' (allowed: auto, float32"),
        ("drafter_dtype=int4", "drafter_dtype='int4' (allowed: auto"),
        ("device=tpu", "device='tpu' (allowed: auto, cpu, cuda, cuda:N, mps)"),
    ],
)
def test_bad_placement_settings_fail_when_the_settings_are_built(capsys, setting, expected):
    """Not only once a model loads: `specrag config` (no model) refuses them too."""
    assert expected in one_line_error(capsys, main(["config", "--set", setting]))


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "mps"])
def test_an_int8_drafter_on_a_gpu_is_refused_when_the_settings_are_built(capsys, device):
    """A review (2026-12-06): refused only once the drafter loaded, after the answer model
    (minutes on a GPU) - and the answer model dropped its drafter with a warning first. A
    mutation review, 2026-12-08: "mps" left out of the check passed every test."""
    line = one_line_error(
        capsys, main(["config", "--set", "drafter_dtype=int8", "--set", f"device={device}"])
    )
    assert "int8 dynamic quantization runs on CPU only" in line


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("top_k=2147483648", "top_k=2147483648 (allowed: >= 1 and <= 10000)"),
        ("answer_max_tokens=99999999999999999999", "(allowed: >= 1 and <= 16777216)"),
        ("prefix_cache_mib=9223372036854775807", "(allowed: >= 0 and <= 16777216)"),
        ("retrieval_timeout_s=0", "retrieval_timeout_s=0.0 (allowed: > 0"),  # every run late
        ("answer_timeout_s=0", "answer_timeout_s=0.0 (allowed: > 0"),
    ],
)
def test_a_count_past_what_any_library_takes_is_refused(capsys, setting, expected):
    """`--set top_k=2147483648` passed the check, and every search then failed inside
    retrieval ("OverflowError"): the run fell back to an unverified draft."""
    line = one_line_error(capsys, main(["config", "--set", setting]))
    assert line.startswith("specrag: error: invalid configuration: ") and expected in line


def test_a_collection_that_is_not_there_is_named_not_created(capsys, tmp_path):
    """`--set collection=typo` opened the local index and created an empty collection of that
    name, then answered from nothing (found by a new-user review, 2026-12-03)."""
    import chromadb

    notes = tmp_path / "notes.txt"
    notes.write_text("Rollo led the Norse settlers of Normandy.", encoding="utf-8")
    index = tmp_path / "idx"
    assert main(["index", str(notes), "--index-dir", str(index), "--json"]) == 0
    capsys.readouterr()
    code = main(["ask", "Who?", "--index-dir", str(index), "--set", "collection=specrg"])
    line = one_line_error(capsys, code)
    assert "no collection 'specrg'" in line and "collections: specrag" in line
    names = [c.name for c in chromadb.PersistentClient(path=str(index)).list_collections()]
    assert names == ["specrag"]
    code = main(["ask", "Who?", "--index-dir", str(index), "--set", "collection=x"])
    assert "bad collection name 'x'" in one_line_error(capsys, code)


def test_a_library_message_over_several_lines_stays_on_one(capsys, monkeypatch):
    """A pydantic or transformers error inside a ModelLoadError spans lines: one line still."""
    import specrag.cli
    from specrag.errors import ModelLoadError

    def failing(args, saved=None):
        raise ModelLoadError("cannot create chat model 'x': 1 validation error\n  api_key\n")

    monkeypatch.setattr(specrag.cli, "make_context", failing)
    line = one_line_error(capsys, main(["ask", "Who?"]))
    assert line.endswith("cannot create chat model 'x': 1 validation error api_key")


def test_an_empty_demo_question_is_refused_before_indexing(capsys, monkeypatch):
    """`demo --question ""` failed only after indexing 1,204 paragraphs and loading models."""
    import specrag.data.datasets

    def no_indexing():
        raise AssertionError("indexed before checking the questions")

    monkeypatch.setattr(specrag.data.datasets, "squad_paragraphs", no_indexing)
    line = one_line_error(capsys, main(["demo", "--question", "Who?", "--question", " "]))
    assert "the question is empty" in line


def test_a_hub_id_not_in_the_cache_says_the_cli_runs_offline(capsys, monkeypatch, tmp_path):
    """The CLI sets HF_HUB_OFFLINE=1: an uncached hub id failed without saying why."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty Hugging Face cache
    doc = tmp_path / "d.txt"  # no index needed: the model load is what fails
    doc.write_text("Rollo led the Norse.")
    argv = ["ask", "Who?", "--document", str(doc)]
    argv += ["--set", "answer_model=hf:no-such-org/x", "--set", "draft_model=hf:no-such-org/x"]
    line = one_line_error(capsys, main(argv))
    # said before any model loads (a mistyped relative path reads as a hub id too)
    assert "no model folder 'no-such-org/x' here, and no hub model 'no-such-org/x'" in line
    assert "HF_HUB_OFFLINE=0 downloads" in line


def test_the_console_command_is_offline_before_the_package_loads(tmp_path):
    """`specrag` set HF_HUB_OFFLINE=1 only after the package had imported huggingface_hub,
    which reads it once: an uncached hub id retried the network for a minute, line by line,
    then blamed offline mode."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty Hugging Face cache
    doc = tmp_path / "d.txt"
    doc.write_text("Rollo led the Norse.")
    argv = ["ask", "Who?", "--document", str(doc)]
    argv += ["--set", "answer_model=hf:no-such-org/x", "--set", "draft_model=hf:no-such-org/x"]
    done = subprocess.run(
        [sys.executable, "-c", "import specrag_entry, sys; sys.exit(specrag_entry.main())"] + argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    lines = [line for line in lines if not LOADING.fullmatch(line)]  # the note before loading
    assert done.returncode != 0 and len(lines) == 1, done.stderr[-2000:]
    assert "no hub model 'no-such-org/x' in the Hugging Face cache" in lines[0]
    assert "HF_HUB_OFFLINE=0 downloads" in lines[0]


def test_a_failed_json_run_still_prints_one_json_document(capsys):
    """`--json` promises one JSON document on stdout: a run that fails prints its error there
    too (beside the one line on stderr), so a script reading stdout gets JSON either way."""
    import json

    assert main(["ask", "  ", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().startswith("specrag: error:") and "empty" in captured.err
    doc = json.loads(captured.out)
    assert doc["exit_code"] == 2 and "empty" in doc["error"]
    assert main(["ask", "  "]) == 2 and capsys.readouterr().out == ""  # without --json: none


def test_ctrl_c_after_the_json_document_prints_no_second_one(capsys, monkeypatch):
    """A mutation review (2026-12-08): printing the error document even when the command had
    printed its own passed every test, yet Ctrl-C during the trace's send (or the prefix
    cache's flush) after a finished `--json` run put two JSON documents on stdout."""
    import json

    import specrag.cli

    def interrupted(after_error: bool = False) -> None:
        raise KeyboardInterrupt  # the send re-raises it after a finished run

    monkeypatch.setattr(specrag.cli, "send_traces", interrupted)
    assert main(["config", "--json"]) == 130
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 1, lines[1:]  # (the extra documents)
    assert "error" not in json.loads(lines[0])  # the config's document, printed before
    assert "specrag: interrupted" in captured.err


def test_a_duration_too_long_for_the_os_timers_is_refused(capsys):
    """`retrieval_timeout_s=1e10` passed the range check and overflowed a lock's timeout
    (`OverflowError: timestamp out of range`, exit 1) when the index opened."""
    line = one_line_error(capsys, main(["ask", "q", "--set", "retrieval_timeout_s=1e10"]))
    assert "retrieval_timeout_s" in line and "86400" in line


def test_a_malformed_index_url_is_told_before_the_embedding_model_loads(capsys, monkeypatch):
    """'http://[::1' raised ValueError outside the check (exit 1), and only after the
    embedding model had loaded."""
    import importlib

    services = importlib.import_module("specrag.graph.services")

    def loading(*a, **k):
        raise AssertionError("the embedding model loaded before the URL was checked")

    monkeypatch.setattr(services, "load_embeddings", loading)
    line = one_line_error(capsys, main(["ask", "Who?", "--index-url", "http://[::1"]))
    assert "bad --index-url" in line


def test_unusable_thread_checkpoints_are_one_line_before_any_model_loads(
    capsys, monkeypatch, tmp_path
):
    """A corrupt checkpoints file, or a data dir that is a file, gave a DatabaseError /
    FileExistsError with exit 1, and for a new question only after the models had loaded."""
    import specrag.cli

    def no_load(*a, **k):
        raise AssertionError("models loaded before the checkpoints were checked")

    monkeypatch.setattr(specrag.cli, "preload", no_load)
    doc = tmp_path / "doc.txt"
    doc.write_text("Paris is the capital of France.")
    data = tmp_path / "data"
    data.mkdir()
    (data / "checkpoints.sqlite").write_bytes(b"not a database at all" * 100)
    ask = ["ask", "Capital?", "--thread", "t1", "--document", str(doc)]
    line = one_line_error(capsys, main(ask))
    assert "checkpoints" in line and "move the file aside" in line
    assert (data / "checkpoints.sqlite").read_bytes().startswith(b"not a database")  # kept
    line = one_line_error(capsys, main(["ask", "--thread", "t1", "--resume"]))
    assert "checkpoints" in line
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(doc))  # a file where the folder should be
    line = one_line_error(capsys, main(ask))
    assert "cannot use the data dir" in line


def test_checkpoints_damaged_past_their_header_are_told_before_models_load(
    capsys, monkeypatch, tmp_path
):
    """A review (2026-12-07): opening read only the schema page, so a checkpoints file whose
    data pages were damaged passed the early check and failed later as an "unexpected"
    sqlite3.DatabaseError naming no file (for a new question after the models loaded)."""
    import asyncio
    import random
    import sqlite3

    import specrag.cli
    from specrag.errors import DataDirError
    from specrag.persistence import sqlite_checkpointer
    from specrag.runner import unfinished_run

    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(data))
    path = data / "checkpoints.sqlite"
    with sqlite3.connect(path) as conn:  # a file LangGraph's saver set up, then filled
        conn.execute("CREATE TABLE filler (x BLOB)")
        conn.executemany("INSERT INTO filler VALUES (?)", [(b"y" * 3000,)] * 200)
    asyncio.run(unfinished_run("t0"))  # a sound file: opens (setup adds its tables)
    raw = bytearray(path.read_bytes())
    noise = random.Random(0)
    for at in range(len(raw) // 2, len(raw), 4096):  # pages in the back half, header intact
        raw[at : at + 300] = bytes(noise.getrandbits(8) for _ in range(300))
    path.write_bytes(bytes(raw))

    async def opened() -> None:
        async with sqlite_checkpointer():  # without the check: the schema still reads
            pass

    asyncio.run(opened())
    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: pytest.fail("models loaded"))
    doc = tmp_path / "doc.txt"
    doc.write_text("Paris is the capital of France.")
    line = one_line_error(
        capsys, main(["ask", "Capital?", "--thread", "t1", "--document", str(doc)])
    )
    assert "cannot use the thread checkpoints at" in line and "move the file aside" in line

    async def read_damaged() -> None:
        async with sqlite_checkpointer() as saver:
            await saver.conn.execute("SELECT count(*), sum(length(x)) FROM filler")
            async with saver.conn.execute("SELECT sum(length(x)) FROM filler") as cur:
                await cur.fetchall()

    with pytest.raises(DataDirError, match="move the file aside"):
        asyncio.run(read_damaged())


def test_a_busy_checkpoints_database_is_not_called_damaged(monkeypatch, tmp_path):
    """A mutation review (2026-12-08): treating SQLite's OperationalError ("database is
    locked", another process past the busy timeout) as damage passed every test, yet it told
    the user to move the file aside, which starts every thread over."""
    import asyncio
    import sqlite3

    from specrag.persistence import sqlite_checkpointer

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))

    async def busy() -> None:
        async with sqlite_checkpointer():
            raise sqlite3.OperationalError("database is locked")

    with pytest.raises(sqlite3.OperationalError, match="database is locked") as raised:
        asyncio.run(busy())
    assert type(raised.value) is sqlite3.OperationalError  # as it was, not a DataDirError
    assert (tmp_path / "checkpoints.sqlite").exists()


def test_a_read_only_data_dir_is_named_for_thread_checkpoints(capsys, monkeypatch, tmp_path):
    """A read-only data dir with no checkpoints file said "unable to open database file (move
    the file aside ...)": there was no file to move (a new-user review, 2026-12-06)."""
    import os

    data = tmp_path / "ro"
    (data / "checkpoints.sqlite").mkdir(parents=True)  # SQLite cannot open it, as read-only
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(data))  # (tests may run as root: mocked)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: str(p) != str(data) and real(p, mode))
    line = one_line_error(capsys, main(["ask", "--thread", "t1", "--resume"]))
    assert f"cannot use the data dir {data}: it is not writable" in line, line


def test_a_file_sqlite_cannot_open_never_reaches_aiosqlite(capsys, monkeypatch, tmp_path):
    """aiosqlite's failed open queued its worker thread's stop without waiting for it; the
    thread then found the event loop closed ("Event loop is closed" in a thread, seen as a
    warning in one suite run of six)."""
    import aiosqlite

    def no_connect(*a, **k):
        raise AssertionError("aiosqlite was asked to open a file SQLite cannot open")

    monkeypatch.setattr(aiosqlite, "connect", no_connect)
    data = tmp_path / "data"
    (data / "checkpoints.sqlite").mkdir(parents=True)
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(data))
    line = one_line_error(capsys, main(["ask", "--thread", "t1", "--resume"]))
    assert "cannot use the thread checkpoints" in line, line


def test_a_corrupt_index_file_says_chromas_reason(capsys, tmp_path):
    """A chroma.sqlite3 that is not a database read "cannot open index at ...:
    'RustBindingsAPI' object has no attribute 'bindings'" (the real error was dropped by a
    first open, and Chroma kept the broken client for the second)."""
    bad = tmp_path / "idx"
    bad.mkdir()
    (bad / "chroma.sqlite3").write_text("garbage\n")
    line = one_line_error(capsys, main(["ask", "Who?", "--index-dir", str(bad)]))
    assert "cannot open index at" in line and "not a database" in line, line


def test_a_thread_keeps_local_model_paths_absolute_and_names_as_given(tmp_path, monkeypatch):
    """`hf:./mymodel` was kept as written, so `--resume` from another directory failed or
    loaded another model; a folder named like a model name must not turn the name into a
    path."""
    import argparse

    from specrag.cli import thread_overrides

    (tmp_path / "mymodel").mkdir()
    (tmp_path / "embedded").mkdir()
    (tmp_path / "minilm").mkdir()
    monkeypatch.chdir(tmp_path)
    sets = ["answer_model=hf:./mymodel", "draft_model=embedded", "embedding_model=minilm"]
    args = argparse.Namespace(set=sets, index_dir="idx", index_url=None, models=None)
    (tmp_path / "idx").mkdir()
    kept = thread_overrides(args)
    assert kept["answer_model"] == f"hf:{tmp_path / 'mymodel'}"
    assert kept["draft_model"] == "embedded"
    assert kept["embedding_model"] == str(tmp_path / "minilm")
    assert kept["index_dir"] == str(tmp_path / "idx")


def test_a_model_name_with_spaces_around_it_is_kept_as_checked():
    """The check stripped `answer_model`, the run did not: 'embedded ' (Studio's form, a dict
    context) passed the check, then every run failed to load it (a review, 2026-12-06)."""
    from specrag.graph.context import SpecRagContext

    ctx = SpecRagContext(answer_model="embedded ", draft_model=" hf:./x ", embedding_model=" e")
    assert (ctx.answer_spec, ctx.draft_spec, ctx.embedding_model) == ("embedded", "hf:./x", "e")


@pytest.mark.parametrize("spec", ["hf:", "openai:", ":gpt"])
def test_a_model_spec_that_names_no_model_is_refused(capsys, spec):
    """`--set answer_model=hf:` skipped the path check and loaded the current folder."""
    line = one_line_error(capsys, main(["ask", "q", "--set", f"answer_model={spec}"]))
    assert "names no model" in line


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        ("answer_model=foo", "unknown model answer_model='foo'"),
        ("draft_model=qwen-0.5b", "unknown model draft_model='qwen-0.5b'"),
        ("embedding_model=", "embedding_model='' names no model"),
    ],
)
def test_a_model_name_no_loader_knows_is_refused_by_the_config_check(capsys, setting, why):
    """`answer_model=foo` passed `specrag config` and failed only after the index and its
    embedding model had loaded; an empty embedding_model read the current folder."""
    for argv in (["config", "--set", setting], ["ask", "q", "--set", setting]):
        line = one_line_error(capsys, main(argv))
        assert line.startswith("specrag: error: invalid configuration: ") and why in line


@pytest.mark.parametrize(
    "argv",
    [["ask", "q", "--json", "--nope"], ["index", "--json"], ["ask", "--json", "--models", "big"]],
)
def test_a_usage_error_under_json_is_a_json_document_too(capsys, argv):
    import json

    line = one_line_error(capsys, main(argv))
    assert "--help" in line
    main(argv)
    assert json.loads(capsys.readouterr().out)["exit_code"] == 2


def test_a_thread_keeps_an_index_dir_named_like_a_model_absolute(tmp_path, monkeypatch):
    import argparse

    from specrag.cli import thread_overrides

    (tmp_path / "embedded").mkdir()
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(set=[], index_dir="embedded", index_url=None, models=None)
    assert thread_overrides(args)["index_dir"] == str(tmp_path / "embedded")


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["ask", "q", "--document", ""], "--document needs a file"),
        (["ask", "q", "--document", "."], "is a folder, not a file"),
        (["ask", "q", "--index-dir", ""], "--index-dir is empty: give a folder"),
        # --document searches its file: an index named beside it was dropped without a word
        (["ask", "q", "--document", "x.txt", "--index-dir", "idx"], "drop --index-dir"),
        # named as the user gave it (a review, 2026-12-07: "drop --index-dir" after --set)
        (["ask", "q", "--document", "x", "--set", "index_url=http://h:1"], "drop --set index_url"),
        (["ask", "q", "--document", "x.txt", "--set", "index_dir=/tmp"], "drop --set index_dir"),
        # a second file replaced the first without a word (a review, 2026-12-07)
        (["ask", "q", "--document", "a.txt", "--document", "b.txt"], "--document: takes one file"),
        (["index", "x", "--index-url", " "], "--index-url is empty: give a URL"),
        (["config", "--index-dir", "a", "--index-url", "http://h:1"], "name two indexes"),
        (["bench", "rag", "--out", ""], "--out is empty"),
        (["bench", "rapid", "--dtype", ""], "unknown dtype ''"),
        (["bench", "rapid", "--dtype", "int8"], "bench already runs the drafter in int8"),
        (["config", "--js"], "unrecognized arguments: --js"),
    ],
)
def test_an_empty_or_misplaced_value_is_refused_not_read_as_the_default(capsys, argv, why):
    """An unset $FILE or $DIR (`--document ""`, `--index-dir ""`) quietly meant "no document"
    or the default index (which the demo's paragraphs share); `--out ""` wrote results into
    the current folder; an abbreviated flag was taken for the whole one."""
    line = one_line_error(capsys, main(argv))
    assert why in line


def test_json_before_the_subcommand_or_with_a_value_still_gets_a_json_document(capsys):
    import json

    assert main(["--json", "config"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)
    line = one_line_error(capsys, main(["ask", "q", "--json=1"]))
    assert "--json" in line  # one_line_error read the JSON document on stdout too
    assert main(["--json=x", "ask", "q"]) == 2  # before the subcommand: a document too
    doc = json.loads(capsys.readouterr().out)
    assert "--json=x" in doc["error"] and doc["exit_code"] == 2


def test_index_paths_after_a_flag_are_all_indexed(tmp_path, monkeypatch, capsys):
    import json

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "a.md").write_text("Rollo led the Norse settlers.")
    (tmp_path / "b.md").write_text("The treaty was signed in 911.")
    assert main(["index", str(tmp_path / "a.md"), "--json", str(tmp_path / "b.md")]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == 2


def test_config_and_index_do_not_need_the_pair_installed(capsys, monkeypatch):
    """`config --models pair` (listing what the preset sets) failed when the pair was not
    installed; neither it nor `index` runs a language model."""
    import json

    from specrag.models import pair

    monkeypatch.setattr(pair, "missing", lambda: f"Fake is not installed: {pair.INSTALL_HINT}")
    assert main(["config", "--models", "pair", "--json"]) == 0
    rows = {r["name"]: r["value"] for r in json.loads(capsys.readouterr().out)}
    assert rows["models"] == "pair"
    line = one_line_error(capsys, main(["ask", "q", "--models", "pair"]))
    assert "make models-pair" in line
    # one of the pair's models named on its own needs it too: said before anything loads
    line = one_line_error(capsys, main(["ask", "q", "--set", "answer_model=qwen2.5-coder-1.5b"]))
    assert "make models-pair" in line


def test_a_missing_gguf_model_file_is_told_before_anything_loads(capsys, tmp_path):
    """A `.gguf` model path was checked only when that model loaded: `config` accepted it and
    `ask` failed after the embedding model, the index and the other model had loaded."""
    line = one_line_error(
        capsys, main(["config", "--set", f"answer_model=hf:{tmp_path / 'nope.gguf'}"])
    )
    assert "model file not found" in line and "nope.gguf" in line


def test_specrag_debug_0_is_off(capsys, monkeypatch):
    from specrag.cli import debug_mode

    for value, on in (("1", True), ("true", True), ("0", False), ("", False), ("no", False)):
        monkeypatch.setenv("SPECRAG_DEBUG", value)
        assert debug_mode() is on


def test_ctrl_c_while_the_package_imports_is_interrupted_not_a_traceback(capsys, monkeypatch):
    """`specrag config --json` interrupted in its first seconds (importing torch, LangChain)
    printed a KeyboardInterrupt traceback and no JSON document (a new-user review)."""
    import builtins
    import json
    import sys

    import specrag_entry

    real_import = builtins.__import__

    def importing(name, *args, **kwargs):
        if name == "specrag.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", importing)
    monkeypatch.setattr(sys, "argv", ["specrag", "config", "--json"])
    assert specrag_entry.main() == 130
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"error": "interrupted", "exit_code": 130}
    assert captured.err.strip() == "specrag: interrupted"


@pytest.mark.parametrize("command", ["index", "ask"])
def test_an_index_folder_that_is_a_file_is_said_so(capsys, monkeypatch, tmp_path, command):
    """`--index-dir afile` said "[Errno 17] File exists", a SPECRAG_DATA_DIR that is a file
    "no index at afile/index" (or "Not a directory")."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "d.md").write_text("Rollo led them.")
    argv = [command, str(tmp_path / "d.md") if command == "index" else "Who?"]
    line = one_line_error(capsys, main([*argv, "--index-dir", str(tmp_path / "afile")]))
    assert f"{tmp_path / 'afile'} is not a folder" in line
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "afile"))
    line = one_line_error(capsys, main(argv))
    assert f"afile/index as the index folder: {tmp_path / 'afile'} is not a folder" in line


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--models", "pair", "--set", "models=embedded"], "--models pair and --set models="),
        (["--index-dir", "a", "--set", "index_dir=b"], "--index-dir a and --set index_dir=b"),
        (["--set", "index_dir=a", "--index-url", "http://h:1"], "name two indexes"),
        (["--set", "index_url=http://h:1", "--index-dir", "a"], "name two indexes"),
    ],
)
def test_a_flag_and_a_set_that_disagree_are_refused(capsys, argv, expected):
    """`--models pair --set models=embedded` quietly ran the flag's, and `--set index_dir=a
    --index-url URL` quietly used one of the two indexes."""
    assert expected in one_line_error(capsys, main(["config", *argv]))


def test_a_flag_and_a_set_that_agree_are_one_setting(capsys, tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    assert main(["config", "--index-dir", "./idx", "--set", "index_dir=idx", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["index_dir"]["value"] == "./idx"


def test_an_unknown_flag_before_the_command_is_named(capsys):
    """`specrag --vers` said "the following arguments are required: command"."""
    assert "unrecognized arguments: --vers" in one_line_error(capsys, main(["--vers"]))
    # a command's own flag given before it is not unknown: the command is what is missing
    assert "required: command" in one_line_error(capsys, main(["--json"]))


def test_a_document_piped_on_stdin_is_read_and_cited_as_stdin(capsys, monkeypatch, tmp_path):
    """``--document -``: there was no way to pipe a document in (``/dev/stdin`` was "unsupported
    file type"); a terminal on stdin is one line instead of a wait for input."""
    import io
    import json

    import specrag.cli

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    seen = {}

    async def run_graph(question, ctx, document, **k):
        seen["document"] = document
        return {}

    view = DOCUMENT_VIEW
    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: None)
    monkeypatch.setattr(specrag.cli, "run_graph", run_graph)
    monkeypatch.setattr(specrag.cli, "result_json", lambda result: json.loads(json.dumps(view)))

    class Pipe(io.TextIOWrapper):
        def isatty(self):
            return False

    text = "Clause 15: the tenant keeps the garden. Café."
    monkeypatch.setattr("sys.stdin", Pipe(io.BytesIO(text.encode())))
    assert main(["ask", "Clause 15?", "--document", "-", "--json", "--thread", "t-in"]) == 0
    assert seen["document"] == text
    assert json.loads(capsys.readouterr().out)["sources"][0]["source"] == "stdin"
    from specrag.runner import thread_document

    assert thread_document("t-in") == "stdin"  # a --resume of it cites stdin too

    monkeypatch.setattr("sys.stdin", Pipe(io.BytesIO(b"  \n")))
    assert "the document is empty: stdin" in one_line_error(
        capsys, main(["ask", "Clause 15?", "--document", "-"])
    )

    class Terminal(Pipe):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdin", Terminal(io.BytesIO(b"")))
    assert "reads the document from a pipe" in one_line_error(
        capsys, main(["ask", "Clause 15?", "--document", "-"])
    )


def test_index_checks_no_answer_model_and_takes_no_models_flag(tmp_path, monkeypatch, capsys):
    """`index` runs no language model: a bad answer_model stopped it ("model path not found")
    and `--models` was accepted and did nothing."""
    import specrag.cli

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    args = specrag.cli.build_parser().parse_args(
        ["index", "a.txt", "--set", "answer_model=hf:/nonexistent"]
    )
    ctx = specrag.cli.make_context(args, answers=False, models=False)
    assert ctx.answer_model == "hf:/nonexistent"  # kept, unchecked: index never loads it
    assert "unrecognized arguments: --models" in one_line_error(
        capsys, main(["index", "a.txt", "--models", "pair"])
    )


def test_demo_says_nothing_before_an_index_that_cannot_be_used(tmp_path, monkeypatch, capsys):
    """`demo --index-url notaurl` printed "indexing 1204 SQuAD v2.0 dev paragraphs into ..."
    before its one error line."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    line = one_line_error(capsys, main(["demo", "--index-url", "notaurl"]))
    assert "bad --index-url 'notaurl'" in line


def test_a_draft_model_that_cannot_load_is_one_error_not_a_warning_first(
    capsys, monkeypatch, tmp_path, caplog
):
    """The answer model's warm-up left the bad draft model out as its drafter (a warning:
    "is left out"), then the draft model's own load failed the run: two lines that disagreed."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub id that is not cached fails at once
    spec = "draft_model=hf:someorg/somemodel-xyz"
    doc = tmp_path / "doc.txt"
    doc.write_text("Rollo led the Norse settlers of Normandy.")
    line = one_line_error(capsys, main(["ask", "Who?", "--document", str(doc), "--set", spec]))
    assert "somemodel-xyz" in line and "left out" not in caplog.text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--set", "collection="], "bad collection name ''"),
        (["--index-url", "notaurl"], "bad --index-url 'notaurl'"),
        (["--set", f"collection={'b' * 300}"], "(300 characters): at most 200 in a local index"),
    ],
)
def test_config_refuses_what_index_and_ask_refuse(capsys, tmp_path, monkeypatch, argv, said):
    """`specrag config` showed an empty collection name or a malformed --index-url with exit
    status 0, which index and ask refuse; and a 300-character name passed every check, then
    failed to save the files named after it ("File name too long") (a new user, 2026-12-06)."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path))
    assert said in one_line_error(capsys, main(["config", *argv]))
    if "300" in said:
        assert said in one_line_error(capsys, main(["index", str(tmp_path), *argv]))


def test_demo_json_keeps_the_scenarios_it_finished_when_a_later_one_fails(monkeypatch, capsys):
    """`demo --json` printed its scenarios only after the last: a failure or Ctrl-C in the
    third left stdout with only {"error": ...} (a CLI review). The error now carries them."""
    import json
    from types import SimpleNamespace

    from specrag import cli
    from specrag.data import datasets

    monkeypatch.setattr(datasets, "squad_paragraphs", lambda: [])
    report = SimpleNamespace(chunks_total=0, chunks_added=0, index_chunks=0)
    monkeypatch.setattr(cli, "index_with_progress", lambda *a, **k: report)
    monkeypatch.setattr(cli, "preload", lambda *a, **k: None)
    monkeypatch.setattr(cli, "result_json", lambda result: {"answer": result})
    asked = []

    async def run_graph(question, *args, **kwargs):
        asked.append(question)
        if len(asked) == 2:
            raise KeyboardInterrupt
        return f"answer to {question}"

    monkeypatch.setattr(cli, "run_graph", run_graph)
    argv = ["demo", "--json", "--question", "One?", "--question", "Two?", "--question", "3?"]
    assert cli.main(argv) == 130
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "interrupted" and doc["exit_code"] == 130
    assert [(f["question"], f["answer"]) for f in doc["finished"]] == [("One?", "answer to One?")]
    # a run that fails before finishing anything says only its error, as before
    assert cli.main(["config", "--json", "--set", "nosuchkey=1"]) == 2
    assert "finished" not in json.loads(capsys.readouterr().out)


def test_an_embedding_model_path_that_is_not_there_is_told_before_anything_loads(
    monkeypatch, capsys, tmp_path
):
    """`ask --document F --set embedding_model=./no-such-dir` loaded both chat models first
    (minutes for the pair), and `index` read every file first (a CLI review)."""
    import specrag.cli

    def no_load(*a, **k):
        raise AssertionError("models loaded before the embedding model was checked")

    monkeypatch.setattr(specrag.cli, "preload", no_load)
    doc = tmp_path / "doc.txt"
    doc.write_text("Rollo led the Norse settlers of Normandy.")
    bad = ["--set", "embedding_model=./no-such-dir"]
    line = one_line_error(capsys, main(["ask", "Who?", "--document", str(doc), *bad]))
    assert "embedding model path not found: ./no-such-dir" in line

    def no_read(*a, **k):
        raise AssertionError("files read before the embedding model was checked")

    monkeypatch.setattr(specrag.cli, "index_with_progress", no_read)
    monkeypatch.setattr("specrag.indexing.pipeline.load_files", no_read)
    line = one_line_error(capsys, main(["index", str(doc), *bad]))
    assert "embedding model path not found: ./no-such-dir" in line


@pytest.mark.parametrize("kind", ["no such user", "link loop"])
def test_a_bad_index_dir_given_twice_is_the_usual_error(capsys, tmp_path, kind):
    """--index-dir and --set index_dir both naming a path that cannot be resolved raised in
    their comparison: "unexpected error", exit 1 (a review, 2026-12-07)."""
    if kind == "link loop":
        (tmp_path / "l1").symlink_to(tmp_path / "l2")
        (tmp_path / "l2").symlink_to(tmp_path / "l1")
        a, b = str(tmp_path / "l1" / "x"), str(tmp_path / "l2" / "x")
    else:
        a, b = "~nosuchuser_specrag/x", "~nosuchuser_specrag/y"
    code = main(["config", "--index-dir", a, "--set", f"index_dir={b}", "--json"])
    line = one_line_error(capsys, code)
    assert "unexpected" not in line and "RuntimeError" not in line


def test_an_unquoted_question_is_told_to_be_quoted(capsys):
    """`specrag ask Who was the Norse leader?` said only "unrecognized arguments: was the
    Norse leader?" (a review, 2026-12-07): the line now shows the quoted command."""
    line = one_line_error(capsys, main(["ask", "Who", "was", "Rollo?", "--json"]))
    assert 'quote the question: specrag ask "Who was Rollo?"' in line
    line = one_line_error(capsys, main(["ask", "q", "--bogus"]))
    assert "quote" not in line and "see `specrag ask --help`" in line


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://h:8000/chroma", "a path"),
        ("http://user:pw@h:8000", "a user name or password"),
        ("https://h/x?tenant=t", "a path and a query"),
        ("http://h:8000/#top", "a fragment"),
    ],
)
def test_an_index_url_with_more_than_host_and_port_is_refused(url, said):
    """A review (2026-12-07): `parse_url` dropped a path, a query or credentials and talked
    to the server's root without them (a proxy path, basic auth: a misleading "cannot reach",
    or the wrong endpoint)."""
    from specrag.errors import IndexError_
    from specrag.indexing.store import parse_url

    with pytest.raises(IndexError_, match="bad --index-url") as got:
        parse_url(url)
    assert f"({said} cannot be used)" in str(got.value)
    assert parse_url("http://h:8000/") == ("h", 8000, False)
    assert parse_url("https://h") == ("h", 443, True)
    assert parse_url("http://h") == ("h", 8000, False)  # Chroma's own port


def test_a_document_larger_as_utf8_than_on_disk_is_refused_before_any_model_loads(
    capsys, monkeypatch, tmp_path
):
    """A review (2026-12-07): the CLI bounded a --document file's bytes, the graph its text's
    UTF-8 size; UTF-16 Chinese text (1.5x as UTF-8) passed the first, loaded the models and
    failed in prepare - and on a --thread left a run `--resume` offered and failed again."""
    import importlib

    services = importlib.import_module("specrag.graph.services")
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPECRAG_MAX_FILE_MIB", "0.01")  # 10,485 bytes
    doc = tmp_path / "cjk16.txt"
    doc.write_bytes(("首都是巴黎。" * 690).encode("utf-16"))  # 8,282 bytes; 12,420 as UTF-8
    assert doc.stat().st_size < 0.01 * 2**20

    def no_load(*a, **k):
        raise AssertionError("a model loaded before the document was refused")

    monkeypatch.setattr(services, "default_chat_model", no_load)
    monkeypatch.setattr(services, "load_embeddings", no_load)
    argv = ["ask", "首都是哪里?", "--document", str(doc), "--thread", "big"]
    line = one_line_error(capsys, main(argv))
    assert "the document is too large: 0.0118 MiB, past the 0.01 MiB limit" in line
    assert one_line_error(capsys, main(["ask", "--thread", "big", "--resume"]))


def test_specrag_debug_with_json_prints_the_document_then_the_traceback(capsys, monkeypatch):
    """A review (2026-12-07): under SPECRAG_DEBUG=1 an unexpected error re-raised before the
    JSON document: `--json` left stdout empty."""
    import json

    from specrag import cli

    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setenv("SPECRAG_DEBUG", "1")
    monkeypatch.setattr(cli, "cmd_config", broken)
    with pytest.raises(RuntimeError, match="boom"):
        main(["config", "--json"])
    assert json.loads(capsys.readouterr().out) == {"error": "RuntimeError: boom", "exit_code": 1}


def test_a_passage_repeated_on_two_pdf_pages_is_cited_with_the_page_of_its_own_chunk(
    capsys, monkeypatch, tmp_path
):
    """A review (2026-12-07): `ask --document report.pdf` cited a notice repeated on pages 1
    and 3 as page 1 both times (its text's first copy); the chunk's start tells them apart."""
    import json

    import numpy as np

    import specrag.cli
    import specrag.indexing.documents as documents
    from specrag.indexing.document_search import search_document
    from specrag.indexing.documents import join_pages

    notice = "Notice: " + " ".join(f"term{i}" for i in range(100)) + "."
    body = lambda p: " ".join(f"p{p}w{i}" for i in range(150)) + "."  # noqa: E731
    pages = [
        f"{body(1)}\n\n{notice}\n\n{body(11)}",
        body(2),
        f"{body(3)}\n\n{notice}\n\n{body(33)}",
    ]
    text, _ = join_pages(pages)

    class Words:  # a bag-of-words embedding: the notice's two copies score alike
        def vector(self, t):
            v = np.zeros(64)
            for w in t.lower().split():
                v[sum(map(ord, w.strip(".,"))) % 64] += 1
            return v.tolist()

        def embed_documents(self, texts):
            return [self.vector(t) for t in texts]

        def embed_query(self, t):
            return self.vector(t)

    found = search_document(
        text,
        "term5 notice",
        embeddings=Words(),
        token_length=lambda t: len(t.split()),
        token_budget=10_000,  # every chunk
    )
    copies = [c.as_dict() for c in found if c.text.startswith("Notice")]
    assert len(copies) == 2 and copies[0]["text"] == copies[1]["text"]
    later = copies[1]  # the copy on page 3

    async def run_graph(*a, **k):
        return {"chunks": [later], "citations": [{"n": 1, "id": later["id"]}]}

    monkeypatch.setattr(documents, "read_pdf_pages", lambda path: pages)
    (tmp_path / "report.pdf").write_bytes(b"%PDF-1.4 stand-in")
    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: None)
    monkeypatch.setattr(specrag.cli, "run_graph", run_graph)
    monkeypatch.setattr(
        specrag.cli, "result_json", lambda result: json.loads(json.dumps(DOCUMENT_VIEW))
    )
    monkeypatch.chdir(tmp_path)
    assert main(["ask", "Notice?", "--document", "report.pdf", "--json"]) == 0
    (source,) = json.loads(capsys.readouterr().out)["sources"]
    assert source["source"] == "report.pdf#page=3" and source["page"] == 3


def test_a_chunk_s_start_is_its_own_copy_not_one_inside_the_chunk_before():
    """A review (2026-12-07): page 3 holding only a notice that page 2 quotes got the start of
    page 2's copy (inside the chunk before), so its page read 2."""
    from specrag.indexing.documents import join_pages, make_splitter, page_of, split_document

    notice = "Notice: this report is confidential."
    words = lambda p, n: " ".join(f"{p}{i}" for i in range(n))  # noqa: E731
    pages = [words("a", 150) + ".", f"{words('b', 40)} {notice} {words('c', 80)}.", notice]
    text, starts = join_pages(pages)
    chunks = split_document("document", text, make_splitter(lambda t: len(t.split()), 128, 16))
    assert chunks[-1].text == notice
    assert [page_of(text, starts, c.text, c.start) for c in chunks] == [1, 1, 2, 3]
    assert all(text.startswith(c.text, c.start) for c in chunks)
    # ... and a chunk left as the overlap alone (its heading carried to the next one) ends
    # where the chunk before ends: its copy there, not page 3's (a second review)
    see = "See the table below."
    pages = [f"{words('a', 123)}.\n\n{see}", f"# Fees\n\n{words('b', 123)}.", see]
    text, starts = join_pages(pages)
    chunks = split_document("document", text, make_splitter(lambda t: len(t.split()), 128, 16))
    assert [c.text[:6] for c in chunks] == ["a0 a1 ", "See th", "# Fees", "See th"]
    assert [page_of(text, starts, c.text, c.start) for c in chunks] == [1, 1, 2, 3]
    assert all(text.startswith(c.text, c.start) for c in chunks)
