"""Bad input gives one clear line on stderr, a non-zero exit, no traceback, index untouched."""

import pytest

from specrag.cli import main


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))


def one_line_error(capsys, code, expected_code=2):
    captured = capsys.readouterr()
    assert code == expected_code
    lines = [line for line in captured.err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("specrag: error:")
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


@pytest.mark.parametrize("question", ["", "   \n\t "])
def test_empty_question(capsys, question):
    assert "empty" in one_line_error(capsys, main(["ask", question]))


def test_question_too_long(capsys):
    line = one_line_error(capsys, main(["ask", "x" * 50, "--set", "max_question_chars=10"]))
    assert "max 10" in line


def test_no_index_yet(capsys, tmp_path):
    line = one_line_error(capsys, main(["ask", "Who?", "--index-dir", str(tmp_path / "none")]))
    assert "no index" in line and "specrag index" in line
    assert not (tmp_path / "none").exists()  # nothing created


def test_unknown_config_key(capsys):
    assert "unknown config key 'nope'" in one_line_error(
        capsys, main(["ask", "q", "--set", "nope=1"])
    )


def test_bad_config_value(capsys):
    assert "expected a number" in one_line_error(capsys, main(["ask", "q", "--set", "top_k=many"]))


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


def test_missing_document(capsys, tmp_path):
    line = one_line_error(capsys, main(["ask", "q", "--document", str(tmp_path / "nope.txt")]))
    assert "file not found" in line


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
        (["ask", "hi", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "the following arguments are required: command"),
    ],
)
def test_usage_errors_are_one_line(capsys, argv, expected):
    """argparse's own errors too: one line naming the --help to read, not a usage block."""
    line = one_line_error(capsys, main(argv))
    assert expected in line and "--help`)" in line, line


def test_resume_without_an_interrupted_run(capsys):
    line = one_line_error(capsys, main(["ask", "--thread", "never-run", "--resume"]))
    assert "thread 'never-run' has no interrupted run to resume" in line


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
