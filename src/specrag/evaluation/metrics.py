"""Answer metrics with SQuAD's normalisation."""

from __future__ import annotations

import math
import random
import re
import statistics
import string
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeGuard, TypeVar, cast

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

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


def json_ready(value: T) -> T:
    """``value`` with every non-finite float (a mean of no values) replaced by None.

    ``json.dumps`` writes nan as ``NaN``, which is not JSON. Tuples come back as lists.
    """
    out: object = value
    if isinstance(value, float):
        out = value if math.isfinite(value) else None
    elif isinstance(value, dict):
        out = {k: json_ready(v) for k, v in value.items()}
    elif isinstance(value, list | tuple):
        out = [json_ready(v) for v in value]
    return cast(T, out)


def _defined(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def bootstrap_ci(
    units: Sequence[T],
    statistic: Callable[[Sequence[T]], float | None],
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> list[float] | None:
    """Percentile bootstrap interval ``[lo, hi]`` of ``statistic(units)``.

    Each resample draws ``len(units)`` units with replacement (a unit is a question: all of its
    measurements travel together). Seeded: the same inputs give the same interval. Resamples on
    which the statistic is undefined (None, nan) are skipped; None when no resample is defined.
    None from one unit too: every resample of one question is that question, and ``[x, x]``
    read as a certain result (a ``--quick`` RAPID run printed ``4.179 [4.179, 4.179]``).
    """
    if len(units) < 2:
        return None
    rng = random.Random(seed)
    n = len(units)
    values: list[float] = []
    for _ in range(n_boot):
        value = statistic([units[rng.randrange(n)] for _ in range(n)])
        if _defined(value):
            values.append(value)
    if not values:
        return None
    tail = (1.0 - level) / 2 * 100
    return [percentile(values, tail), percentile(values, 100 - tail)]


def mean_diff_ci(
    pairs: Sequence[tuple[float, float]], *, seed: int = 0
) -> tuple[float, list[float] | None]:
    """Mean of ``a - b`` over paired ``(a, b)`` values and its bootstrap interval (by pair)."""

    def diff(ps: Sequence[tuple[float, float]]) -> float:
        return mean([a - b for a, b in ps])

    return diff(pairs), bootstrap_ci(pairs, diff, seed=seed)


def ratio_ci(
    num: Mapping[K, V],
    den: Mapping[K, V],
    agg: Callable[[Sequence[V]], float],
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float | None, list[float] | None]:
    """``agg(num) / agg(den)`` and its bootstrap interval, resampling the keys (questions).

    ``num`` and ``den`` map a question to its value under two systems. Only questions both
    have count (paired): a question one system has no value for (an answer decoded entirely in
    its first step, a failed run) would otherwise leave one side only and bias the ratio.
    Returns ``(None, None)`` when the ratio is undefined (no shared question, zero or nan
    denominator).
    """

    def ratio(keys: Sequence[K]) -> float | None:
        top = [num[k] for k in keys]
        bottom = [den[k] for k in keys]
        if not top or not bottom:
            return None
        b = agg(bottom)
        if not _defined(b) or b == 0:
            return None
        value = agg(top) / b
        return value if _defined(value) else None

    keys = sorted(set(num) & set(den), key=repr)
    point = ratio(keys)
    if point is None:
        return None, None
    return point, bootstrap_ci(keys, ratio, level=level, n_boot=n_boot, seed=seed)


def per_token(pairs: Sequence[tuple[float, float]]) -> float:
    """Pooled seconds per token of ``(seconds, tokens)`` pairs: ``sum(s) / sum(tokens)``."""
    tokens = sum(n for _, n in pairs)
    return sum(s for s, _ in pairs) / tokens if tokens > 0 else float("nan")


# What the ratios in the benchmarks' JSON are (their "statistics" field): which aggregate of
# which per-question values, and how their intervals are drawn.
BOOTSTRAP = (
    "95% percentile bootstrap interval, 2,000 resamples of the questions (a comparison's: of "
    "the questions both systems ran, paired; one system's value: of its questions), seeded; "
    "none (null) from one question, and from a few (< ~10) it is narrower than a true 95% "
    "interval"
)
RATIO_OF_MEANS = "mean over questions of the system's value / the same mean of the baseline's"
RATIO_OF_TOTALS = (
    "the system's total over the questions both ran / the baseline's total (a ratio of means: "
    "every question counts by its time, where a ratio of medians set one system's median "
    "question against another question of the baseline's)"
)
POOLED_PER_TOKEN = "sum of seconds / sum of tokens (pooled) of the system over the baseline's"
