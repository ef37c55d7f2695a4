"""A >= 6K-token document through `specrag ask --document` on CPU takes the RAPID route.

Issue 9 #7: chunking and embedding a long document used to happen inside the retrieval budget,
so on CPU a long file could time out in retrieval and take the fallback route. Now ``prepare``
indexes the document (``document_index_s``) and the retrieval budget covers the search only:
a 1 s budget is enough.
"""

import json
import os
import subprocess
import sys
import uuid

import pytest

from specrag.cli import main
from specrag.data.datasets import squad_paragraphs

pytestmark = pytest.mark.integration


def test_long_document_takes_rapid_route_within_a_short_retrieval_budget(
    smol, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    paragraphs = [p.text for p in squad_paragraphs() if p.title == "Normans"]
    text, n = "", 0
    count = lambda t: len(smol.tokenizer(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    while count(text) < 6200:
        text += paragraphs[n % len(paragraphs)] + "\n\n"
        n += 1
    document = tmp_path / "normans.txt"
    # a new document each run: the first call below must miss the on-disk prefix cache
    document.write_text(f"Document {uuid.uuid4()}.\n\n{text}", encoding="utf-8")
    args = [
        "ask",
        "Who was the Norse leader?",
        "--document",
        str(document),
        "--json",
        "--set",
        "retrieval_timeout_s=1.0",
        "--set",  # no draft beside the search: the query's embedding never queues behind it
        "draft_policy=off",
        "--set",
        "answer_max_tokens=12",
        "--set",
        "refine_temperature=0",
        "--set",
        "answer_timeout_s=400",  # a 6K-token prefill on a busy 2-core CI machine
    ]
    code = main(args)
    out = capsys.readouterr().out
    assert code == 0
    view = json.loads(out)
    assert view["route"] == "rapid_generate", view["reason"]
    assert "long document" in view["reason"] and view["answer"]
    # the document's chunks are cited by its file (the graph itself only knows "document")
    assert view["sources"] and {s["source"] for s in view["sources"]} == {str(document)}
    t = view["timings"]
    assert t["document_index_s"] > 0 and t["retrieve_s"] < 1.0
    first = view["stats"]["rapid_generate"]
    assert first["target_prompt_tokens"] >= 6000
    assert first["prefix_cache_hit"] is False

    # Issue 10 item 4: the same question in a NEW process skips the document prefill (the
    # prefix KV cache persists on disk; before, every CLI call paid it again).
    from specrag.decoding.prefix_cache import DEFAULT_PREFIX_CACHE

    DEFAULT_PREFIX_CACHE.flush()
    proc = subprocess.run(
        [sys.executable, "-m", "specrag.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "SPECRAG_DATA_DIR": str(tmp_path / "data")},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = json.loads(proc.stdout)
    second = again["stats"]["rapid_generate"]
    print(f"document prefix: first {first['prefix_s']}s, new process {second['prefix_s']}s")
    assert second["prefix_cache_hit"] is True
    assert second["prefix_s"] < first["prefix_s"] / 5
    assert again["answer"] == view["answer"]  # greedy: the same answer
    # a new process loads its models before the run; load_s says so (it read ~0.001 s, the
    # graph's own check after the CLI had loaded them)
    assert again["timings"]["load_s"] > 0.05  # a warm page cache loads both in well under 1 s
