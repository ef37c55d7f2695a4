"""BM25 over the chunks of a Chroma collection (bm25s), kept in step with it.

The BM25 index is persisted inside the Chroma directory (``bm25-<collection>/``; for a Chroma
server, in the cache dir keyed by URL and collection). It records a fingerprint of the chunk
ids it was built from: whenever the collection's ids differ (re-index, pruning, another
process), it is rebuilt from the collection's own texts before the next search, so BM25 can
never return a chunk that is no longer indexed or miss one that is.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specrag.paths import process_running

# every word, one character too: bm25s' default (2+ characters) dropped "7" of "clause 7",
# "B" of "appendix B" (a question about clause 7 ranked clauses 7 and 8 alike)
TOKEN_PATTERN = r"(?u)\b\w+\b"


# "A" the letter after a word ("appendix A", "vitamin A", "type A") is not the article "a" (a
# stop word, and lowercased alike: "appendix A" searched "appendix" and ranked appendix B
# first): it is indexed and searched as a word of its own. Keeping "a" instead weighed the
# article (idf 0.45-0.7 on small indexes): "What is a lien?" ranked a chunk full of "a" first.
# Capitals around it say it is the article: after a word without a small letter ("WHAT IS A
# LIEN"), or before a capitalised word ("What Is A Lien", "Appendix A Fees" too)
LETTER_A = "a_letter"
_LETTER_A = re.compile(r"(?<=\w)([ \t]+)A\b(?!['\u2019]|[ \t]+[A-Z])")
_WORD_END = re.compile(r"\w+\Z")


def _letters(text: str) -> str:
    def letter(match: re.Match[str]) -> str:
        word = _WORD_END.search(text, max(0, match.start() - 64), match.start())
        if word is None or not any(c.islower() for c in word.group()):
            return match.group()
        return match.group(1) + LETTER_A

    return _LETTER_A.sub(letter, text)


@functools.cache
def tokenizer_id() -> str:
    """What the saved rows' tokens depend on besides the texts: bm25s' version and options."""
    try:
        version = importlib.metadata.version("bm25s")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return f"bm25s {version}|stopwords=en|letter A={LETTER_A} by case|tokens={TOKEN_PATTERN}"


def fingerprint(ids: list[str]) -> str:
    """Identity of a set of chunk ids, tokenized as :func:`tokenizer_id` says.

    An index saved by another bm25s version (or other tokenizer options) does not match, and
    is rebuilt from the collection's texts.
    """
    text = "\n".join([tokenizer_id(), *sorted(ids)])
    return hashlib.sha256(text.encode()).hexdigest()


def _tokenize(texts: list[str]) -> Any:
    import bm25s

    return bm25s.tokenize(
        [_letters(t) for t in texts],
        stopwords="en",
        token_pattern=TOKEN_PATTERN,
        show_progress=False,
    )


@dataclass
class LexicalIndex:
    """A BM25 retriever and the chunk ids its rows stand for."""

    retriever: Any
    ids: list[str]
    key: str
    terms: bool = True  # the texts hold a term BM25 indexes (not only stop words, punctuation)

    @classmethod
    def build(cls, ids: list[str], texts: list[str]) -> LexicalIndex:
        """Index ``texts`` (row i is chunk ``ids[i]``).

        Texts without one term (``"To be, or not to be."``: stop words only) give an index
        that finds nothing (bm25s refuses to index them: ``max() arg is an empty sequence``).
        """
        import bm25s

        retriever = bm25s.BM25()
        tokens = _tokenize(texts) if texts else None
        terms = tokens is not None and bool(tokens.vocab)
        if terms:
            retriever.index(tokens, show_progress=False)
        return cls(retriever, list(ids), fingerprint(ids), terms)

    def save(self, directory: Path) -> None:
        """Write atomically: a reader sees the old index or the new one, never half."""
        directory.parent.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(directory)
        me = f"{os.getpid()}.{threading.get_ident()}"  # two threads never share a folder
        tmp = directory.with_name(f"{directory.name}~tmp{me}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if self.ids and self.terms:
            self.retriever.save(str(tmp))
        meta = {"key": self.key, "ids": self.ids, "terms": self.terms}
        (tmp / "ids.json").write_text(json.dumps(meta))
        old = directory.with_name(f"{directory.name}~old{me}")
        try:
            os.replace(directory, old)
        except FileNotFoundError:  # none yet, or another writer moved it aside first
            pass
        try:
            os.replace(tmp, directory)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not directory.is_dir():
                raise
            # another process saved its index between the two moves: keep that one (a
            # reader checks its key and rebuilds if it is of other chunks)
        shutil.rmtree(old, ignore_errors=True)

    @classmethod
    def load(cls, directory: Path) -> LexicalIndex | None:
        """The saved index, or None when there is none (or it cannot be read)."""
        try:
            import bm25s

            meta = json.loads((directory / "ids.json").read_text())
            terms = bool(meta.get("terms", True))
            indexed = meta["ids"] and terms
            retriever = bm25s.BM25.load(str(directory)) if indexed else bm25s.BM25()
            return cls(retriever, list(meta["ids"]), str(meta["key"]), terms)
        except Exception:  # noqa: BLE001 - missing or damaged: the caller rebuilds it
            return None

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        """Top-``k`` ``(chunk id, BM25 score)``, best first (positive scores only)."""
        if not self.ids or not self.terms or k <= 0:
            return []
        rows, scores = self.retriever.retrieve(
            _tokenize([query]), k=min(k, len(self.ids)), show_progress=False
        )
        return [
            (self.ids[int(r)], float(s))
            for r, s in zip(rows[0], scores[0], strict=True)
            if float(s) > 0
        ]


def _remove_leftovers(directory: Path) -> None:
    """Delete the temporary copies of ``directory`` that killed writers left.

    ``~tmp<pid>.<tid>`` and ``~old<pid>.<tid>`` of a process that is no longer running: no
    collection name holds a ``~``, so another collection's index is never taken for one (the
    ``.tmp`` of earlier versions was: saving ``bm25-specrag`` deleted the index of a collection
    named ``specrag.tmp999999``). Earlier versions' ``.tmp<pid>.<tid>`` leftovers are removed
    too; a collection's name never ends in ``.tmp<digits>.<digits>`` by chance.
    """
    leftover = re.compile(rf"{re.escape(directory.name)}([~.])(?:tmp|old)(\d+)\.\d+")
    for path in directory.parent.glob(f"{directory.name}[~.]*"):
        mark = leftover.fullmatch(path.name)
        if mark is None or (mark[1] == "." and not (path / "ids.json").is_file()):
            continue
        pid = int(mark[2])
        if pid != os.getpid() and not process_running(pid):
            shutil.rmtree(path, ignore_errors=True)


def rrf(rankings: list[list[str]], k: int = 60) -> list[tuple[str, float]]:
    """Reciprocal rank fusion: ``sum 1 / (k + rank)`` over the rankings, best first."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
