"""Chroma as a server (issue 11 item 4): a real `chroma run` on a free localhost port; one
process indexes, another asks and sees the same index; a bad URL or a server that is down is a
one-line error."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specrag.cli import main
from tests.servers import free_port, running

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def chroma_url(tmp_path_factory):
    data = tmp_path_factory.mktemp("chroma-server")
    exe = shutil.which("chroma", path=str(Path(sys.executable).parent)) or "chroma"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [exe, "run", "--path", str(data / "db"), "--host", "127.0.0.1", "--port", str(port)]
    with running(cmd, f"{url}/api/v2/heartbeat", data / "server.log", timeout_s=60, poll_s=0.5):
        yield url


def test_index_in_one_process_ask_from_another(chroma_url, tmp_path, monkeypatch, capsys, smol):
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))  # no local index at all
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "normans.md").write_text(
        "The Normans were descended from Norse raiders. Their leader Rollo swore fealty to "
        "King Charles III of West Francia in 911.",
        encoding="utf-8",
    )
    assert main(["index", str(docs), "--index-url", chroma_url, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["index_dir"] == chroma_url and summary["chunks"] >= 1
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specrag.cli",
            "ask",
            "Who was the leader of the Normans?",
            "--index-url",
            chroma_url,
            "--json",
            "--set",
            "refine_temperature=0",
            "--set",
            "answer_max_tokens=24",
            "--set",  # a search over HTTP on a loaded machine: no fallback (verified below)
            "retrieval_timeout_s=600",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "SPECRAG_DATA_DIR": str(tmp_path / "other-data")},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    view = json.loads(proc.stdout)
    assert view["verified"] is True
    assert [s["source"] for s in view["sources"]] == [str((docs / "normans.md").resolve())]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not-a-url", "bad --index-url"),
        ("http://127.0.0.1:abc", "bad --index-url"),  # was "ValueError: Port could not be cast"
        ("http://127.0.0.1:70000", "bad --index-url"),
        ("http://127.0.0.1:9", "cannot reach the Chroma server"),  # nothing listens there
    ],
)
def test_bad_index_url_is_one_line(url, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    assert main(["ask", "Who?", "--index-url", url]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("specrag: error:") and message in err and "\n" not in err
