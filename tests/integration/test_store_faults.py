"""Faults of the real vector store and embedding model: a clear route or a clear error."""

import sqlite3
import time

import pytest

from specrag import SpecRagContext, build_graph
from specrag.cli import main
from specrag.indexing.pipeline import index_records

pytestmark = pytest.mark.integration


@pytest.fixture
def index_dir(tmp_path):
    directory = tmp_path / "index"
    index_records([("a", "Paris is the capital of France."), ("b", "Rome is in Italy.")], directory)
    return directory


def run(ctx, question="What is the capital of France?"):
    import asyncio

    return asyncio.run(build_graph().ainvoke({"question": question}, context=ctx))


def test_missing_store_directory_falls_back(tmp_path):
    result = run(SpecRagContext(index_dir=str(tmp_path / "gone"), draft_policy="off"))
    assert result["route"] == "fallback" and "retrieval failed" in result["reason"]
    assert any("no index at" in e for e in result["errors"])


def test_corrupt_store_falls_back_and_cli_says_so(tmp_path, capsys):
    directory = tmp_path / "corrupt"
    directory.mkdir()
    (directory / "chroma.sqlite3").write_bytes(b"this is not a database" * 100)
    result = run(SpecRagContext(index_dir=str(directory), draft_policy="off"))
    assert result["route"] == "fallback"
    assert any("cannot open index" in e for e in result["errors"])
    code = main(["ask", "q", "--index-dir", str(directory), "--set", "draft_policy=off"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot open index" in err and "Traceback" not in err


def test_locked_store_ends_within_the_retrieval_budget(index_dir):
    """Another process holding the database: the search answers (it may not read the file:
    the store caches what it searched) or falls back, within its budget either way (only a
    hang failed this test before the retrieve_s check)."""
    conn = sqlite3.connect(index_dir / "chroma.sqlite3", timeout=0.1, check_same_thread=False)
    conn.execute("BEGIN EXCLUSIVE")  # another process holding the database
    try:
        start = time.perf_counter()
        result = run(
            SpecRagContext(
                index_dir=str(index_dir),
                collection="specrag",
                draft_policy="off",
                retrieval_timeout_s=1.0,
            )
        )
        elapsed = time.perf_counter() - start
    finally:
        conn.rollback()
        conn.close()
    assert result["route"] in ("fallback", "generate")
    if result["route"] == "fallback":
        assert "retrieval" in result["reason"]
    assert elapsed < 60
    # the search ended at its 1 s budget (a blocked read waits out a lock), not the lock's
    assert result["timings"]["retrieve_s"] < 3.0, (result["route"], result["timings"])


def test_wrong_embedding_model_path(index_dir, capsys):
    ctx = SpecRagContext(
        index_dir=str(index_dir), embedding_model="/no/such/embedder", draft_policy="off"
    )
    result = run(ctx)
    assert result["route"] == "fallback"
    assert any("embedding model path not found" in e for e in result["errors"])
    code = main(
        [
            "ask",
            "q",
            "--index-dir",
            str(index_dir),
            "--set",
            "embedding_model=/no/such/embedder",
            "--set",
            "draft_policy=off",
        ]
    )
    assert code == 2 and "embedding model path not found" in capsys.readouterr().err
