"""Answer metrics with SQuAD's normalisation."""

from __future__ import annotations

import re
import statistics
import string
from collections import Counter
from collections.abc import Iterable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize(text: str) -> str:
    """Lower case, drop punctuation, articles and extra whitespace (official SQuAD rule)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer."""
    pred = normalize(prediction)
    return float(any(pred == normalize(g) for g in golds))


def contains(prediction: str, golds: Iterable[str]) -> float:
    """1.0 when a normalised gold answer occurs in the normalised prediction."""
    pred = f" {normalize(prediction)} "
    return float(any(f" {normalize(g)} " in pred for g in golds if normalize(g)))


def f1(prediction: str, golds: Iterable[str]) -> float:
    """Best token-level F1 against the gold answers."""
    pred = normalize(prediction).split()
    best = 0.0
    for gold in golds:
        ref = normalize(gold).split()
        common = Counter(pred) & Counter(ref)
        same = sum(common.values())
        if not pred or not ref:
            best = max(best, float(pred == ref))
            continue
        if same == 0:
            continue
        precision, recall = same / len(pred), same / len(ref)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); nan for no values."""
    if not values:
        return float("nan")
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    """Median; nan for no values."""
    return statistics.median(values) if values else float("nan")


def mean(values: Sequence[float]) -> float:
    """Mean; nan for no values."""
    return statistics.fmean(values) if values else float("nan")
