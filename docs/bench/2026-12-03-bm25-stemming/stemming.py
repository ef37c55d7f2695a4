"""Recall@k of BM25 and hybrid retrieval on SQuAD v2 dev, with and without a stemmer.

Usage: .venv/bin/python docs/bench/2026-12-03-bm25-stemming/stemming.py [N]  (N: a seeded sample)

Each search goes through the store's own code (``IndexStore.search``: BM25 depth, positive
scores only, reciprocal rank fusion): only the tokenizer of ``specrag.indexing.lexical`` is
swapped, and the store given the BM25 index built with it.
"""

import json
import sys
import time

import bm25s
import Stemmer
from rich.console import Console

import specrag.indexing.lexical as lexical
from specrag.data.datasets import sample, squad_paragraphs, squad_questions
from specrag.evaluation import metrics
from specrag.evaluation.bench_rag import SEED, _index
from specrag.indexing.pipeline import open_for_writing

log = Console(stderr=True)
qs = squad_questions()
if len(sys.argv) > 1:
    qs = sample(qs, int(sys.argv[1]), SEED)
d = _index("bench_squad", [(p.id, p.text) for p in squad_paragraphs()], log)
index = open_for_writing(d, "bench_squad", "embedded")
got = index._collection.get(include=["documents"])
ids, texts = [str(i) for i in got["ids"]], [str(t or "") for t in got["documents"]]
stem = Stemmer.Stemmer("english")
plain = lexical._tokenize
tokenizers = {
    "plain": plain,
    "stem": lambda t: bm25s.tokenize(t, stopwords="en", stemmer=stem, show_progress=False),
}
built = {}
for name, tokenize in tokenizers.items():
    lexical._tokenize = tokenize
    built[name] = lexical.LexicalIndex.build(ids, texts)


def hit(question, k, mode, gold):
    return float(bool({c.source for c in index.search(question, k, mode)} & gold))


hits = {}
t0 = time.time()
for n, q in enumerate(qs):
    gold = set(q.gold_ids)
    for name, tokenize in tokenizers.items():
        lexical._tokenize, index._lexical = tokenize, built[name]
        for k in (3, 5):
            for mode in ("bm25", "hybrid"):
                hits.setdefault(f"{mode}-{name}@{k}", []).append(hit(q.question, k, mode, gold))
    lexical._tokenize = plain
    for k in (3, 5):
        hits.setdefault(f"dense@{k}", []).append(hit(q.question, k, "dense", gold))
    if n % 500 == 0:
        log.print(n, round(time.time() - t0))
out = {}
for key, v in sorted(hits.items()):
    out[key] = [
        round(metrics.mean(v), 4),
        [round(x, 4) for x in metrics.bootstrap_ci(v, metrics.mean, seed=SEED)],
    ]
for k in (3, 5):
    for mode in ("bm25", "hybrid"):
        pairs = list(zip(hits[f"{mode}-stem@{k}"], hits[f"{mode}-plain@{k}"]))
        dd, ci = metrics.mean_diff_ci(pairs, seed=SEED)
        out[f"{mode}@{k} stem-plain"] = [round(dd, 4), [round(x, 4) for x in ci]]
out["n"] = len(qs)
print(json.dumps(out, indent=1))
