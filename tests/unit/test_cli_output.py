"""The readable CLI output prints model and user text as it is (never as Rich markup)."""

import json

import pytest

from specrag.cli import main, print_demo_summary

# an answer that reads like Rich markup: "[/evidence]" closed no open tag (MarkupError after the
# whole run, answer lost) and "[source]" vanished as an unknown style
TRICKY = "see [source], [bold]this[/bold] and [/evidence] in notes[v2].md"


def test_demo_summary_prints_bracketed_text_verbatim(capsys):
    row = {
        "scenario": "question [1]",
        "question": "what is [/INST]?",
        "expected_route": "",
        "draft_confidence": 0.5,
        "draft": TRICKY,
        "route": "generate",
        "reason": "draft too short [x]",
        "answer": TRICKY,
        "stats": {},
        "timings": {"draft_ttft_s": 0.1, "ttft_s": 0.2, "total_s": 0.3},
    }
    print_demo_summary([row])
    out = capsys.readouterr().out
    assert out.count(TRICKY) == 2, out  # the draft and the answer, brackets and all
    assert "what is [/INST]?" in out and "draft too short [x]" in out


def test_config_lists_what_each_setting_accepts(capsys):
    """`specrag config` named values and descriptions but not what a field accepts (a
    new-user review, 2026-12-03); --json as one document, text with indented descriptions."""
    import json

    from specrag.cli import main

    assert main(["config", "--json", "--set", "top_k=5"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["top_k"]["value"] == 5 and rows["top_k"]["allowed"] == ">= 1 and <= 10000"
    assert rows["retrieval"]["allowed"] == "dense, bm25, hybrid"
    # text settings whose type takes any string name their values too (they listed none)
    assert rows["device"]["allowed"] == "auto, cpu, cuda, cuda:N, mps"
    assert "bf16" in rows["dtype"]["allowed"] and "int8" not in rows["dtype"]["allowed"]
    assert rows["drafter_dtype"]["allowed"].endswith("int8, qint8")
    assert main(["config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "top_k = 3" in lines
    described = lines[lines.index("top_k = 3") + 1 :]
    assert described[0].startswith(
        "    Chunks retrieved per question. (allowed: >= 1 and <= 10000)"
    )


def test_version(capsys):
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"specrag {version('specrag')}"


def test_version_as_json(capsys):
    """`--json` makes `--version` one JSON document too, on either side of it."""
    from importlib.metadata import version

    for argv in (["--json", "--version"], ["--version", "--json"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert json.loads(out) == {"version": version("specrag")}


def test_help_as_json(capsys):
    """`--json --help` printed argparse's text: not the one JSON document `--json` promises
    (a new-user review, 2026-12-06). The subcommand's own help, wherever --json stands."""
    for argv, usage in (
        (["--json", "--help"], "usage: specrag [-h]"),
        (["ask", "x", "--json", "--help"], "usage: specrag ask [-h]"),
        (["--json", "index", "-h"], "usage: specrag index [-h]"),
    ):
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out)["help"].startswith(usage)
    assert main(["ask", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: specrag ask [-h]")


def test_version_or_help_into_a_closed_pipe_or_a_full_disk(capsys, monkeypatch):
    """`specrag --version | true` and `--version > /dev/full` ended in a traceback (exit 1):
    the version is printed while argparse parses, before main's own handlers."""
    import specrag.cli

    def broken(*a, **k):
        raise BrokenPipeError(32, "Broken pipe")

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    dropped = []
    monkeypatch.setattr(specrag.cli, "_drop_stdout", lambda code: dropped.append(code) or code)
    cases = [(broken, ["--version"], 141), (full, ["--json", "--version"], 1)]
    cases += [(broken, ["ask", "--help"], 141), (full, ["--help"], 1)]  # argparse swallowed these
    for fail, argv, code in cases:
        with monkeypatch.context() as patch:
            patch.setattr(specrag.cli.sys.stdout, "flush", fail)
            got = main(argv)
        assert got == code
    assert dropped == [141, 1, 141, 1]
    assert capsys.readouterr().err.strip().splitlines() == 2 * [
        "specrag: error: cannot write the output: No space left on device"
    ]


@pytest.mark.parametrize("argv", [["config", "--json"], ["config"]])
def test_a_commands_output_onto_a_full_disk_is_said_so(argv):
    """`specrag config --json > /dev/full` read "OSError: ... (set SPECRAG_DEBUG=1 for
    details)", an unexpected error, where `--help` said "cannot write the output" (a review,
    2026-12-07)."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "specrag.cli", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines == ["specrag: error: cannot write the output: No space left on device"], lines


def test_an_errors_json_onto_a_full_disk_is_dropped_as_before():
    """Unbuffered, the error's JSON failed at its write, as OutputError, which the guard that
    drops it (suppress(OSError)) did not catch: a traceback (the review of this session's
    diff). The error line stays, exit 2."""
    import os
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "specrag.cli", "ask", "", "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("specrag: error: ")


def test_the_json_view_names_the_query_and_how_the_draft_ended():
    """A reason such as "draft too short (3 < 6 tokens)" could not be checked from --json:
    it left out the draft's status and token count, and what was searched."""
    import asyncio

    from specrag.graph.builder import build_graph
    from specrag.runner import result_json
    from tests.fakes import FakeLogprobChat, ctx, services

    short = FakeLogprobChat(reply="Paris maybe", calls=[])
    result = asyncio.run(
        build_graph(services(draft=short)).ainvoke({"question": "q?"}, context=ctx())
    )
    view = result_json(result)
    assert view["reason"].startswith("draft too short (2 < 6 tokens)")
    assert (view["draft_status"], view["draft_tokens"], view["query"]) == ("ok", 2, "q?")


def test_the_json_views_timings_are_the_runs_each_under_its_own_name():
    from specrag.runner import result_json

    names = (
        "load_s",
        "document_index_s",
        "retrieve_s",
        "draft_s",
        "draft_ttft_s",
        "answer_s",
        "answer_ttft_s",
        "total_s",
        "ttft_s",
    )
    timings = {name: float(n) for n, name in enumerate(names, 1)}  # each a value of its own
    assert result_json({"timings": timings})["timings"] == timings
