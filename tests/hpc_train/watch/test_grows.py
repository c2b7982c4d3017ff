"""Grow-back: the pure verdicts (``watch.grows``) and one poll of task 0's thread with a fake
Slurm (``sinfo`` and ``sbatch --test-only`` stand-ins: no Slurm here). Milliseconds."""

from __future__ import annotations

import pytest

from hpc_train.watch import grow_monitor, grows


def test_only_idle_usable_nodes_not_ours_and_not_excluded_are_candidates():
    states = {"n1": "allocated", "n2": "idle", "n3": "idle~", "n4": "drained", "n5": "idle"}
    assert grows.idle_candidates(states, mine=["n1"], excluded={"n5"}) == ["n2", "n3"]
    assert grows.grow_target(1, 3, ["n2", "n3", "n5"]) == 3  # never past MAX


def test_candidates_must_stay_idle_for_the_settle_window():
    settle = grows.Settle(60)
    assert not settle.ready(["n2"], now=100)
    assert not settle.ready(["n2"], now=150)
    assert not settle.ready([], now=155)  # taken meanwhile: the window starts again
    assert not settle.ready(["n2"], now=160) and settle.ready(["n2"], now=220)


def test_no_grow_in_the_last_minutes_before_the_time_limit():
    assert grows.time_to_grow(None, now=0)
    assert grows.time_to_grow(10_000, now=0) and not grows.time_to_grow(250, now=0)


class FakeSlurm:
    """sinfo of the partition and sbatch --test-only's estimate (None: never)."""

    SlurmError = grow_monitor.slurm.SlurmError

    def __init__(self, states: dict[str, str], starts_in: float | None) -> None:
        self.states, self.starts_in, self.asked = states, starts_in, []

    def partition_nodes(self, partition):
        return dict(self.states)

    def start_estimate(self, args):
        self.asked.append(list(args))
        return None if self.starts_in is None else 1000 + self.starts_in


@pytest.mark.parametrize(("starts_in", "grows_to"), [(0, 3), (3600, None), (None, None)])
def test_a_grow_is_asked_for_only_when_slurm_would_start_it_now(monkeypatch, starts_in, grows_to):
    fake = FakeSlurm({"n1": "allocated", "n2": "idle", "n3": "idle", "n4": "drained"}, starts_in)
    monkeypatch.setattr(grow_monitor, "slurm", fake)
    asked: list[tuple[int, str]] = []
    watch = grow_monitor.GrowWatch("low", ["n1"], 3, 60, lambda: {"n4"}, None,
                                   lambda n, why: asked.append((n, why)), print)  # fmt: skip
    assert not watch.poll(now=940)  # idle, not for long enough yet
    assert watch.poll(now=1000) is (grows_to is not None)
    assert fake.asked == [["-N", "2", "-p", "low", "--exclude=n1,n4"]]
    assert [n for n, _ in asked] == ([grows_to] if grows_to else [])
    if grows_to:
        assert "n2, n3 idle for 60 s and Slurm would start 2 more node(s) now" in asked[0][1]
