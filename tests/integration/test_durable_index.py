"""SIGKILL during `specrag index`, then re-index: every chunk present exactly once."""

import os
import signal
import subprocess
import sys
import time

import pytest

from specrag.indexing.documents import make_splitter, split_document
from specrag.indexing.pipeline import CHUNK_TOKENS, OVERLAP_TOKENS, embedding_token_length
from specrag.indexing.store import VectorIndex
from specrag.models.loading import load_embeddings

pytestmark = pytest.mark.integration

WORDS = (
    "harbor lamp keeper river bread oven bridge tower market garden engine signal "
    "winter summer copper silver valley island north south"
).split()


def make_corpus(folder, n_files=120):
    folder.mkdir()
    for i in range(n_files):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(260)]
        text = f"Document {i}. " + " ".join(words) + f". The code of this document is {i * 31}."
        (folder / f"doc{i:03d}.txt").write_text(text)


def expected_ids(folder):
    splitter = make_splitter(embedding_token_length(), CHUNK_TOKENS, OVERLAP_TOKENS)
    ids = {}
    for path in sorted(folder.iterdir()):
        source = str(path.resolve())
        ids[source] = {c.id for c in split_document(source, path.read_text(), splitter)}
    return ids


def stored(directory):
    index = VectorIndex(directory, load_embeddings())
    got = index._collection.get(include=["metadatas"])
    return got["ids"], [m["source"] for m in got["metadatas"]]


def cli(*args):
    return [sys.executable, "-m", "specrag.cli", *args]


def test_killed_indexing_then_rerun_is_consistent(tmp_path):
    corpus = tmp_path / "corpus"
    make_corpus(corpus)
    directory = tmp_path / "index"
    env = {**os.environ, "SPECRAG_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.Popen(
        cli("index", str(corpus), "--index-dir", str(directory)),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sqlite = directory / "chroma.sqlite3"
    deadline = time.time() + 120
    while time.time() < deadline and not (sqlite.exists() and sqlite.stat().st_size > 300_000):
        assert proc.poll() is None, f"the indexer ended ({proc.returncode}) before it was killed"
        time.sleep(0.2)
    time.sleep(0.5)
    assert proc.poll() is None, "the indexer finished before it was killed (a faster machine?)"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    ids_partial, _ = stored(directory)
    want = expected_ids(corpus)
    total = sum(len(v) for v in want.values())
    assert 0 < len(ids_partial) < total, "kill happened mid-run"

    done = subprocess.run(
        cli("index", str(corpus), "--index-dir", str(directory), "--json"),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    ids, sources = stored(directory)
    assert len(ids) == len(set(ids)) == total  # every chunk exactly once, nothing orphaned
    assert set(ids) == set().union(*want.values())
    assert set(sources) == set(want)

    # change one file, delete another: re-indexing updates exactly their chunks
    changed, deleted = corpus / "doc001.txt", corpus / "doc002.txt"
    changed.write_text("A completely new text about lighthouses and harbors.")
    deleted.unlink()
    again = subprocess.run(
        cli("index", str(corpus), "--index-dir", str(directory), "--json"),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr
    ids, sources = stored(directory)
    want = expected_ids(corpus)
    assert set(ids) == set().union(*want.values()) and len(ids) == len(set(ids))
    assert str(deleted.resolve()) not in sources
