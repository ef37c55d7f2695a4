"""BM25 and hybrid retrieval, kept in step with the Chroma index through re-index and pruning."""

import os

from specrag.indexing import lexical
from specrag.indexing.lexical import LexicalIndex, rrf
from specrag.indexing.pipeline import index_records, open_for_writing


def sources(hits):
    return {c.source for c in hits}


def test_rrf_rewards_agreement():
    fused = [item for item, _ in rrf([["a", "b", "c"], ["c", "a", "d"]])]
    assert fused[0] == "a" and fused[1] == "c" and set(fused) == {"a", "b", "c", "d"}
    # second in both beats first in one (a fusion that kept each item's best rank would not)
    assert rrf([["a", "b"], ["c", "b"]])[0][0] == "b"


def test_bm25_follows_reindex_and_pruning(tmp_path):
    directory = tmp_path / "index"
    docs = {
        "a.md": "The zebrafish genome was sequenced in Hinxton.",
        "b.md": "Rollo led the Norse settlers of Normandy.",
    }
    index_records(list(docs.items()), directory)
    index = open_for_writing(directory, "specrag", "embedded")
    assert sources(index.search("zebrafish Hinxton", 1, "bm25")) == {"a.md"}
    assert sources(index.search("Rollo Normandy", 1, "hybrid")) == {"b.md"}
    assert (directory / "bm25-specrag" / "ids.json").is_file()  # persisted beside Chroma

    # a.md changes its text: the old words are gone from BM25 too
    index_records(
        [("a.md", "Lighthouses guide ships at night."), ("b.md", docs["b.md"])], directory
    )
    fresh = open_for_writing(directory, "specrag", "embedded")  # as a new process would
    assert "a.md" not in sources(fresh.search("zebrafish Hinxton", 2, "bm25"))
    assert sources(fresh.search("lighthouses ships", 1, "bm25")) == {"a.md"}

    # b.md is removed (pruned): neither BM25 nor hybrid can return it
    fresh.remove_source("b.md")
    assert "b.md" not in sources(fresh.search("Rollo Normandy", 3, "bm25"))
    assert "b.md" not in sources(fresh.search("Rollo Normandy", 3, "hybrid"))


def test_a_saved_bm25_index_of_another_tokenizer_does_not_match(monkeypatch, tmp_path):
    ids = ["c1", "c2"]
    built = LexicalIndex.build(ids, ["Rollo led the Norse.", "Zebrafish in Hinxton."])
    built.save(tmp_path / "bm25")
    assert LexicalIndex.load(tmp_path / "bm25").key == lexical.fingerprint(ids)
    monkeypatch.setattr(lexical, "tokenizer_id", lambda: "bm25s 9.9|stopwords=en")
    assert LexicalIndex.load(tmp_path / "bm25").key != lexical.fingerprint(ids)  # rebuilt


def test_two_writers_saving_at_once_leave_one_whole_index(monkeypatch, tmp_path):
    """Another process saves its index between this one's two moves: this save keeps that
    index instead of failing, and leaves no temporary folder behind."""
    target = tmp_path / "bm25"
    mine = LexicalIndex.build(["c1"], ["Rollo led the Norse."])
    theirs = LexicalIndex.build(["c2"], ["Zebrafish in Hinxton."])
    real_replace = os.replace

    def racing_replace(src, dst):
        if str(src).startswith(str(target) + "~tmp") and "raced" not in calls:
            calls.append("raced")
            monkeypatch.setattr(lexical.os, "replace", real_replace)
            theirs.save(target)  # the other writer wins the race
        return real_replace(src, dst)

    calls: list[str] = []
    monkeypatch.setattr(lexical.os, "replace", racing_replace)
    mine.save(target)
    assert calls == ["raced"]
    assert LexicalIndex.load(target).ids == ["c2"]  # whole: the other writer's
    assert [p.name for p in tmp_path.iterdir()] == ["bm25"]


def test_hybrid_scores_are_cosine_like_dense(tmp_path):
    directory = tmp_path / "index"
    index_records([("n.md", "Rollo led the Norse settlers of Normandy.")], directory)
    index = open_for_writing(directory, "specrag", "embedded")
    (dense,) = index.search("Who led the Norse?", 1, "dense")
    (hybrid,) = index.search("Who led the Norse?", 1, "hybrid")
    assert abs(dense.score - hybrid.score) < 1e-4  # thresholds mean the same in every mode


def test_search_batches_best_dense_hit_first_then_the_fused_ranking(tmp_path):
    """Batch 1 is the best dense hit; a hybrid batch 2 carries the fused top k (re-ranked).

    The evidence after the last batch is exactly what ``search`` returns, in every mode.
    """
    directory = tmp_path / "index"
    docs = [
        ("war.md", "The Norse leader of the expedition met the chief Tanaghrisson."),
        ("rollo.md", "Rollo was the Norse leader who founded Normandy in 911."),
        ("rollo2.md", "Rollo, leader of the Norse raiders, swore fealty to Charles III."),
        ("fish.md", "The zebrafish genome was sequenced in Hinxton."),
    ]
    index_records(docs, directory)
    index = open_for_writing(directory, "specrag", "embedded")
    question = "Who was the Norse leader Rollo?"
    for mode in ("dense", "bm25", "hybrid"):
        batches = list(index.search_batches(question, 3, mode))
        assert len(batches) == 2 and len(batches[0].chunks) == 1, mode
        evidence = []
        for batch in batches:
            evidence = batch.after(evidence)
        assert [c.id for c in evidence] == [c.id for c in index.search(question, 3, mode)]
        assert len(evidence) == 3
    first, second = index.search_batches(question, 3, "hybrid")
    assert first.source == "dense" and second.source == "hybrid"
    assert first.chunks[0].id == index.search(question, 1, "dense")[0].id
    assert second.ranked is not None and first.chunks[0].id not in {c.id for c in second.chunks}


def test_a_kept_chunk_takes_its_new_position_when_text_is_inserted_above_it(tmp_path):
    """Chunk ids hash the text, so a chunk below an insertion is kept as it was - it used to
    keep its old position too (a source's third chunk reported as its first)."""
    directory = tmp_path / "index"
    paragraphs = [" ".join(f"word{i}x{n}" for n in range(150)) for i in range(3)]
    index_records([("a.md", "\n\n".join(paragraphs))], directory)
    before = set(open_for_writing(directory, "specrag", "embedded")._collection.get()["ids"])
    text = "\n\n".join([" ".join(f"new{n}" for n in range(150)), *paragraphs])
    index_records([("a.md", text)], directory)
    got = open_for_writing(directory, "specrag", "embedded")._collection.get(
        include=["documents", "metadatas"]
    )
    assert before & set(got["ids"])  # some chunks were kept, not re-added
    ranked = sorted(
        zip(got["metadatas"], got["documents"], strict=True), key=lambda m: m[0]["position"]
    )
    assert [m["position"] for m, _ in ranked] == list(range(len(ranked)))
    starts = [text.index(doc) for _, doc in ranked]
    assert starts == sorted(starts), starts  # positions follow the new text


def test_a_killed_writers_temporary_copies_are_removed_by_the_next_save(tmp_path):
    """SIGKILL between a save's two moves left ``bm25~tmp<pid>.<tid>`` / ``~old...`` copies
    beside the index for good; a running process's copies are left alone, as is another
    collection's index whose name looks like a copy (a review, 2026-12-06: saving
    ``bm25-specrag`` deleted the index of a collection named ``specrag.tmp999999``)."""
    dead = 2**22 + 12345  # above Linux's default pid_max: no such process
    alive = f"bm25~tmp{os.getppid()}.1"
    for name in (f"bm25~tmp{dead}.1", f"bm25~old{dead}.1", alive, f"bm25.tmp{dead}", "bm25.old"):
        (tmp_path / name).mkdir()
    for name in (f"bm25.tmp{dead}.2", f"bm25.old{dead}.2"):  # earlier versions' copies
        (tmp_path / name).mkdir()
        (tmp_path / name / "ids.json").write_text("{}")
    (tmp_path / f"bm25.tmp{dead}" / "ids.json").write_text("{}")  # collection "….tmp<digits>"
    LexicalIndex.build(["c1"], ["Rollo led the Norse."]).save(tmp_path / "bm25")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["bm25", alive, f"bm25.tmp{dead}", "bm25.old"]
    )


def test_an_open_index_sees_what_another_process_indexed(tmp_path):
    """A long-lived process (Studio, an agent) kept its index open while `specrag index` ran in
    another: dense search missed the new chunks (Chroma reads its vector index once per
    process and path) and hybrid search failed on them ("Error finding id": its BM25 side
    reads the database, which has them)."""
    import subprocess
    import sys

    directory = tmp_path / "index"
    index_records([("a.md", "The zebrafish genome was sequenced in Hinxton.")], directory)
    index = open_for_writing(directory, "specrag", "embedded")
    assert sources(index.search("Rollo Normandy", 1, "dense")) == {"a.md"}  # all it holds
    writer = (
        "import sys; from pathlib import Path; "
        "from specrag.indexing.pipeline import index_records; "
        "index_records([('a.md', 'The zebrafish genome was sequenced in Hinxton.'), "
        "('b.md', 'Rollo led the Norse settlers of Normandy.')], Path(sys.argv[1]))"
    )
    subprocess.run([sys.executable, "-c", writer, str(directory)], check=True, timeout=300)
    assert sources(index.search("Rollo Normandy", 1, "dense")) == {"b.md"}
    assert sources(index.search("Rollo led the Norse settlers", 1, "hybrid")) == {"b.md"}
    assert sources(index.search("Rollo Normandy", 1, "bm25")) == {"b.md"}


def test_an_index_of_stop_words_only_finds_nothing_lexically(tmp_path):
    """A chunk of stop words and punctuation only: bm25s refused to index it (`index` failed
    with "ValueError: max() arg is an empty sequence" after writing the chunk, and hybrid and
    bm25 search failed with it from then on)."""
    built = LexicalIndex.build(["c1"], ["To be, or not to be."])
    assert built.search("to be", 3) == []
    built.save(tmp_path / "bm25")
    loaded = LexicalIndex.load(tmp_path / "bm25")
    assert loaded is not None and loaded.search("be", 3) == [] and loaded.key == built.key
    directory = tmp_path / "index"
    index_records([("s.txt", "To be, or not to be.")], directory)
    index = open_for_writing(directory, "specrag", "embedded")
    assert sources(index.search("to be", 1, "hybrid")) == {"s.txt"}  # the dense side
    assert index.search("to be", 1, "bm25") == []


def test_preload_reads_the_bm25_side_before_the_first_search(monkeypatch, tmp_path):
    """``preload`` opened the index but left BM25 to the first search, inside its retrieval
    budget (0.47 s for the demo's 1,204 paragraphs here); and the demo, which has a document
    scenario, opened no index at all before its first question (a review, 2026-12-06)."""
    import importlib

    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import open_index
    from specrag.runner import preload

    directory = tmp_path / "index"
    index_records([("b.md", "Rollo led the Norse settlers of Normandy.")], directory)
    module = importlib.import_module("specrag.graph.services")
    monkeypatch.setattr(module, "default_chat_model", lambda spec, c: spec)
    monkeypatch.setattr(module.Services, "warm", lambda self, model: None)
    dense = SpecRagContext(index_dir=str(directory), retrieval="dense", collection="specrag")
    preload(dense, "a document")  # a document run: no index
    assert module._INDEXES.get((str(directory), "specrag", "embedded")) is None
    preload(dense, "a document", index=True)  # the demo: a document and index questions
    assert open_index(dense)._lexical is None  # dense retrieval reads no BM25
    preload(SpecRagContext(index_dir=str(directory), retrieval="hybrid"))
    assert open_index(dense)._lexical is not None
    # one that cannot be read here is left to the search (its retry, its route), not an error
    from specrag.indexing.store import VectorIndex

    def broken(self):
        raise OSError("bm25 folder unreadable")

    monkeypatch.setattr(VectorIndex, "refresh_lexical", broken)
    preload(SpecRagContext(index_dir=str(directory), retrieval="bm25"))

    # the process's RAPID prefix cache takes the preloaded context's budgets (a run's own
    # settings bound only what that run reads and keeps there)
    from specrag.decoding import prefix_cache

    cache = prefix_cache.PrefixCache()
    monkeypatch.setattr(prefix_cache, "DEFAULT_PREFIX_CACHE", cache)
    sized = SpecRagContext(index_dir=str(directory), prefix_cache_mib=1, prefix_cache_disk_mib=2)
    preload(sized, "a document", quiet=True)
    assert (cache.max_bytes, cache.disk_max_bytes) == (2**20, 2 * 2**20)


def test_a_search_lists_the_collections_ids_only_after_a_write(tmp_path):
    """Every hybrid or BM25 search listed and hashed all of the collection's ids under the
    lexical lock (31 ms a search at 20,000 chunks; concurrent searches queued on it): the
    database's write stamp now tells whether anything changed."""
    directory = tmp_path / "index"
    index_records([("a.md", "The zebrafish genome was sequenced in Hinxton.")], directory)
    index = open_for_writing(directory, "specrag", "embedded")
    listed = []
    real_get = index._collection.get

    def get(*a, **k):
        if k.get("include") == []:
            listed.append(1)
        return real_get(*a, **k)

    index._collection.get = get
    old = os.stat(directory / "chroma.sqlite3").st_mtime - 10  # written 10 s ago: a stamp
    os.utime(directory / "chroma.sqlite3", (old, old))  # younger than 2 s is not trusted
    index._seen = index._written()  # (not a write by another process to reopen for)
    index.search("zebrafish", 1, "bm25")
    index.search("Hinxton genome", 1, "hybrid")
    assert len(listed) <= 1  # the first search may list them, not the next
    from specrag.indexing.documents import Chunk

    index.upsert_source("b.md", [Chunk("b1", "b.md", "Rollo led the Norse settlers.", 0)])
    assert sources(index.search("Rollo Norse settlers", 1, "bm25")) == {"b.md"}  # listed again


def bm25_of(**texts: str) -> LexicalIndex:
    """A BM25 index of ``texts``, each under its keyword's name as its chunk id."""
    return LexicalIndex.build(list(texts), list(texts.values()))


def test_a_one_character_term_is_searched_too():
    """bm25s' default pattern keeps words of 2+ characters: "What does clause 7 require?"
    scored clauses 7 and 8 alike (README's own example), "appendix B" found no B."""
    built = bm25_of(
        c7="Clause 7: the tenant must give notice two months ahead.",
        c8="Clause 8: the tenant must pay the rent on the first day.",
        a="Appendix A lists the fees.",
        b="Appendix B lists the deposits.",
    )
    c7 = built.search("What does clause 7 require?", 2)
    assert c7[0][0] == "c7" and c7[0][1] > c7[1][1], c7
    assert built.search("What is in appendix B?", 1)[0][0] == "b"
    # "a" is a stop word of bm25s' (lowercased): "appendix A" was "appendix", and the
    # shorter appendix B ranked first (a review, 2026-12-07); the letter is a word of its own,
    # the article still none (kept as a word, it ranked a chunk full of "a" first)
    fees = bm25_of(
        a="Appendix A lists the fees, charges and deposits of the account.",
        b="Appendix B lists a schedule of payments.",
    )
    assert fees.search("What is in appendix A?", 1)[0][0] == "a"
    notes = bm25_of(
        lien="Lien: the creditor's legal claim on the property until the debt is paid.",
        mortgage="A mortgage is a loan. A bank gives a loan for a house, and a buyer pays it back.",
    )
    assert [i for i, _ in notes.search("What is a lien?", 2)] == ["lien"]
    # capitals around an "A" say it is the article: "WHAT IS A LIEN?" ranked Appendix A first
    liens = bm25_of(
        claim="A lien is a legal claim on property that secures a debt.",
        tax="A tax lien is filed by the government for unpaid taxes.",
        release="To release a lien, the owner pays the debt in full.",
        forms="Appendix A: the forms to file with the county clerk.",
    )
    for asked in ("WHAT IS A LIEN?", "What Is A Lien?"):
        assert "forms" not in [i for i, _ in liens.search(asked, 4)], asked
    assert liens.search("Which forms are in appendix A?", 1)[0][0] == "forms"


def test_an_open_index_deleted_or_rebuilt_with_another_model_is_refused_not_remade(tmp_path):
    """A review (2026-12-07): a long-lived reader reopened a changed index with Chroma's
    get-or-create and no model check: an index deleted meanwhile was made again, empty (its
    searches found nothing, and `ask` then said "empty" instead of "no index"); one rebuilt
    with another embedding model was searched with this one's query vectors."""
    import shutil
    import subprocess
    import sys

    import pytest

    from specrag.errors import IndexError_
    from specrag.indexing.store import local_index_at

    directory = tmp_path / "index"
    index_records([("a.md", "The zebrafish genome was sequenced in Hinxton.")], directory)
    index = open_for_writing(directory, "specrag", "embedded")
    assert sources(index.search("zebrafish", 1, "dense")) == {"a.md"}
    shutil.rmtree(directory)
    with pytest.raises(IndexError_, match="no index at .*deleted while open"):
        list(index.search("zebrafish", 1, "dense"))
    assert not local_index_at(directory)  # not made again
    rebuild = (
        "import sys; from pathlib import Path; "
        "from specrag.indexing.store import EMBEDDING_KEY, local_client; "
        "Path(sys.argv[1]).mkdir(); "
        "c = local_client(sys.argv[1]).create_collection('specrag', metadata={"
        "'hnsw:space': 'cosine', EMBEDDING_KEY: 'someorg/other-minilm'}); "
        "c.add(ids=['b'], embeddings=[[0.1] * 384], documents=['Rollo led the Norse.'], "
        "metadatas=[{'source': 'b.md', 'chunk': 0}])"
    )
    subprocess.run([sys.executable, "-c", rebuild, str(directory)], check=True, timeout=300)
    with pytest.raises(IndexError_, match="other-minilm"):
        list(index.search("Rollo", 1, "dense"))


def test_bm25_returns_every_match_when_k_reaches_the_chunk_count():
    texts = ["Rollo led the Norse.", "Rollo took Rouen.", "Rollo died around 930."]
    index = LexicalIndex.build(["c1", "c2", "c3"], texts)
    assert {i for i, _ in index.search("Rollo", 5)} == {"c1", "c2", "c3"}
    assert len(index.search("Rollo", 3)) == 3 and len(index.search("Rollo", 2)) == 2


def test_hybrid_fuses_rankings_deeper_than_the_top_k(tmp_path, monkeypatch):
    """Both rankings are read max(10, 3k) deep before fusion: a chunk just past the dense top k
    that BM25 ranks first still gets its fused boost (README, "retrieval")."""
    from specrag.indexing.store import VectorIndex

    index_records([("a.md", "Rollo led the Norse settlers of Normandy.")], tmp_path / "index")
    index = open_for_writing(tmp_path / "index", "specrag", "embedded")
    depths: list[tuple[str, int]] = []
    dense, lexical = VectorIndex._dense, LexicalIndex.search
    monkeypatch.setattr(
        VectorIndex, "_dense", lambda self, v, k: depths.append(("dense", k)) or dense(self, v, k)
    )
    monkeypatch.setattr(
        LexicalIndex, "search", lambda self, q, k: depths.append(("bm25", k)) or lexical(self, q, k)
    )
    index.search("Rollo", 2, "hybrid")
    assert depths == [("dense", 10), ("bm25", 10)]
    depths.clear()
    index.search("Rollo", 5, "hybrid")
    assert depths == [("dense", 15), ("bm25", 15)]
