"""The straggler decision on hand-computed compute times: pure, milliseconds."""

from __future__ import annotations

import pytest

from hpc_train.job.limits import StragglerLimits as Limits
from hpc_train.watch.stragglers import Sample, find, ratios

LIMITS = Limits(threshold=0.2, window_s=300.0)


def series(slow: float, seconds: int, step: int = 10, start: float = 1000.0) -> list[Sample]:
    """Three nodes: n1, n2 at 1.0 s per update, n3 at ``slow`` s, sampled every ``step`` s."""
    return [
        Sample(start + t, {"n1": 1.0, "n2": 1.0, "n3": slow}) for t in range(0, seconds + 1, step)
    ]


def test_ratio_is_against_the_median_of_the_other_nodes():
    # n3: 1.25 / median(1.0, 1.1) = 1.25 / 1.05; n1: 1.0 / median(1.1, 1.25) = 1.0 / 1.175
    got = ratios({"n1": 1.0, "n2": 1.1, "n3": 1.25})
    assert got["n3"] == pytest.approx((1.25 / 1.05, 1.05))
    assert got["n1"] == pytest.approx((1.0 / 1.175, 1.175))
    # two nodes: the slow one is 1.25x the other (the median of both would say 1.11x)
    assert ratios({"a": 0.8, "b": 1.0})["b"] == pytest.approx((1.25, 0.8))
    assert ratios({"a": 1.0}) == {} and ratios({"a": 1.0, "b": 0.0}) == {}  # untimed: ignored


def test_a_node_25_percent_slower_for_longer_than_the_window_is_named():
    (found,) = find(series(1.25, 310), LIMITS)
    assert (found.node, found.since, found.seconds) == ("n3", 1000.0, 310.0)
    assert found.ratio == pytest.approx(1.25) and found.median_s == 1.0
    assert "node n3" in found.describe() and "1.25x" in found.describe()


def test_not_before_the_window_has_passed():
    assert find(series(1.25, 290), LIMITS) == []
    assert [s.node for s in find(series(1.25, 300), LIMITS)] == ["n3"]  # exactly the window


def test_15_percent_slower_is_not_a_straggler_however_long():
    assert find(series(1.15, 3600), LIMITS) == []
    assert find(series(1.15, 3600), Limits(threshold=0.1, window_s=300.0))  # a lower bar: named


def test_a_brief_spike_is_not_a_straggler():
    spike = series(2.0, 120) + series(1.0, 600, start=1130.0)[1:]  # 2x for 2 min, then normal
    assert find(spike, LIMITS) == []


def test_the_streak_restarts_after_a_normal_sample():
    samples = series(1.3, 200) + series(1.0, 0, start=1210.0) + series(1.3, 250, start=1220.0)
    assert find(samples, LIMITS) == []  # 200 s, a dip, then 250 s: never 300 s in a row
    samples += series(1.3, 60, start=1480.0)[1:]
    (found,) = find(samples, LIMITS)
    assert found.since == 1220.0 and found.seconds == 320.0


def test_a_node_missing_from_a_sample_ends_its_streak():
    samples = series(1.5, 200)
    samples.append(Sample(1210.0, {"n1": 1.0, "n2": 1.0}))  # n3 had no compute time yet
    samples += series(1.5, 200, start=1220.0)
    assert find(samples, LIMITS) == []


def test_two_nodes_and_several_stragglers_slowest_first():
    two = [Sample(float(t), {"a": 1.0, "b": 1.3}) for t in range(0, 301, 30)]
    assert [s.node for s in find(two, LIMITS)] == ["b"]
    many = [
        Sample(float(t), {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.4, "e": 2.0})
        for t in range(0, 301, 30)
    ]
    assert [s.node for s in find(many, LIMITS)] == ["e", "d"]
    assert find([], LIMITS) == []
