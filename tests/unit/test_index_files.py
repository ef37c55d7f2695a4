"""Indexing the documents users have: PDFs (page numbers in citations) and folders that hold
other files (skipped files are reported, with the reason)."""

import json
import os
import shutil

import pytest

from specrag.cli import main
from specrag.indexing.documents import read_text
from specrag.indexing.pipeline import load_files


def write_pdf(path, pages):
    """A minimal valid PDF with one line of Helvetica text per page (no PDF library needed)."""
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        None,
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream.decode()}\nendstream")
        content = len(objects)
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {content} 0 R >>"
        )
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{n} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    path.write_bytes(bytes(out))


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "notes.md").write_text("# Notes\n\nRollo led the Norse settlers of Normandy.")
    (d / "page.html").write_text("<html><body><p>Normandy is in France.</p></body></html>")
    write_pdf(d / "spec.pdf", ["The treaty was signed in 911.", "", "Rollo died around 930."])
    (d / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    (d / "empty.txt").write_text("   \n")
    (d / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    (d / "gone.txt").symlink_to(d / "nowhere.txt")  # a link to nothing: reported, not dropped
    return d


def test_pdf_pages_become_sources_with_page_numbers(folder):
    loaded = load_files([str(folder)])
    sources = [s for s, _ in loaded.records]
    pdf = str(folder / "spec.pdf")
    assert f"{pdf}#page=1" in sources and f"{pdf}#page=3" in sources
    assert f"{pdf}#page=2" not in sources  # a page without text adds nothing
    assert "treaty was signed in 911" in dict(loaded.records)[f"{pdf}#page=1"]
    assert "Rollo died around 930." in read_text(folder / "spec.pdf")  # --document reads PDFs


def test_a_folder_index_reports_what_it_skipped_and_why(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    assert main(["index", str(folder), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["files"] == 3  # notes.md, page.html, spec.pdf
    assert summary["sources"] == 4  # two PDF pages with text
    reasons = {
        p.split("/")[-1]: r for p, r in ((s["path"], s["reason"]) for s in summary["skipped"])
    }
    assert reasons["logo.png"] == "unsupported type .png"
    assert reasons["empty.txt"] == "empty (no text)"
    assert reasons["broken.pdf"].startswith("unreadable: cannot read PDF")
    assert reasons["gone.txt"] == "broken link"
    assert main(["index", str(folder)]) == 0
    line = capsys.readouterr().err
    assert (
        "indexed 3 files" in line and "skipped 4" in line and "logo.png: unsupported type" in line
    )


def test_a_named_unreadable_pdf_is_a_one_line_error(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    assert main(["index", str(folder / "broken.pdf")]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("specrag: error: cannot read PDF") and "\n" not in err


def test_a_pdf_chunk_is_cited_with_its_page():
    from specrag.nodes.answer import citations

    cited = citations(
        [{"id": "a", "source": "/d/spec.pdf#page=3", "score": 0.5}, {"source": "n.md"}]
    )
    assert cited[0]["page"] == 3 and "page" not in cited[1]


def test_ask_json_sources_carry_the_page():
    """``ask --json``'s ``sources`` name a PDF chunk's page, as the graph's citations do."""
    from specrag.nodes.answer import citations
    from specrag.runner import result_json

    cites = citations([{"source": "/d/spec.pdf#page=3", "score": 0.5}, {"source": "n.md"}])
    sources = result_json({"citations": cites})["sources"]
    assert sources[0] == {"n": 1, "source": "/d/spec.pdf#page=3", "score": 0.5, "page": 3}
    assert "page" not in sources[1]


def test_an_embedding_model_under_home_is_found_for_its_tokenizer_too(tmp_path, monkeypatch):
    """`--set embedding_model=~/models/minilm`: the embeddings expanded ~, the chunker's
    tokenizer took the path for a hub id and indexing failed."""
    from specrag.indexing.pipeline import embedding_token_length
    from specrag.models.loading import embedded_embeddings_path

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "minilm").symlink_to(embedded_embeddings_path())
    monkeypatch.setenv("HOME", str(tmp_path))
    count = embedding_token_length("~/models/minilm")
    assert count("Rollo led the Norse.") == embedding_token_length()("Rollo led the Norse.") > 0


def test_text_the_embedding_tokenizer_reads_as_unknown_is_chunked_by_its_length():
    """A 192,000-character hex line (one unknown word piece per 100 characters) or Thai text
    (one per word) counted a few tokens: a whole file became one chunk, which the answer
    model read cut in the middle. English text counts as before."""
    from transformers import AutoTokenizer

    from specrag.indexing.documents import make_splitter, split_document
    from specrag.indexing.pipeline import CHUNK_TOKENS, OVERLAP_TOKENS, embedding_token_length
    from specrag.models.loading import embedded_embeddings_path

    count = embedding_token_length()
    splitter = make_splitter(count, CHUNK_TOKENS, OVERLAP_TOKENS)
    text = "Rollo led the Norse.\n\n" + "deadbeef" * 24000 + "\n\nThe end."
    chunks = split_document("hex.txt", text, splitter)
    assert len(chunks) > 100 and max(len(c.text) for c in chunks) <= 4 * CHUNK_TOKENS
    thai = " ".join(["ภาษาไทยเป็นภาษาที่มีระดับเสียง"] * 400)
    assert max(len(c.text) for c in split_document("th.txt", thai, splitter)) <= 4 * CHUNK_TOKENS
    tok = AutoTokenizer.from_pretrained(str(embedded_embeddings_path()))
    plain = "Rollo led the Norse settlers of Normandy in the year 911, administratively. " * 9
    assert count(plain) == len(tok(plain, add_special_tokens=False)["input_ids"])


def test_re_indexing_a_named_pdf_drops_the_pages_it_no_longer_has(tmp_path, monkeypatch, capsys):
    """Each page is a source: re-indexing a PDF named on the command line after it shrank left
    the old pages' chunks in the index (retrieved and cited) until this change."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    pdf = tmp_path / "report.pdf"
    write_pdf(pdf, ["Page one text.", "Page two text.", "Page three text."])
    other = tmp_path / "other.pdf"  # another PDF indexed before is left alone
    write_pdf(other, ["Another file."])
    assert main(["index", str(pdf), str(other), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sources"] == 4
    write_pdf(pdf, ["Page one text.", "Page two, rewritten."])
    assert main(["index", str(pdf), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["files_removed"] == 1  # page 3; page 2's old chunk is replaced with its text
    assert summary["removed"] == 2  # page 2's old chunk and page 3's (it counted only page 2's)

    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import open_index

    sources = open_index(SpecRagContext()).sources()
    assert sorted(sources) == sorted([f"{pdf}#page=1", f"{pdf}#page=2", f"{other}#page=1"]), sources


def test_hidden_entries_are_reported_not_walked(tmp_path):
    """A folder's .git (and .DS_Store, .env, ...) was indexed like any file; now each hidden
    entry is one skipped line, and a hidden folder is never walked into."""
    d = tmp_path / "repo"
    (d / ".git" / "docs").mkdir(parents=True)
    (d / ".git" / "docs" / "notes.md").write_text("git internals")
    (d / "sub").mkdir()
    (d / "sub" / "a.md").write_text("Rollo led the Norse settlers.")
    (d / ".draft.md").write_text("a hidden draft")
    (d / "sub" / "up").symlink_to(d)  # a link back up: walked once, no endless loop
    loaded = load_files([str(d)])
    assert [s for s, _ in loaded.records] == [str((d / "sub" / "a.md").resolve())]
    hidden = sorted(s.path for s in loaded.skipped if s.reason.startswith("hidden"))
    assert hidden == [str(d / ".draft.md"), str(d / ".git")]
    # named on its own, a hidden file is indexed
    assert [s for s, _ in load_files([str(d / ".draft.md")]).records] == [
        str((d / ".draft.md").resolve())
    ]


def test_a_subfolder_that_cannot_be_listed_is_reported(tmp_path, monkeypatch):
    """os.walk skipped an unreadable subfolder silently (tests run as root: chmod would not
    stop them, so listing it raises here)."""
    import os

    d = tmp_path / "docs"
    (d / "locked").mkdir(parents=True)
    (d / "locked" / "secret.md").write_text("never read")
    (d / "a.md").write_text("Rollo led the Norse settlers.")
    listing = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", scandir)
    loaded = load_files([str(d)])
    assert [s for s, _ in loaded.records] == [str((d / "a.md").resolve())]
    (locked,) = [s for s in loaded.skipped if s.reason.startswith("unreadable folder")]
    assert locked.path == str(d / "locked") and "Permission denied" in locked.reason


def test_text_that_is_not_utf8_is_read_with_a_warning(tmp_path, caplog):
    """A Latin-1 / Windows-1252 file was refused ("not UTF-8 text")."""
    latin = tmp_path / "latin.txt"
    latin.write_bytes("Caf\u00e9 cr\u00e8me \u2013 na\u00efve".encode("cp1252") + b" \x81")
    with caplog.at_level("WARNING"):
        assert read_text(latin) == "Caf\u00e9 cr\u00e8me \u2013 na\u00efve \x81"
    assert "not UTF-8: read as Windows-1252" in caplog.text
    wide = tmp_path / "wide.txt"
    wide.write_bytes("Caf\u00e9 \u2013 ok".encode("utf-16"))  # with its BOM (NUL bytes)
    assert read_text(wide) == "Caf\u00e9 \u2013 ok"
    plain = tmp_path / "plain.md"
    plain.write_bytes("\ufeffCaf\u00e9".encode())
    caplog.clear()
    assert read_text(plain) == "Caf\u00e9" and not caplog.text  # UTF-8: no warning


def test_a_file_name_that_is_not_utf8_is_indexed_and_its_json_is_valid(
    tmp_path, monkeypatch, capsys
):
    """A Latin-1 file name (`caf\\xe9.txt`) stopped `index` part-way (UnicodeEncodeError in
    the chunk ids), and `--json` wrote its name as a raw byte no JSON reader accepts."""
    import os

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d = tmp_path / "docs"
    d.mkdir()
    with open(os.path.join(os.fsencode(d), b"caf\xe9.txt"), "wb") as fh:
        fh.write(b"The cafe opened in 1911.")
    (d / "a.md").write_text("Rollo led the Norse settlers.")
    assert main(["index", str(d), "--json"]) == 0
    raw = capsys.readouterr().out
    assert raw.isascii()
    summary = json.loads(raw)
    assert summary["files"] == 2 and summary["sources"] == 2


def test_two_file_names_that_read_as_one_source_are_not_both_indexed(tmp_path, monkeypatch, capsys):
    r"""A review (2026-12-06): ``a\xff.txt`` (the byte 0xff) and a file named ``a\xff.txt``
    (a backslash, as typed) both had the source ``a\xff.txt``: one file's chunks replaced
    the other's, and each re-index embedded both again. The second is skipped, saying why."""
    import os

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d = tmp_path / "docs"
    d.mkdir()
    with open(os.path.join(os.fsencode(d), b"a\xff.txt"), "wb") as fh:
        fh.write(b"Penguins live in Antarctica.")
    (d / "a\\xff.txt").write_text("Zebras live in Africa.")
    for _ in range(2):
        assert main(["index", str(d), "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["files"] == 1 and summary["index_chunks"] == 1
        (skipped,) = summary["skipped"]
        assert "its name reads as the source of" in skipped["reason"]
    assert summary["added"] == 0 and summary["removed"] == 0  # the re-index changed nothing


def unlistable(monkeypatch, name):
    """Folders named ``name`` cannot be listed (tests run as root: chmod would not stop it)."""
    listing = os.scandir

    def scandir(path="."):
        if not isinstance(path, int) and os.fspath(path).endswith(name):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_a_re_index_keeps_what_it_could_not_read_this_time(tmp_path, monkeypatch, capsys):
    """Re-indexing a folder pruned the chunks of a file it could not read now (a PDF broken
    mid-copy, a permission error) or of a subfolder it could not list, as if they were gone.
    A mutation review (2026-12-08): keeping only a PDF's pages and a folder's files (prefixes),
    not a plain text file's one source, passed every test: ``locked.md`` covers it."""
    from specrag.indexing import pipeline
    from specrag.indexing.documents import Unreadable

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    (d / "a.md").write_text("Rollo led the Norse settlers.")
    (d / "locked.md").write_text("Rollo was baptised in 912.")
    (d / "gone.md").write_text("This file will be deleted.")
    (d / "bin.md").write_text("This file will hold binary data.")
    (d / "sub" / "c.md").write_text("The treaty of Saint-Clair-sur-Epte.")
    write_pdf(d / "b.pdf", ["The treaty was signed in 911."])
    assert main(["index", str(d), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sources"] == 6

    reading = pipeline.read_records

    def read_records(path):  # tests run as root: chmod would not stop the read
        if path.name == "locked.md":
            raise Unreadable(f"[Errno 13] Permission denied: {path}")
        return reading(path)

    monkeypatch.setattr(pipeline, "read_records", read_records)
    (d / "b.pdf").write_bytes(b"%PDF-1.4 truncated")  # unreadable now
    (d / "gone.md").unlink()  # really gone
    (d / "bin.md").write_bytes(bytes(range(256)) * 4)  # no longer text: its text is gone
    unlistable(monkeypatch, "sub")
    assert main(["index", str(d), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["files_removed"] == 2  # gone.md and bin.md
    reasons = {s["path"].split("/")[-1]: s["reason"] for s in summary["skipped"]}
    assert reasons["bin.md"].startswith("not a text file")
    assert reasons["b.pdf"].startswith("unreadable: cannot read PDF")
    assert reasons["locked.md"].startswith("unreadable: [Errno 13] Permission denied")
    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import open_index

    sources = open_index(SpecRagContext()).sources()
    real = d.resolve()
    assert sorted(sources) == sorted(
        [
            str(real / "a.md"),
            str(real / "locked.md"),
            f"{real / 'b.pdf'}#page=1",
            str(real / "sub" / "c.md"),
        ]
    ), sources


def test_an_interrupted_re_index_leaves_the_old_chunks(tmp_path, monkeypatch, capsys):
    """The stale chunks of a changed file were deleted before the new ones were embedded and
    added: Ctrl-C (or a full disk) in between left the file half gone from the index."""
    from langchain_chroma import Chroma

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    f = tmp_path / "notes.md"
    f.write_text("Rollo led the Norse settlers of Normandy.")
    assert main(["index", str(f)]) == 0
    capsys.readouterr()
    f.write_text("Rollo was baptised in 912 and took the name Robert.")

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(Chroma, "add_texts", interrupted)
    assert main(["index", str(f)]) == 130
    capsys.readouterr()
    monkeypatch.undo()
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import open_index

    index = open_index(SpecRagContext())
    (hit,) = index.search("Who led the Norse settlers?", 1, "dense")
    assert "Norse settlers" in hit.text  # the old text is still there
    assert main(["index", str(f), "--json"]) == 0  # the next run finishes the job
    summary = json.loads(capsys.readouterr().out)
    assert (summary["added"], summary["removed"], summary["chunks"]) == (1, 1, 1)


def test_an_index_refuses_another_embedding_model(tmp_path, monkeypatch, capsys):
    """Another embedding model's vectors in the same collection: a 768-dimension model failed
    only after the old chunks were deleted, one of the same dimension mixed two spaces."""
    from specrag.models.loading import embedded_embeddings_path

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    f = tmp_path / "notes.md"
    f.write_text("Rollo led the Norse settlers of Normandy.")
    assert main(["index", str(f)]) == 0
    import os
    import shutil

    # another folder (hard links to the bundled files, so it loads): another model to the record
    shutil.copytree(embedded_embeddings_path(), tmp_path / "minilm", copy_function=os.link)
    other = ["--set", f"embedding_model={tmp_path / 'minilm'}"]
    f.write_text("Rollo was baptised in 912.")
    capsys.readouterr()
    assert main(["index", str(f), *other]) == 2
    err = capsys.readouterr().err.strip()
    assert "was built with embedding model 'embedded'" in err and "\n" not in err
    assert main(["ask", "Who led?", *other]) == 2
    assert "was built with embedding model" in capsys.readouterr().err
    # another collection takes the other model, and records it
    assert main(["index", str(f), *other, "--set", "collection=other-model", "--json"]) == 0


def test_another_embedding_model_is_refused_before_it_loads(tmp_path, monkeypatch, capsys):
    """A new user's report (2026-12-05): a hub id not cached here spent 75 s in download
    retries (33 lines of them) before the index said it was built with another model."""
    import importlib

    import specrag.indexing.pipeline

    services = importlib.import_module("specrag.graph.services")  # specrag.graph shadows it
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    f = tmp_path / "notes.md"
    f.write_text("Rollo led the Norse settlers of Normandy.")
    assert main(["index", str(f)]) == 0

    def no_load(name):
        raise AssertionError(f"loaded {name}")

    def no_read(*a, **k):  # `index` read every file first (minutes on a large PDF folder)
        raise AssertionError("files read before the index's embedding model was checked")

    for module in (services, specrag.indexing.pipeline):
        monkeypatch.setattr(module, "load_embeddings", no_load)
    monkeypatch.setattr(specrag.indexing.pipeline, "load_files", no_read)
    services._INDEXES.clear()
    hub = ["--set", "embedding_model=sentence-transformers/all-mpnet-base-v2"]
    capsys.readouterr()
    for argv in (["ask", "Who led?", *hub], ["index", str(f), *hub]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "was built with embedding model 'embedded'" in err and "\n" not in err, err


def test_the_embedding_record_names_the_model_not_a_folder_that_happens_to_be_here(
    tmp_path, monkeypatch
):
    """`embedded` run from a directory holding a folder `embedded` was recorded as that
    folder's path, and the bundled model's own folder counted as another model."""
    from specrag.errors import IndexError_
    from specrag.indexing.store import check_embedding_stamp, embedding_stamp
    from specrag.models.loading import embedded_embeddings_path

    (tmp_path / "embedded").mkdir()
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path)
    assert embedding_stamp("embedded") == "embedded"
    assert embedding_stamp(str(embedded_embeddings_path())) == "embedded"
    assert embedding_stamp("other") == str(tmp_path / "other")
    assert embedding_stamp("org/some-model") == "org/some-model"
    check_embedding_stamp(None, "org/x", "c", "here")  # no record: not checked
    check_embedding_stamp("/gone/minilm", "org/x", "c", "here")  # a moved folder: a warning
    with pytest.raises(IndexError_, match="built with embedding model 'embedded'"):
        check_embedding_stamp("embedded", str(tmp_path / "other"), "c", "here")


def test_a_collection_made_before_the_record_opens_with_any_model(tmp_path):
    """Indexes made before 2026-12-05 (the demo's, the benches') have no record: they open
    and take writes as before, and stay unrecorded."""
    import chromadb

    from specrag.indexing.store import EMBEDDING_KEY, VectorIndex
    from specrag.models.loading import load_embeddings

    client = chromadb.PersistentClient(path=str(tmp_path))
    client.get_or_create_collection("old-one", metadata={"hnsw:space": "cosine"})
    for name in ("embedded", "org/another-model"):
        index = VectorIndex(tmp_path, load_embeddings(), "old-one", embedding_model=name)
        assert EMBEDDING_KEY not in (index._collection.metadata or {})


def test_a_file_past_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch, capsys):
    """A file is read whole into memory (then tokenized and embedded): a multi-GiB log named
    by mistake ran the machine out of memory instead of saying why. Past SPECRAG_MAX_FILE_MIB
    a named file is one error line; in a folder it is skipped as unreadable and a re-index
    keeps what it indexed from it; a bad setting fails the run before any file is skipped."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.md").write_text("Rollo led the Norse settlers.")
    (d / "big.txt").write_text("The treaty was signed in 911. " * 100)  # 3,000 bytes
    write_pdf(d / "b.pdf", ["Rollo died around 930."])
    assert main(["index", str(d), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sources"] == 3

    monkeypatch.setenv("SPECRAG_MAX_FILE_MIB", str(2_000 / 2**20))  # 2,000 bytes
    assert read_text(d / "a.md") == "Rollo led the Norse settlers."
    assert main(["ask", "Who led them?", "--document", str(d / "big.txt")]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("specrag: error: ") and "\n" not in err
    assert (
        "big.txt is too large: 0.00286 MiB, past the 0.00191 MiB limit" in err
        and "SPECRAG_MAX_FILE_MIB" in err
    )
    assert main(["index", str(d / "big.txt")]) != 0
    assert "too large" in capsys.readouterr().err

    assert main(["index", str(d), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    reasons = {s["path"].split("/")[-1]: s["reason"] for s in summary["skipped"]}
    assert reasons["big.txt"].startswith("unreadable: ") and "too large" in reasons["big.txt"]
    assert summary["files_removed"] == 0  # kept, not pruned

    for bad in ("0", "-1", "lots", "inf", "nan"):
        monkeypatch.setenv("SPECRAG_MAX_FILE_MIB", bad)
        assert main(["index", str(d), "--json"]) == 2
        out = json.loads(capsys.readouterr().out)
        assert out["error"] == f"SPECRAG_MAX_FILE_MIB must be a positive number of MiB, got {bad!r}"
    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import open_index

    assert len(open_index(SpecRagContext()).sources()) == 3  # nothing pruned by a bad setting


def test_a_long_files_moved_chunks_are_updated_in_batches_chroma_accepts(tmp_path, monkeypatch):
    """Text inserted at the top of a long file moves every later chunk: their positions went
    to Chroma in one update, past its batch limit (5,461 ids locally), and the re-index
    failed with the file indexed twice. Updates and deletes go in batches."""
    from specrag.indexing import store
    from specrag.indexing.documents import Chunk
    from specrag.indexing.pipeline import open_for_writing
    from specrag.models.loading import EMBEDDED_LM

    monkeypatch.setattr(store, "WRITE_BATCH", 3)
    index = open_for_writing(tmp_path / "index", "batches", EMBEDDED_LM)
    calls: list[tuple[str, int]] = []
    update, delete = index._collection.update, index._collection.delete

    def spy_update(ids, **kw):
        calls.append(("update", len(ids)))
        return update(ids=ids, **kw)

    def spy_delete(ids, **kw):
        calls.append(("delete", len(ids)))
        return delete(ids=ids, **kw)

    index._collection.update, index._collection.delete = spy_update, spy_delete

    def chunk(n, position):
        return Chunk(id=f"c{n}", source="long.md", text=f"Duke number {n}.", position=position)

    assert index.upsert_source("long.md", [chunk(n, n) for n in range(8)]) == (8, 0)
    # an opening chunk inserted: the 7 kept chunks move down one, the last one is gone
    assert index.upsert_source("long.md", [chunk(99, 0)] + [chunk(n, n + 1) for n in range(7)])
    assert calls == [("update", 3), ("update", 3), ("update", 1), ("delete", 1)]
    got = index._collection.get(where={"source": "long.md"}, include=["metadatas"])
    positions = {i: m["position"] for i, m in zip(got["ids"], got["metadatas"], strict=True)}
    assert positions == {"c99": 0, **{f"c{n}": n + 1 for n in range(7)}}


def test_a_renamed_file_is_found_if_the_re_index_stops_before_its_new_name_is_added(
    tmp_path, monkeypatch, capsys
):
    """Pruning ran before the new chunks were added: a file renamed and a re-index stopped
    (Ctrl-C, an embedding error) before the new name was embedded lost its text."""
    from specrag.indexing import pipeline

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.md").write_text("Rollo led the Norse settlers.")
    assert main(["index", str(d), "--json"]) == 0
    capsys.readouterr()
    (d / "a.md").rename(d / "b.md")

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "index_documents", stopped)
    assert main(["index", str(d)]) == 130
    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import open_index

    assert open_index(SpecRagContext()).sources() == {str((d / "a.md").resolve())}


def test_a_folder_that_can_be_listed_but_not_entered_is_reported(tmp_path, monkeypatch):
    """A subfolder with read but no execute permission: stat'ing its entries raised
    PermissionError out of the walk and the whole index run failed."""
    from pathlib import Path

    d = tmp_path / "docs"
    (d / "locked").mkdir(parents=True)
    (d / "a.md").write_text("Rollo led the Norse settlers.")
    (d / "locked" / "b.md").write_text("The treaty of 911.")
    real = Path.is_file

    def is_file(self):
        if self.parent.name == "locked":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "is_file", is_file)
    loaded = load_files([str(d)])
    assert [r[0].split("/")[-1] for r in loaded.records] == ["a.md"]
    (locked,) = [s for s in loaded.skipped if s.path.endswith("b.md")]
    assert locked.reason.startswith("unreadable (Permission denied") and locked.still_there


def indexed_sources(tmp_path, capsys, *paths):
    """``specrag index PATHS`` (JSON checked), then the index's sources."""
    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import open_index

    assert main(["index", *map(str, paths), "--json"]) == 0
    json.loads(capsys.readouterr().out)
    return sorted(open_index(SpecRagContext()).sources())


def test_what_a_re_index_prunes_around_links_hidden_folders_and_pdf_pages(
    tmp_path, monkeypatch, capsys
):
    """A review of pruning (2026-12-05) found four holes: a hidden link to a visible folder
    (``.latest -> v2``) kept ``v2``'s deleted files; a hidden folder named as a root of its
    own kept its deleted files; files reached through a link out of the named folder were
    never pruned; and a named PDF's page prefix pruned ``x.pdf#page=2.md`` beside it."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d, shared = tmp_path / "docs", tmp_path / "shared"
    for folder in (d / "v2", d / ".private", shared):
        folder.mkdir(parents=True)
    (d / ".latest").symlink_to(d / "v2")
    (d / "ext").symlink_to(shared)
    kept = (d / ".private" / "q.md", d / "keep.md")  # (an empty .private would keep p.md)
    for path in (d / "v2" / "a.md", d / ".private" / "p.md", shared / "s.md", *kept):
        path.write_text(f"The text of {path.name}, which Rollo wrote.")
    beside = tmp_path / "x.pdf#page=2.md"
    beside.write_text("A note next to the PDF.")
    write_pdf(tmp_path / "x.pdf", ["The treaty was signed in 911."])
    real = tmp_path.resolve()
    before = indexed_sources(tmp_path, capsys, d, d / ".private", beside, tmp_path / "x.pdf")
    assert before == sorted(
        [
            str(real / "docs" / "v2" / "a.md"),
            str(real / "docs" / ".private" / "p.md"),
            str(real / "docs" / ".private" / "q.md"),
            str(real / "shared" / "s.md"),
            str(real / "docs" / "keep.md"),
            str(beside.resolve()),
            f"{real / 'x.pdf'}#page=1",
        ]
    )
    for gone in (d / "v2" / "a.md", d / ".private" / "p.md", shared / "s.md"):
        gone.unlink()
    after = indexed_sources(tmp_path, capsys, d, d / ".private", tmp_path / "x.pdf")
    assert after == sorted(
        [
            str(real / "docs" / ".private" / "q.md"),
            str(real / "docs" / "keep.md"),
            str(beside.resolve()),
            f"{real / 'x.pdf'}#page=1",
        ]
    )
    # the docs folder alone: its hidden folder, indexed when named, is skipped, not pruned
    assert indexed_sources(tmp_path, capsys, d, tmp_path / "x.pdf") == after


def test_pdf_text_with_a_lone_surrogate_is_indexed(tmp_path, monkeypatch):
    """pypdf decodes broken text maps with ``surrogatepass``: such a page stopped the whole
    index run at that file (UnicodeEncodeError hashing its chunk ids), on every re-run."""
    import pypdf

    from specrag.indexing.documents import chunk_ids, read_records

    write_pdf(tmp_path / "odd.pdf", ["placeholder"])
    monkeypatch.setattr(pypdf.PageObject, "extract_text", lambda self, *a, **k: "Rollo \ud800 911")
    [(source, text)] = read_records(tmp_path / "odd.pdf")
    assert text == "Rollo \ufffd 911" and source.endswith("odd.pdf#page=1")
    assert chunk_ids(source, [text])  # hashed and storable


@pytest.mark.parametrize(
    "page",
    [
        b'<meta charset="base64"><p>caf\xe9 Rollo</p>',  # no text codec: LookupError
        b"<p>Rollo</p><![foo[ bar ]]>",  # html.parser: AssertionError
        b'<meta charset="unicode_escape"><p>Rollo \\ud800 \xe9</p>',  # a lone surrogate
    ],
)
def test_one_odd_html_page_does_not_stop_the_folder(tmp_path, page):
    """A review (2026-12-06): a page declaring a codec that is no character set, markup
    html.parser asserts on, or an escape codec that decodes to a lone surrogate raised a
    LookupError / AssertionError / TypeError out of the walk - the folder could not be indexed
    at all, on every run, and the error named no file. Now such a page is read as best it can
    be, or skipped with its name and why, and the folder's other files are indexed."""
    from specrag.indexing.documents import InputError

    d = tmp_path / "docs"
    d.mkdir()
    (d / "good.txt").write_text("Rollo led the Norse settlers.")
    (d / "bad.html").write_bytes(page)
    try:
        text = read_text(d / "bad.html")
        assert "Rollo" in text and not any("\ud800" <= ch <= "\udfff" for ch in text)
    except InputError as exc:
        assert "bad.html" in str(exc) and "\n" not in str(exc)
    loaded = load_files([str(d)])
    assert str((d / "good.txt").resolve()) in [s for s, _ in loaded.records]
    assert len(loaded.records) + len(loaded.skipped) == 2


def test_one_file_under_two_names_is_indexed_once(tmp_path):
    """On a case-insensitive file system ``docs/a.md`` and ``DOCS/a.md`` are one file under two
    spellings; a hard link stands in for that here (two paths, one device and inode)."""
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.md").write_text("Rollo led the Norse settlers.")
    (d / "b.md").write_text("Richard I was Rollo's great-grandson.")
    other = tmp_path / "DOCS"
    other.mkdir()
    os.link(d / "a.md", other / "a.md")
    loaded = load_files([str(d), str(other), str(other / "a.md")])
    assert [s for s, _ in loaded.records] == [str(d / "a.md"), str(d / "b.md")]


def test_what_a_removed_or_repointed_link_reached_is_pruned_unless_indexed_in_its_own_right(
    tmp_path, monkeypatch, capsys
):
    """A review (2026-12-05): a re-index after a link out of the named folder was removed kept
    the chunks of what it had reached, which no walk of the folder would ever prune."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d, shared, other, own = (tmp_path / n for n in ("docs", "shared", "other", "own"))
    for folder in (d, shared, other, own):
        folder.mkdir()
    for path in (d / "keep.md", shared / "s.md", other / "f.md", own / "o.md"):
        path.write_text(f"The text of {path.name}, which Rollo wrote.")
    (d / "ext").symlink_to(shared)
    (d / "f.md").symlink_to(other / "f.md")
    (d / "mine").symlink_to(own)
    real = tmp_path.resolve()
    indexed_sources(tmp_path, capsys, own)  # in its own right: no link decides its fate
    first = indexed_sources(tmp_path, capsys, d)
    assert first == sorted(
        str(real / p) for p in ("docs/keep.md", "shared/s.md", "other/f.md", "own/o.md")
    )
    (d / "f.md").unlink()
    (d / "mine").unlink()
    (d / "ext").unlink()
    (d / "ext").symlink_to(other)  # pointed elsewhere: shared/ is no longer reached
    after = indexed_sources(tmp_path, capsys, d)
    assert after == sorted(str(real / p) for p in ("docs/keep.md", "other/f.md", "own/o.md"))
    (d / "ext").unlink()
    assert indexed_sources(tmp_path, capsys, d) == sorted(
        str(real / p) for p in ("docs/keep.md", "own/o.md")
    )


def linked_folders(tmp_path, names=("docs", "shared")):
    """``docs/keep.md`` and ``docs/ext -> shared/`` (``shared/s.md``), named by ``names``."""
    d, shared = (tmp_path / name for name in names)
    d.mkdir()
    shared.mkdir()
    (d / "keep.md").write_text("Keep this text about owls.")
    (shared / "s.md").write_text("Shared text about ospreys.")
    (d / "ext").symlink_to(shared)
    return d, shared


def cut_at_call(monkeypatch, name, n):
    """``VectorIndex.<name>`` raises KeyboardInterrupt at its ``n``-th call; the calls made."""
    from specrag.indexing.store import VectorIndex

    real, calls = getattr(VectorIndex, name), []

    def cut(self, *a, **k):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(VectorIndex, name, cut)
    return calls


def test_a_first_run_cut_short_leaves_what_it_reached_through_links_to_be_pruned(
    tmp_path, monkeypatch, capsys
):
    """A review (2026-12-06): the link record was saved only once a first run had written
    everything; a first run cut short left none, so the next run took what the cut one had
    written for "there before the record" - held for good, never pruned with its link."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d, _ = linked_folders(tmp_path)
    with monkeypatch.context() as m:
        calls = cut_at_call(m, "upsert_source", 2)
        assert main(["index", str(d)]) == 130 and len(calls) == 2
    real = tmp_path.resolve()
    both = sorted(str(real / p) for p in ("docs/keep.md", "shared/s.md"))
    assert indexed_sources(tmp_path, capsys, d) == both
    (d / "ext").unlink()
    assert indexed_sources(tmp_path, capsys, d) == [str(real / "docs" / "keep.md")]


@pytest.mark.parametrize("first_run", [True, False])
def test_a_run_cut_short_after_a_link_was_added_leaves_its_target_to_be_pruned(
    tmp_path, monkeypatch, capsys, first_run
):
    """A review (2026-12-07): a run's reach was recorded only after it had written and pruned
    all; a run cut short after a link was added left the link's target indexed, and once the
    link was removed no run pruned it (the record never said the link had reached it)."""
    from specrag.indexing.store import VectorIndex

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d, shared = tmp_path / "docs", tmp_path / "shared"
    d.mkdir()
    shared.mkdir()
    (d / "keep.md").write_text("Keep this text about owls.")
    (shared / "s.md").write_text("Shared text about ospreys.")
    real = tmp_path.resolve()
    if not first_run:
        assert indexed_sources(tmp_path, capsys, d) == [str(real / "docs" / "keep.md")]
    (d / "ext").symlink_to(shared)
    upsert = VectorIndex.upsert_source

    def cut_after_the_target(self, source, *a, **k):
        got = upsert(self, source, *a, **k)
        if source.endswith("s.md"):
            raise KeyboardInterrupt
        return got

    monkeypatch.setattr(VectorIndex, "upsert_source", cut_after_the_target)
    assert main(["index", str(d)]) == 130
    monkeypatch.setattr(VectorIndex, "upsert_source", upsert)
    (d / "ext").unlink()
    assert indexed_sources(tmp_path, capsys, d) == [str(real / "docs" / "keep.md")]


def test_an_index_without_a_link_record_prunes_nothing_for_links(
    tmp_path, monkeypatch, capsys, caplog
):
    """An index made before the record (or whose record is damaged) cannot know what a removed
    link reached: it keeps it, as before, and a warning names a damaged record."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d, shared = tmp_path / "docs", tmp_path / "shared"
    d.mkdir(), shared.mkdir()
    (shared / "s.md").write_text("Rollo signed the treaty.")
    (d / "keep.md").write_text("Rollo kept his word.")
    (d / "ext").symlink_to(shared)
    indexed_sources(tmp_path, capsys, d)
    (record,) = (tmp_path / "data").rglob("reach-*.json")
    assert json.loads(record.read_text()) == {
        f"{d.resolve()}{os.sep}": [f"{shared.resolve()}{os.sep}"]
    }
    record.write_text("{not json")
    (d / "ext").unlink()
    assert str(shared.resolve() / "s.md") in indexed_sources(tmp_path, capsys, d)
    assert "ignoring the unreadable link record" in caplog.text
    assert json.loads(record.read_text()) == {  # what was there before the record: kept
        "": [str(d.resolve() / "keep.md"), str(shared.resolve() / "s.md")],
        f"{d.resolve()}{os.sep}": [],
    }


def test_a_link_whose_target_is_away_keeps_what_it_reached(tmp_path, monkeypatch, capsys):
    """A drive not mounted, a share down: the link is there, its target is not. What it
    reached stays indexed (as a file that could not be read does) until the link goes."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d, notes = tmp_path / "docs", tmp_path / "media" / "notes"
    d.mkdir(), notes.mkdir(parents=True)
    (d / "keep.md").write_text("Rollo kept his word.")
    (notes / "n.md").write_text("Rollo signed the treaty.")
    (d / "usb").symlink_to(notes)
    n = str(notes.resolve() / "n.md")
    assert n in indexed_sources(tmp_path, capsys, d)
    notes.rename(tmp_path / "media" / "away")  # unplugged
    assert n in indexed_sources(tmp_path, capsys, d)
    (d / "usb").unlink()
    assert n not in indexed_sources(tmp_path, capsys, d)


def test_a_subfolder_left_unread_keeps_what_its_links_reached(tmp_path, monkeypatch, capsys):
    """A review (2026-12-05): ``docs/private/link -> /ext``; a re-index that could not list
    ``docs/private`` kept ``private``'s own files but pruned what its link had reached."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d, ext = tmp_path / "docs", tmp_path / "ext"
    (d / "private").mkdir(parents=True), ext.mkdir()
    (d / "private" / "p.md").write_text("Rollo kept a secret.")
    (d / "keep.md").write_text("Rollo kept his word.")
    (ext / "e.md").write_text("Rollo signed the treaty.")
    (d / "private" / "link").symlink_to(ext)
    first = indexed_sources(tmp_path, capsys, d)
    assert len(first) == 3
    listing = os.scandir
    unlistable(monkeypatch, "private")
    assert indexed_sources(tmp_path, capsys, d) == first
    monkeypatch.setattr(os, "scandir", listing)
    (d / "private" / "link").unlink()  # readable again, the link gone: what it reached goes
    assert indexed_sources(tmp_path, capsys, d) == sorted(
        str(d.resolve() / p) for p in ("keep.md", "private/p.md")
    )


def test_a_folder_named_under_a_re_indexed_one_leaves_its_links_to_that_walk(
    tmp_path, monkeypatch, capsys
):
    """``index docs/sub`` once, later ``index docs``: the old record of ``docs/sub`` kept
    what its removed link had reached, as if indexed in its own right, for ever."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d, ext = tmp_path / "docs", tmp_path / "ext"
    (d / "sub").mkdir(parents=True), ext.mkdir()
    (d / "sub" / "s.md").write_text("Rollo led the Norse.")
    (ext / "e.md").write_text("Rollo signed the treaty.")
    (d / "sub" / "link").symlink_to(ext)
    indexed_sources(tmp_path, capsys, d / "sub")
    assert str(ext.resolve() / "e.md") in indexed_sources(tmp_path, capsys, d)
    (d / "sub" / "link").unlink()
    assert indexed_sources(tmp_path, capsys, d) == [str(d.resolve() / "sub" / "s.md")]


def test_what_a_link_record_holds():
    from specrag.indexing.pipeline import _Held

    held = _Held(["/a/b/", "/c/x.pdf", "/d/e.md"])
    assert "/a/b/c/d.md" in held and "/c/x.pdf#page=3" in held and "/d/e.md" in held
    for other in ("/a/bc.md", "/c/x.pdf#page=3.md", "/d/e.md.bak", "/a/b", "/d/"):
        assert other not in held
    assert not _Held([]) and "/a" not in _Held([])


def test_forget_removes_what_the_index_holds_of_a_path_gone_or_not(tmp_path, monkeypatch, capsys):
    """A new user's report (2026-12-05): a file indexed by name and deleted stayed cited for
    ever - naming it again was "no such file", and no folder walk would ever prune it. Naming
    a missing path stays an error (a drive not mounted must not empty the index):
    ``--forget`` removes, and a path the index holds nothing of removes nothing."""
    import importlib

    import specrag.indexing.pipeline

    services = importlib.import_module("specrag.graph.services")
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    fact, keep, folder, ext = (tmp_path / n for n in ("fact.txt", "keep.md", "old", "ext"))
    folder.mkdir(), ext.mkdir()
    fact.write_text("The Zlonk bird sings at dawn.")
    keep.write_text("Rollo kept his word.")
    (folder / "a.md").write_text("Rollo signed the treaty.")
    (ext / "e.md").write_text("Rollo was baptised.")
    (folder / "link").symlink_to(ext)  # what the forgotten folder reached goes with it
    write_pdf(tmp_path / "x.pdf", ["The treaty was signed in 911.", "Rollo was baptised."])
    indexed_sources(tmp_path, capsys, fact, keep, folder, tmp_path / "x.pdf")
    fact.unlink()
    (tmp_path / "x.pdf").unlink()
    assert main(["index", str(fact)]) == 2  # gone: an error, as ever, nothing removed
    assert "no such file or folder" in capsys.readouterr().err

    def no_load(name):
        raise AssertionError(f"loaded {name}")

    with monkeypatch.context() as m:  # a typo is told before the embedding model loads
        for module in (services, specrag.indexing.pipeline):
            m.setattr(module, "load_embeddings", no_load)
        services._INDEXES.clear()
        assert main(["index", "--forget", str(fact), str(tmp_path / "typo.md")]) == 2
        assert "the index holds nothing of" in capsys.readouterr().err
    after = indexed_sources(tmp_path, capsys, "--forget", fact, folder, tmp_path / "x.pdf")
    assert after == [str(keep.resolve())]  # the folder is still there: forgotten all the same


def test_a_forget_cut_short_is_finished_by_the_same_forget(tmp_path, monkeypatch, capsys):
    """A review (2026-12-07): `--forget docs` removed the folder's own files before what its
    links reached; cut short between them, the same `--forget` again was "the index holds
    nothing of docs", and the link's target stayed indexed for good."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d, _ = linked_folders(tmp_path, ("a-docs", "z-shared"))  # the folder's own files first
    assert len(indexed_sources(tmp_path, capsys, d)) == 2
    with monkeypatch.context() as m:
        calls = cut_at_call(m, "remove_source", 2)
        assert main(["index", "--forget", str(d)]) == 130 and len(calls) == 2
    capsys.readouterr()
    assert indexed_sources(tmp_path, capsys, "--forget", d) == []


def test_a_named_link_pointed_elsewhere_drops_what_it_reached(tmp_path, monkeypatch, capsys):
    """A review (2026-12-07): the record keyed a named link (`index latest`, `latest -> v2`)
    by its target, so after `latest -> v3` the next `index latest` kept v2's text beside v3's
    (old releases piled up and were cited); so for a named file link. `--forget latest` drops
    the link's record with its text."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    real = tmp_path.resolve()
    for v in ("v2", "v3"):
        (tmp_path / v).mkdir()
        (tmp_path / v / f"{v}.md").write_text(f"Release {v}: the walrus eats clams.")
        (tmp_path / f"{v}.txt").write_text(f"Notes {v}: the owl eats mice.")
    latest, current = tmp_path / "latest", tmp_path / "current.txt"
    latest.symlink_to(tmp_path / "v2")
    current.symlink_to(tmp_path / "v2.txt")
    assert indexed_sources(tmp_path, capsys, latest, current) == [
        str(real / "v2.txt"),
        str(real / "v2" / "v2.md"),
    ]
    latest.unlink()
    current.unlink()
    latest.symlink_to(tmp_path / "v3")
    current.symlink_to(tmp_path / "v3.txt")
    assert indexed_sources(tmp_path, capsys, latest, current) == [
        str(real / "v3.txt"),
        str(real / "v3" / "v3.md"),
    ]
    (record,) = (tmp_path / "data").rglob("reach-*.json")
    assert json.loads(record.read_text()) == {
        f"{real / 'current.txt'}": [str(real / "v3.txt")],
        f"{real / 'latest'}{os.sep}": [f"{real / 'v3'}{os.sep}"],
    }
    assert indexed_sources(tmp_path, capsys, "--forget", latest, current) == []
    assert json.loads(record.read_text()) == {}
    # a broken named link (its target deleted) is forgotten with its record too: a record
    # left behind held what the link had reached for good (a review of this fix, 2026-12-07)
    indexed_sources(tmp_path, capsys, latest)
    shutil.rmtree(tmp_path / "v3")
    assert indexed_sources(tmp_path, capsys, "--forget", latest) == []
    assert json.loads(record.read_text()) == {}


def test_an_empty_path_is_no_working_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.md").write_text("Rollo led the Norse.")
    assert main(["index", ""]) == 2
    assert "an empty path was given" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_a_file_name_with_control_characters_stays_on_one_line(tmp_path):
    r"""A new user's report (2026-12-05): ``bad\nname.png`` split the skipped list of the
    one-line summary in two (and an escape code would have coloured the terminal)."""
    from specrag.indexing.documents import describe_skipped, one_line

    d = tmp_path / "docs"
    d.mkdir()
    (d / "bad\nname\x1b[31m.png").write_bytes(b"x")
    (d / "a.md").write_text("Rollo led the Norse.")
    shown = describe_skipped(load_files([str(d)]).skipped, 5)
    assert shown == r"bad\nname\x1b[31m.png: unsupported type .png"
    assert one_line("café\ttab") == r"café\ttab"


def test_the_index_summary_counts_what_the_whole_index_holds(tmp_path, monkeypatch, capsys):
    """`index --forget a.md` on an index of three files said "0 chunks left": it counted the
    chunks of the paths named, not what the index still held."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    a, b, c = (tmp_path / n for n in ("a.md", "b.md", "c.md"))
    for path, text in ((a, "Rollo led them."), (b, "The treaty was signed."), (c, "Kiwis.")):
        path.write_text(text)
    assert main(["index", str(a), str(b), str(c)]) == 0
    assert "3 chunks (3 new, 0 removed; 3 in the index)" in capsys.readouterr().err
    assert main(["index", str(a)]) == 0  # the files named: 1 chunk; the index: 3
    assert "1 chunk (0 new, 0 removed; 3 in the index)" in capsys.readouterr().err
    assert main(["index", "--forget", str(a)]) == 0
    assert "1 chunk removed, 2 left in the index" in capsys.readouterr().err
    assert main(["index", "--forget", str(b), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["removed"], summary["index_chunks"]) == (1, 1)


def test_a_folder_left_with_no_text_is_pruned_of_what_it_held(tmp_path, monkeypatch, capsys):
    """Deleting a folder's files (or turning them into binary files) and indexing it again was
    "no text found": an error that pruned nothing, so the deleted files were cited for ever."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    d, keep = tmp_path / "d", tmp_path / "keep.md"
    d.mkdir()
    (d / "a.txt").write_text("The quokka lives in Australia.")
    (d / "b.txt").write_text("The kiwi lives in New Zealand.")
    keep.write_text("Rollo kept his word.")
    assert len(indexed_sources(tmp_path, capsys, d, keep)) == 3
    (d / "a.txt").write_bytes(bytes(range(256)) * 12)  # no longer text
    (d / "b.txt").unlink()
    assert main(["index", str(d), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["files"], summary["files_removed"], summary["index_chunks"]) == (0, 2, 1)
    assert [s["reason"].split(":")[0] for s in summary["skipped"]] == [
        "not a text file (binary content)"
    ]
    assert indexed_sources(tmp_path, capsys, keep) == [str(keep.resolve())]
    # a folder the index holds nothing of is still told there is no text in it
    (tmp_path / "empty").mkdir()
    assert main(["index", str(tmp_path / "empty")]) == 2
    assert "no .txt/.md/.markdown/.html/.htm/.pdf text found" in capsys.readouterr().err
    # a folder left with nothing at all may be a drive not mounted: nothing is pruned
    (e := tmp_path / "e").mkdir()
    (e / "c.txt").write_text("The emu lives in Australia.")
    assert len(indexed_sources(tmp_path, capsys, e)) == 2
    (e / "c.txt").unlink()
    assert main(["index", str(e)]) == 2
    assert f"`specrag index --forget {e}` removes them" in capsys.readouterr().err
    assert len(indexed_sources(tmp_path, capsys, keep)) == 2
    # with another path that has text (it pruned the empty one's files then): that path is
    # indexed, the empty folder's files are kept, and the run says so
    assert main(["index", str(e), str(keep), "--json"]) == 0
    (held,) = json.loads(capsys.readouterr().out)["skipped"]
    assert held["path"] == str(e) and f"`specrag index --forget {e}` removes them" in held["reason"]
    assert len(indexed_sources(tmp_path, capsys, keep)) == 2
    # an empty folder the index holds nothing of, beside a path with text: said too (it was
    # left out without a word: a typo, a drive not mounted; a review, 2026-12-07)
    assert main(["index", str(tmp_path / "empty"), str(keep), "--json"]) == 0
    (blank,) = json.loads(capsys.readouterr().out)["skipped"]
    assert blank == {"path": str(tmp_path / "empty"), "reason": "an empty folder: nothing to index"}


def test_a_folder_with_no_text_creates_no_index(tmp_path, monkeypatch, capsys):
    """The check of what the index held of a folder with no text opened (so created) an
    empty index: the next `ask` said "no collection" instead of "run specrag index"."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "empty").mkdir()
    assert main(["index", str(tmp_path / "empty")]) == 2
    assert "text found" in capsys.readouterr().err
    assert main(["ask", "Who?"]) == 2
    assert "run `specrag index PATH`" in capsys.readouterr().err


@pytest.mark.timeout(60)  # before the fix the pipe hung
def test_a_device_or_a_pipe_is_refused_before_it_is_opened(tmp_path, monkeypatch, capsys):
    """``--document`` of a link to /dev/zero read until the machine ran out of memory (its
    size is 0, so the size limit let it through); a named pipe hung ``ask`` and ``index``."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "zero.txt").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.txt")
    for name in ("zero.txt", "fifo.txt"):
        path = str(tmp_path / name)
        for argv in (["ask", "Who led them?", "--document", path], ["index", path]):
            assert main(argv) == 2
            err = capsys.readouterr().err.strip()
            said = "specrag: error: not a regular file (a device, pipe or socket): "
            assert err in (said + path, said + os.path.realpath(path))  # index resolves links


def test_a_file_that_grew_past_the_limit_after_its_size_was_read_is_refused(tmp_path, monkeypatch):
    """The size check reads the size first: what is read is bounded by the limit too."""
    from specrag.indexing import documents

    path = tmp_path / "log.txt"
    path.write_text("x" * 100)
    monkeypatch.setenv("SPECRAG_MAX_FILE_MIB", str(1_000 / 2**20))
    monkeypatch.setattr(documents, "check_size", lambda p: path.write_text("x" * 5_000))
    with pytest.raises(documents.Unreadable, match="too large: more than the 0.000954 MiB"):
        documents.read_text(path)


def test_a_bounded_read_reserves_no_more_than_it_reads(tmp_path, monkeypatch):
    """``read(limit + 1)`` reserved the whole limit for a 5-byte file: with the limit raised
    past the memory (the error line says to raise it) every read was a MemoryError."""
    import io

    from specrag.indexing import documents

    path = tmp_path / "note.txt"
    path.write_text("Rollo")
    monkeypatch.setenv("SPECRAG_MAX_FILE_MIB", str(2**40))  # 1 EiB
    assert documents.read_text(path) == "Rollo"

    asked = []

    class Stream(io.BytesIO):
        def read(self, n=-1):
            asked.append(n)
            return super().read(n)

    monkeypatch.setenv("SPECRAG_MAX_FILE_MIB", "3")
    assert documents.read_stream(Stream(b"a" * (3 * 2**20)), "stdin") == "a" * (3 * 2**20)
    assert max(asked) == 2**20  # in pieces
    with pytest.raises(documents.Unreadable, match="stdin is too large: more than the 3 MiB"):
        documents.read_stream(Stream(b"a" * (3 * 2**20 + 1)), "stdin")


def test_a_link_to_a_folder_above_is_not_followed(tmp_path, monkeypatch, capsys):
    """``docs/loop -> ..`` indexed everything beside docs/ (other projects' files, the index's
    own files in the skip list) without a word."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.md").write_text("Rollo led the Norse settlers.")
    (tmp_path / "private.md").write_text("Not for this index.")
    (docs / "loop").symlink_to("..")
    (docs / "sub" / "self").symlink_to("..")  # docs/ itself
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "b.md").write_text("The duchy was founded in 911.")
    (docs / "sub" / "side").symlink_to(tmp_path / "shared")  # beside it: followed as before
    assert main(["index", str(docs), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    reasons = {s["path"]: s["reason"] for s in summary["skipped"]}
    above = "link to a folder above it (not followed)"
    assert reasons[str(docs / "loop")] == above and reasons[str(docs / "sub" / "self")] == above
    assert summary["sources"] == 2  # a.md and, through the link beside, b.md


def test_a_file_named_again_that_is_no_longer_text_is_removed_from_the_index(
    tmp_path, monkeypatch, capsys
):
    """`index solo.txt` after solo.txt became binary (or empty) was an error that removed
    nothing: its old text was still retrieved and cited (a new user, 2026-12-06)."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    solo, page, keep = tmp_path / "solo.txt", tmp_path / "notes.md", tmp_path / "keep.md"
    solo.write_text("Quokkas live on Rottnest Island.")
    page.write_text("The kiwi lives in New Zealand.")
    keep.write_text("Rollo kept his word.")
    assert len(indexed_sources(tmp_path, capsys, solo, page, keep)) == 3
    solo.write_bytes(bytes(range(256)) * 12)
    page.write_text("  \n")
    assert main(["index", str(solo), str(page), str(keep), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["files"], summary["files_removed"]) == (1, 2)
    assert {s["path"]: s["reason"] for s in summary["skipped"]} == {
        str(solo.resolve()): "not a text file (binary content): removed from the index",
        str(page.resolve()): "empty (no text): removed from the index",
    }
    assert indexed_sources(tmp_path, capsys, keep) == [str(keep.resolve())]
    # named again, the index holding nothing of it: the error it always was, nothing removed
    assert main(["index", str(solo), str(keep)]) == 2
    assert f"not a text file (binary content): {solo.resolve()}" in capsys.readouterr().err
    assert main(["index", str(page)]) == 2
    assert f"no text in {page.resolve()}" in capsys.readouterr().err
    assert indexed_sources(tmp_path, capsys, keep) == [str(keep.resolve())]


def test_a_folder_reports_the_pipes_and_devices_it_skips(tmp_path, monkeypatch, capsys):
    """A FIFO or a link to /dev/zero in a folder was left out and named nowhere, though a
    folder's summary reports all it leaves out (a new user, 2026-12-06)."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "llama.txt").write_text("Llamas live in the Andes.")
    os.mkfifo(odd / "fifo.txt")
    (odd / "zero.txt").symlink_to("/dev/zero")
    assert main(["index", str(odd), "--json"]) == 0
    skipped = {s["path"]: s["reason"] for s in json.loads(capsys.readouterr().out)["skipped"]}
    reason = "not a regular file (a device, pipe or socket)"
    assert skipped == {str(odd / "fifo.txt"): reason, str(odd / "zero.txt"): reason}


def test_overlapping_folders_report_a_skipped_entry_once(tmp_path):
    """`index docs docs/sub` listed docs/sub/logo.png twice (a new user, 2026-12-06)."""
    sub = tmp_path / "docs" / "sub"
    sub.mkdir(parents=True)
    (sub / "a.md").write_text("Text.")
    (sub / "logo.png").write_bytes(b"png")
    (tmp_path / "docs" / ".hidden").write_text("x")
    loaded = load_files([str(tmp_path / "docs"), str(sub), str(tmp_path / "docs")])
    assert sorted(s.path.split("/")[-1] for s in loaded.skipped) == [".hidden", "logo.png"]


def test_a_long_files_progress_moves_while_it_is_embedded(tmp_path, monkeypatch):
    """One large file (750 chunks, 15 s) showed 0/1 the whole time: the bar counted files
    only (a new user, 2026-12-06). It moves per embedded batch, and each file ends on a whole
    number (the count column reads it)."""
    from specrag.indexing import store
    from specrag.indexing.pipeline import index_records

    monkeypatch.setattr(store, "EMBED_BATCH", 2)
    told = []
    text = " ".join(f"Sentence {n} about the quokkas of Rottnest Island." for n in range(150))
    records = [("long.md", text), ("short.md", "Rollo led the Norse.")]
    index_records(records, tmp_path / "idx", progress=told.append)
    assert told == sorted(told) and told[-1] == 2 and 1 in told
    assert any(0 < done < 1 for done in told)  # within the long file


def test_index_writers_take_turns(tmp_path):
    """Two `specrag index` runs on one index at once undid each other's work (the later one
    pruned a file the other had just added; both said they succeeded). A writer waits for
    another process's lock, says so once, and a process re-enters its own lock."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from specrag.indexing import pipeline
    from specrag.indexing.pipeline import writing_lock

    done = tmp_path / "done"
    with pipeline.writing_lock(tmp_path, "specrag"):  # its lock file: the one it holds
        lock = Path(next(iter(pipeline._HELD)))
    assert lock.parent == pipeline.cache_dir() / "locks" and not list(tmp_path.iterdir())
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, pathlib, time\n"
            f"h = open({str(lock)!r}, 'a'); fcntl.flock(h, fcntl.LOCK_EX)\n"
            "print('held', flush=True); time.sleep(1.0)\n"
            f"pathlib.Path({str(done)!r}).touch(); fcntl.flock(h, fcntl.LOCK_UN)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    waited: list[float] = []
    with writing_lock(tmp_path, "specrag", on_wait=lambda: waited.append(time.monotonic())):
        assert done.exists()  # got it once the other process let go
        with writing_lock(tmp_path, "specrag", on_wait=lambda: waited.append(-1.0)):
            pass  # re-entered: no wait
    assert len(waited) == 1 and waited[0] > 0
    holder.wait()
    with writing_lock(tmp_path, "other"), writing_lock(tmp_path, "specrag"):
        pass  # another collection's lock is its own


def test_a_pdf_locked_by_an_owner_password_only_is_read(tmp_path):
    """A "no copying" PDF (owner password, empty user password: any viewer opens it) was
    refused as encrypted; one that needs a password to open still is."""
    from pypdf import PdfReader, PdfWriter

    from specrag.errors import InputError
    from specrag.indexing.documents import read_pdf_pages

    plain = tmp_path / "plain.pdf"
    write_pdf(plain, ["The treaty was signed in 911."])
    for name, user in (("owner_only.pdf", ""), ("locked.pdf", "secret")):
        writer = PdfWriter(clone_from=PdfReader(plain))
        writer.encrypt(user_password=user, owner_password="owner", algorithm="RC4-128")
        with open(tmp_path / name, "wb") as fh:
            writer.write(fh)
    assert "signed in 911" in read_pdf_pages(tmp_path / "owner_only.pdf")[0]
    with pytest.raises(InputError, match="the PDF is encrypted"):
        read_pdf_pages(tmp_path / "locked.pdf")


def test_html_cells_and_blocks_keep_their_words_apart_and_entities_are_read_once():
    """'<td>Widget</td><td>10</td>' read 'Widget10' (BM25 found neither word) and
    '&amp;lt;b&amp;gt;' was unescaped twice into a tag."""
    from specrag.indexing.documents import html_to_text

    page = (
        "<table><tr><th>Part</th><th>Price</th></tr><tr><td>Widget</td><td>10</td></tr></table>"
        "<h5>Warranty</h5><section>Two years</section><p>AT&amp;amp;T &amp;lt;b&amp;gt; "
        "un<b>bold</b>ed</p>"
    )
    text = html_to_text(page)
    assert text.startswith("Part | Price\nWidget | 10\n\n##### Warranty\n\nTwo years"), text
    words = text.split()
    assert "AT&amp;T" in words and "&lt;b&gt;" in words and "unbolded" in words


def test_a_cells_paragraphs_keep_its_row_one_line():
    """Word, Google Docs and most CMS exports put a <p> (or <div>, a list) in every cell:
    each cell became paragraphs of its own ("Product\\n | \\nPrice"), so a row's cells and
    its header could land in different chunks."""
    from specrag.indexing.documents import html_to_text

    page = (
        "<table><tr><th><p class=MsoNormal>Product</p></th><th><p>Price</p></th></tr>"
        "<tr><td><p>Widget</p><p>blue</p></td><td><div>10 EUR</div></td></tr>"
        "<tr><td><ul><li>a</li><li>b</li></ul></td><td><h3>Big</h3></td></tr></table>"
        "<p>After</p>"
    )
    assert html_to_text(page) == "Product | Price\nWidget blue | 10 EUR\na b | Big\n\nAfter"


def test_a_latin1_label_reads_as_windows_1252_as_browsers_read_it(tmp_path):
    """A page labelled iso-8859-1 with Windows-1252's curly quotes (most such pages) read
    them as C1 control characters; a utf-16 label on an ASCII-readable page read it all as
    CJK noise."""
    quotes = "It\u2019s \u201cquoted\u201d \u2013 costs 5\u20ac"
    (tmp_path / "l1.html").write_bytes(
        f'<meta charset="iso-8859-1"><p>{quotes}</p>'.encode("cp1252")
    )
    (tmp_path / "u16.html").write_bytes(b'<meta charset="utf-16"><p>plain words here</p>')
    assert read_text(tmp_path / "l1.html") == quotes
    assert read_text(tmp_path / "u16.html") == "plain words here"


def test_a_tables_rows_stay_lines_of_one_paragraph_and_a_br_is_one_line_break():
    """Every cell was a paragraph of its own ("Name\n\nQty\n\nWidget\n\n10"), so a row's
    cells and its header could land in different chunks; "<br/>" was a paragraph break and
    "<br>" a line break (a review of document reading, 2026-12-06)."""
    from specrag.indexing.documents import html_to_text

    page = """<p>Stock</p>
    <table>
      <tr><th>Name</th> <th>Qty</th></tr>
      <tr>
        <td>Widget
            blue</td>
        <td>10</td>
      </tr>
    </table>
    <p>a<br>b<br/>c</p><td>a cell outside a table</td>"""
    assert html_to_text(page) == (
        "Stock\n\nName | Qty\nWidget blue | 10\n\na\nb\nc\n\na cell outside a table"
    )


def test_encodings_a_user_s_files_declare_or_imply_are_read_and_line_ends_are_newlines(tmp_path):
    """An HTML page's meta charset was ignored (windows-1251 and Shift_JIS pages were indexed
    as Windows-1252 mojibake); Windows and old-Mac line ends kept their CRs and never split at
    paragraphs; UTF-16 without a BOM and UTF-32 with one were "binary"; a NUL byte past the
    first 8 KiB was indexed (a review of document reading, 2026-12-06)."""
    ru = '<meta charset="windows-1251"><p>Привет, мир</p>'.encode("cp1251")
    (tmp_path / "ru.html").write_bytes(ru)
    jp = '<meta http-equiv="Content-Type" content="text/html; charset=Shift_JIS"><p>日本語</p>'
    (tmp_path / "jp.htm").write_bytes(jp.encode("shift_jis"))
    (tmp_path / "crlf.txt").write_bytes(b"one\r\ntwo\r\n\r\nthree\rfour")
    (tmp_path / "u16.txt").write_bytes("plain text, no BOM".encode("utf-16-le"))
    (tmp_path / "u16be.txt").write_bytes("plain text, no BOM".encode("utf-16-be"))
    (tmp_path / "u32.txt").write_bytes("\ufeffcafé".encode("utf-32-le"))
    (tmp_path / "late.txt").write_bytes(b"A" * 9000 + b"\x00\x00B")
    assert read_text(tmp_path / "ru.html") == "Привет, мир"
    assert read_text(tmp_path / "jp.htm") == "日本語"
    assert read_text(tmp_path / "crlf.txt") == "one\ntwo\n\nthree\nfour"
    assert read_text(tmp_path / "u16.txt") == read_text(tmp_path / "u16be.txt")
    assert read_text(tmp_path / "u16.txt") == "plain text, no BOM"
    assert read_text(tmp_path / "u32.txt") == "café"
    assert read_text(tmp_path / "late.txt") == "A" * 9000 + "B"
    from specrag.errors import InputError

    # one character with a NUL low byte ("一" U+4E00) refused the file as binary (a review,
    # 2026-12-07)
    mixed = "Hello world, one \u4e00 two.\n" * 3
    (tmp_path / "cjk16.txt").write_bytes(mixed.encode("utf-16-le"))
    (tmp_path / "cjk16be.txt").write_bytes(mixed.encode("utf-16-be"))
    assert read_text(tmp_path / "cjk16.txt") == read_text(tmp_path / "cjk16be.txt") == mixed
    (tmp_path / "bin.txt").write_bytes(bytes(range(256)) * 4)  # binary is still refused
    with pytest.raises(InputError, match="binary content"):
        read_text(tmp_path / "bin.txt")


def test_a_utf16_file_cut_mid_character_is_read_with_the_damage_marked(tmp_path, caplog):
    """A UTF-16 log still being written (odd length) or with one lone surrogate was refused
    whole, and a re-index of its folder then dropped its indexed text."""
    import codecs

    from specrag.errors import InputError

    line = "The service started at 09:14.\n" * 20
    (tmp_path / "cut.log.txt").write_bytes(codecs.BOM_UTF16_LE + line.encode("utf-16-le") + b"A")
    lone = (line + "\ud83d" + line).encode("utf-16-le", "surrogatepass")
    (tmp_path / "lone.txt").write_bytes(codecs.BOM_UTF16_LE + lone)
    (tmp_path / "nobom.txt").write_bytes(line.encode("utf-16-le") + b"A")
    with caplog.at_level("WARNING"):
        assert read_text(tmp_path / "cut.log.txt") == line + "\ufffd"
        assert read_text(tmp_path / "lone.txt") == line + "\ufffd" + line
        assert read_text(tmp_path / "nobom.txt") == line + "\ufffd"
    assert caplog.text.count("1 damaged utf-16 code unit(s), read as U+FFFD") == 3
    noise = codecs.BOM_UTF16_LE + bytes((i * 89 + 7) % 256 for i in range(4000))
    (tmp_path / "noise.txt").write_bytes(noise)  # not text: still refused
    with pytest.raises(InputError, match="not UTF-16 text despite its byte order mark"):
        read_text(tmp_path / "noise.txt")


def test_pdf_pages_without_text_are_said(tmp_path, caplog):
    """A scanned page (no text layer) was left out silently (a review, 2026-12-06)."""
    from specrag.indexing.documents import read_records

    write_pdf(tmp_path / "scan.pdf", ["Page one text", "", "Page three text"])
    with caplog.at_level("WARNING"):
        records = read_records(tmp_path / "scan.pdf")
    assert [source.rsplit("=", 1)[1] for source, _ in records] == ["1", "3"]
    assert "1 of its 3 pages has no text (scanned? run OCR on it first): left out" in caplog.text


def test_utf8_with_a_damaged_byte_is_read_as_utf8_and_windows_1252_still_as_it_is(tmp_path):
    """A UTF-8 file cut mid-character (or with one stray byte) was read whole as
    Windows-1252: "café" became "cafÃ©" everywhere and its words were never found."""
    from specrag.indexing.documents import decode_text

    good = "Le café — déjà vu. " * 20
    cut = good.encode()[:-1] + "é".encode()[:1]  # the last character cut in half
    assert decode_text(cut, tmp_path / "a.txt").startswith("Le café — déjà vu.")
    stray = good.encode() + b"\xa0" + good.encode()
    text = decode_text(stray, tmp_path / "b.txt")
    assert "cafÃ" not in text and text.count("\ufffd") == 1
    legacy = "Un café crème, s'il vous plaît.".encode("cp1252")  # no valid UTF-8 in it
    assert decode_text(legacy, tmp_path / "c.txt") == "Un café crème, s'il vous plaît."


def test_forget_on_an_index_it_cannot_open_says_so_not_no_collection(tmp_path, monkeypatch):
    """A read-only index ("attempt to write a readonly database") was reported as having no
    such collection."""
    from chromadb.errors import NotFoundError

    from specrag.errors import IndexError_
    from specrag.indexing import store

    for error, said in (
        (RuntimeError("attempt to write a readonly database"), "cannot open index at "),
        (NotFoundError("Collection [specrag] does not exist"), "no collection 'specrag' at "),
    ):

        def fails(*a, error=error):
            raise error

        monkeypatch.setattr(store, "_plain_collection", fails)
        with pytest.raises(IndexError_, match=said) as err:
            store.stored_sources(tmp_path, "specrag", "")
        if "readonly" in str(error):  # a pre-built index on a read-only mount (2026-12-06)
            assert str(err.value).endswith(
                "copy the index to a writable folder and pass --index-dir)"
            )


def test_a_line_with_no_space_is_split_without_a_tokenizer_call_per_character():
    """Minified text or base64 is split character by character, each measured: a tokenizer
    call per character made 1.2 MB take minutes."""
    from specrag.indexing.documents import make_splitter, split_document

    calls = {"n": 0}

    def length(text: str) -> int:
        calls["n"] += 1
        return len(text)

    text = "abcdefghij" * 3000  # 30,000 characters, no space
    chunks = split_document("x", text, make_splitter(length, 200, 25))
    assert "".join(c.text for c in chunks).startswith("abcdefghij" * 10)
    assert max(len(c.text) for c in chunks) <= 200
    assert calls["n"] < 2000, calls["n"]  # not ~30,000


def test_ask_with_a_pdf_document_cites_the_pages_its_chunks_came_from(
    capsys, monkeypatch, tmp_path
):
    """`ask --document report.pdf` cited the file where `index` cites the page
    (``report.pdf#page=3``, ``"page": 3``); an empty page still counts in the numbering."""
    import specrag.cli

    pdf = tmp_path / "report.pdf"
    write_pdf(pdf, ["The garden is kept by the tenant.", "", "Rent is paid monthly."])
    chunks = {
        "a": "Rent is paid monthly.",
        "b": "The garden is kept by the tenant.",
        "c": "a passage the file does not hold",
    }

    async def run_graph(question, ctx, document, **k):
        assert document == "The garden is kept by the tenant.\n\nRent is paid monthly."
        return {
            "answer": "Monthly.",
            "route": "generate",
            "chunks": [{"id": i, "source": "document", "text": t} for i, t in chunks.items()],
            "citations": [
                {"n": n, "id": i, "source": "document", "score": 0.5}
                for n, i in enumerate(chunks, start=1)
            ],
        }

    monkeypatch.setattr(specrag.cli, "preload", lambda *a, **k: None)
    monkeypatch.setattr(specrag.cli, "run_graph", run_graph)
    assert main(["ask", "When is the rent paid?", "--document", str(pdf), "--json"]) == 0
    sources = json.loads(capsys.readouterr().out)["sources"]
    assert [(s["source"], s.get("page")) for s in sources] == [
        (f"{pdf}#page=3", 3),
        (f"{pdf}#page=1", 1),
        (str(pdf), None),  # not found in the text read: the file, as before
    ]


def test_a_heading_opens_the_chunk_of_the_section_it_heads():
    """A heading whose section did not fit one chunk with it ended the chunk before (or stood
    alone), and the section's text was searched without it; HTML headings read as Markdown's,
    so they are known as headings too (a "left as is" item of the 2026-12-06 notes)."""
    from specrag.indexing.documents import html_to_text, make_splitter, split_document

    def words(text):
        return len(text.split())

    splitter = make_splitter(words, 40, 5)
    body = " ".join(f"word{i}." for i in range(60))
    text = (
        f"# Title\n\nA short intro.\n\n## Install\n\n{body}\n\n## Use\n\n### Run\n\n{body}"
        "\n\n## Last"
    )
    chunks = [c.text for c in split_document("x.md", text, splitter)]
    assert chunks[0] == "# Title\n\nA short intro."
    assert chunks[1].startswith("## Install\n\nword0. word1.")
    openers = [c.split("\n\n")[0] for c in chunks]
    assert "## Use\n\n### Run" in [c[: len("## Use\n\n### Run")] for c in chunks]
    assert openers.count("## Install") == 1 and not any(c.endswith("## Use") for c in chunks)
    assert chunks[-1].endswith("## Last")  # nothing after it to open
    # a code fence's "# comment" is not a heading (the fence opened chunks before)
    code = f"```\n{body}\n\n# a comment\n\n{body}\n```\n\n## After\n\n{body}"
    chunks = [c.text for c in split_document("c.md", code, splitter)]
    assert "# a comment" in chunks, chunks  # where the splitter put it: alone
    assert any(c.startswith("## After\n\nword0.") for c in chunks), chunks

    page = "<h2>\n  Section <a href='#'>two</a>\n</h2><p>Body.</p><h3> </h3><p>End.</p>"
    assert html_to_text(page) == "## Section two\n\nBody.\n\nEnd."
    # an unclosed heading ends at the next block; a "heading" of 60 words is not marked one
    assert html_to_text("<h1>Title<p>One</p><p>Two</p><h2>Sub</h2>") == (
        "# Title\n\nOne\n\nTwo\n\n## Sub"
    )
    assert not html_to_text("<h3>" + "long " * 60 + "</h3>").startswith("#")

    # the overlap brought the chunk before's end, heading included: the heading opens the
    # chunk once, the paragraph before it is not put under it (a review of this change)
    lead, section = body.split()[:30], body.split()[30:]
    text = f"{' '.join(lead)}\n\nSee below.\n\n## Install\n\n{' '.join(section)}"
    chunks = [c.text for c in split_document("o.md", text, splitter)]
    assert chunks[-1].startswith("## Install\n\nword30.") and chunks[-1].count("## Install") == 1
    assert chunks[0].endswith("See below."), chunks
    # the overlap brought only the last of two carried headings: the first is added once
    from specrag.indexing.documents import _carry_headings

    pair = ["Intro.\n\n## A\n\n### B", "### B\n\nThe body."]
    assert _carry_headings(pair, "", lambda h: True) == ["Intro.", "## A\n\n### B\n\nThe body."]
    # a heading is found as whole lines: "## Use" is not the start of "## Users guide" (it was
    # taken as already there, and dropped from both chunks; a review of this change)
    pair = ["Intro.\n\n## Use", "## Users guide\n\nThe body."]
    assert _carry_headings(pair, "", lambda h: True) == [
        "Intro.",
        "## Use\n\n## Users guide\n\nThe body.",
    ]
    # the overlap repeated a heading with trailing blanks: still the same line, added once
    pair = ["Intro.\n\n## Setup", "## Setup  \n\nThe body."]
    assert _carry_headings(pair, "", lambda h: True) == ["Intro.", "## Setup  \n\nThe body."]
    pair = ["Intro.\n\n## A\n\n### B", "### Bees\n\nThe body."]
    assert _carry_headings(pair, "", lambda h: True)[1] == "## A\n\n### B\n\n### Bees\n\nThe body."
    # a heading longer than an eighth of the chunk size stays where the splitter put it
    long_heading = "## " + " ".join(["Install"] * 8)
    text = f"{' '.join(lead)}\n\n{long_heading}\n\n{' '.join(section)}"
    chunks = [c.text for c in split_document("l.md", text, splitter)]
    assert chunks[0].endswith(long_heading), chunks


def test_index_tells_a_typo_before_it_opens_the_index(tmp_path, monkeypatch, capsys):
    """With the index checked before the files are read (a review, 2026-12-06), `index typo.txt
    --index-url URL` said the server did not answer: a path that is not there comes first."""
    import specrag.indexing.store

    def no_open(*a, **k):
        raise AssertionError("the index was opened before the named paths were checked")

    monkeypatch.setattr(specrag.indexing.store, "check_recorded_model", no_open)
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "photo.png").write_bytes(b"\x89PNG")
    for argv, said in (
        (["index", str(tmp_path / "typo.txt")], "no such file or folder"),
        (["index", str(tmp_path / "photo.png"), "--index-url", "http://127.0.0.1:9"], ".png"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and "\n" not in err, err


def test_a_moved_embedding_model_is_warned_of_once(tmp_path, caplog):
    """`index` checks the recorded model before it reads the files and again as it opens the
    index: the "which is gone" warning was printed two or three times in one run."""
    from specrag.indexing.store import check_embedding_stamp

    gone = str(tmp_path / "moved-model")
    with caplog.at_level("WARNING", logger="specrag"):
        for _ in range(3):
            check_embedding_stamp(gone, "embedded", "docs", str(tmp_path))
    assert sum("which is gone" in r.getMessage() for r in caplog.records) == 1


FORK_SCRIPT = """
import os, sys
from langchain_core.embeddings import FakeEmbeddings
from specrag.errors import IndexError_
from specrag.indexing.documents import Chunk
from specrag.indexing.store import VectorIndex

index = VectorIndex(sys.argv[1], FakeEmbeddings(size=8), create=True)
index.upsert_source("a.txt", [Chunk("a-0", "a.txt", "Rollo led the Norse.", 0)])
assert index.count() == 1
pid = os.fork()
if pid == 0:
    try:
        index.count()
        os._exit(3)
    except IndexError_ as exc:
        print(exc, flush=True)
        os._exit(4)
for _ in range(600):  # 60 s
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(os.waitstatus_to_exitcode(status))
    import time; time.sleep(0.1)
os.kill(pid, 9)
sys.exit(5)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_child_forked_after_the_index_opened_is_refused_not_frozen(tmp_path):
    """A process forked after its parent opened the local index (gunicorn --preload after
    `specrag.preload(ctx)`) froze at its first search: Chroma's Rust client hangs after a fork,
    holding the GIL, so no budget could end the run (a review, 2026-12-06). It is refused in
    one line that says what to do."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, str(tmp_path / "index")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 4, (done.returncode, done.stderr[-2000:])
    assert "forked" in done.stdout and "preload(ctx, index=False)" in done.stdout


def test_a_pdf_with_no_text_at_all_is_one_error_line_with_the_ocr_hint(
    tmp_path, capsys, monkeypatch
):
    """Named to `index`, a scanned PDF printed a warning saying "none of its 2 pages has no
    text" (the opposite of what it meant) and then the error "no text in ...": two lines for
    one error (a review, 2026-12-07). `ask --document` gave no hint at all."""
    from specrag.cli import main

    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    write_pdf(tmp_path / "scan.pdf", ["", ""])
    code = main(["index", str(tmp_path / "scan.pdf"), "--index-dir", str(tmp_path / "i")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "no text in" in err[0] and "scanned? run OCR on it first" in err[0]
    assert "none of its" not in err[0]
    code = main(["ask", "q", "--document", str(tmp_path / "scan.pdf")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "the document is empty" in err[-1] and "run OCR" in err[-1]


def test_a_pdf_page_that_cannot_be_read_is_left_out_not_the_whole_file(
    tmp_path, monkeypatch, caplog
):
    """One damaged page (an inline image without its end, found by a review) made the whole
    PDF unreadable: its other pages were never indexed, and `ask --document` refused it."""
    import pypdf

    from specrag.indexing.documents import Unreadable, read_pdf_pages

    real = pypdf.PageObject.extract_text

    def damaged(self, *args, **kwargs):
        text = real(self, *args, **kwargs)
        if "BROKEN" in text:
            raise ValueError("Unexpected end of stream.")
        return text

    monkeypatch.setattr(pypdf.PageObject, "extract_text", damaged)
    path = tmp_path / "report.pdf"
    write_pdf(path, ["The sky is blue.", "BROKEN page", "The grass is green."])
    with caplog.at_level("WARNING"):
        assert read_pdf_pages(path) == ["The sky is blue.", "", "The grass is green."]
    assert "page(s) 2 could not be read (Unexpected end of stream.): left out" in caplog.text
    write_pdf(path, ["BROKEN one", "BROKEN two"])
    with pytest.raises(Unreadable, match="cannot read PDF .*Unexpected end of stream"):
        read_pdf_pages(path)


def test_a_walk_of_the_parent_keeps_what_a_hidden_named_link_reached(tmp_path, monkeypatch, capsys):
    """The last read of this session (2026-12-07): with named links keyed by their own path,
    `index base` after `index base/.latest` (`.latest -> ../other/v2`) dropped the link's
    record as covered by the walk of base, which skips hidden entries: v2's text was pruned.
    The record of a link still there stays."""
    monkeypatch.setenv("SPECRAG_DATA_DIR", str(tmp_path / "data"))
    base, v2 = tmp_path / "base", tmp_path / "other" / "v2"
    base.mkdir()
    v2.mkdir(parents=True)
    (v2 / "a.md").write_text("Walruses eat clams.")
    (base / "b.md").write_text("Owls eat mice.")
    (base / ".latest").symlink_to(v2)
    real = tmp_path.resolve()
    assert indexed_sources(tmp_path, capsys, base / ".latest") == [str(real / "other/v2/a.md")]
    both = sorted([str(real / "base/b.md"), str(real / "other/v2/a.md")])
    assert indexed_sources(tmp_path, capsys, base) == both


def test_two_collections_of_one_index_dir_are_opened_apart(tmp_path):
    """A process (a server, Studio, an agent's tool) that searches two collections of one
    index dir gets each its own: an opened index is kept per dir AND collection."""
    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import open_index
    from specrag.indexing.pipeline import index_records

    d = tmp_path / "index"
    index_records([("a.md", "The zebrafish genome was sequenced in Hinxton.")], d, collection="one")
    index_records([("b.md", "Rollo led the Norse settlers of Normandy.")], d, collection="two")
    for collection, source in (("one", "a.md"), ("two", "b.md")):
        index = open_index(SpecRagContext(index_dir=str(d), collection=collection))
        assert index.sources() == {source}


def test_a_pdfs_page_starts_are_where_each_page_begins_in_the_joined_text():
    from specrag.indexing.documents import join_pages

    text, starts = join_pages(["ab", "", "cd", "efg"])
    assert text == "ab\n\ncd\n\nefg" and starts == [(0, 1), (4, 3), (8, 4)]
    assert all(text[at:].startswith(page) for (at, _), page in zip(starts, ["ab", "cd", "efg"]))
