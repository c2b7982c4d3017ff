"""The arithmetic and the runs' arguments of the checkpoint-cost benchmark (pure; nothing timed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import checkpoint_cost as bench


def test_span_is_between_two_updates_steps_returning():
    returns = {1: 10.0, 2: 11.0, 3: 15.5, 4: 16.5}
    assert bench.span_seconds(returns, 1, 3) == pytest.approx(5.5)
    with pytest.raises(bench.BenchError):
        bench.span_seconds(returns, 1, 9)


def test_per_100_updates_overhead_and_saves_in_span():
    assert bench.per_100(30.0, 20) == pytest.approx(150.0)
    assert bench.overhead(190.0, 150.0) == pytest.approx(40.0)
    assert bench.overhead(149.0, 150.0) == 0.0  # noise never makes saves a gain
    assert bench.saves_in_span(8, 1, 33) == [8, 16, 24, 32]


def test_only_the_none_run_skips_saves_and_every_run_saves_at_the_same_interval():
    args = {m: bench.train_args(Path("/d"), Path("/s"), 34, 8, m) for m in bench.MODES}
    assert "--no-save" in args["none"] and "--no-save" not in args["sync"]
    assert args["sync"] == args["async"]  # the mode travels in the environment, not the flags
    last = max(i for i, a in enumerate(args["sync"]) if a == "--save-interval-updates")
    assert args["sync"][last + 1] == "8"
    assert "roberta_base" in args["sync"]
