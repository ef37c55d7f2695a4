"""The replay behind ``benchmarks/drafter_confidence.py`` (and the README's figures from it)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "drafter_confidence.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("drafter_confidence", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_width_cost_interpolates_and_never_falls_with_width(bench):
    cost = bench.width_cost({"1": 1.0, "2": 1.5, "4": 2.0, "5": 1.8})
    assert cost(1) == 1.0 and cost(3) == pytest.approx(1.75)
    assert cost(5) == 2.0  # 1.8 measured, but 4 tokens already cost 2.0
    assert cost(9) == 2.0  # past the widest measured width: its value


def test_replay_by_hand(bench):
    """Round 1 drafts 3 (stops after the 0.5-confidence token, which is rejected): 2 accepted
    + 1 corrected, cost 3 x 0.5 + pass(4); round 2 drafts the last 2, both accepted, and the
    answer ends - no bonus token past it: cost 2 x 0.5 + pass(3)."""
    got = bench.replay(
        [0.95, 0.95, 0.5, 0.95, 0.95],
        [True, True, False, True, True],
        cut=0.7,
        k=4,
        adaptive=False,
        ratio=0.5,
        cost=lambda w: 1.0 + 0.25 * (w - 1),
    )
    assert got == {"emitted": 5, "cost": pytest.approx(3.25 + 2.5), "drafted": 5, "accepted": 4}
    plain_k1 = bench.replay([0.1] * 4, [False] * 4, 0.7, 1, False, 0.0, lambda w: 1.0 * w)
    assert plain_k1["emitted"] == 4 and plain_k1["accepted"] == 0  # one corrected token a round
