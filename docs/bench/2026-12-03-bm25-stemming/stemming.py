"""Recall@k of BM25 and hybrid retrieval on SQuAD v2 dev, with and without a stemmer.

Usage: .venv/bin/python docs/bench/2026-12-03-bm25-stemming/stemming.py [N]  (N: a seeded sample)
"""

import json
import sys
import time

import bm25s
import Stemmer
from rich.console import Console

from specrag.data.datasets import sample, squad_paragraphs, squad_questions
from specrag.evaluation import metrics
from specrag.evaluation.bench_rag import SEED, _index
from specrag.indexing.lexical import rrf
from specrag.indexing.pipeline import open_for_writing

log = Console(stderr=True)
qs = squad_questions()
if len(sys.argv) > 1:
    qs = sample(qs, int(sys.argv[1]), SEED)
d = _index("bench_squad", [(p.id, p.text) for p in squad_paragraphs()], log)
index = open_for_writing(d, "bench_squad", "embedded")
got = index._collection.get(include=["documents", "metadatas"])
ids = [str(i) for i in got["ids"]]
texts = [str(t or "") for t in got["documents"]]
src = {i: str(m.get("source", "")) for i, m in zip(ids, got["metadatas"])}
stem = Stemmer.Stemmer("english")
tok = {
    "plain": lambda t: bm25s.tokenize(t, stopwords="en", show_progress=False),
    "stem": lambda t: bm25s.tokenize(t, stopwords="en", stemmer=stem, show_progress=False),
}
ret = {}
for name, f in tok.items():
    r = bm25s.BM25()
    r.index(f(texts), show_progress=False)
    ret[name] = r


def lex(name, q, k):
    rows, sc = ret[name].retrieve(tok[name]([q]), k=k, show_progress=False)
    return [ids[int(r)] for r, s in zip(rows[0], sc[0]) if float(s) > 0]


hits = {}
t0 = time.time()
for n, q in enumerate(qs):
    vec = index.store.embeddings.embed_query(q.question)
    dense = [c.id for c in index._dense(vec, 15)]
    gold = set(q.gold_ids)
    for name in tok:
        l15 = lex(name, q.question, 15)
        for k in (3, 5):
            depth = max(10, 3 * k)
            h = {"bm25": l15[:k], "hybrid": [c for c, _ in rrf([dense[:depth], l15[:depth]])][:k]}
            for mode, top in h.items():
                hits.setdefault(f"{mode}-{name}@{k}", []).append(
                    float(bool({src[c] for c in top} & gold))
                )
    for k in (3, 5):
        hits.setdefault(f"dense@{k}", []).append(float(bool({src[c] for c in dense[:k]} & gold)))
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
