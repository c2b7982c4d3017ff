"""bench-grow's arithmetic on a ledger the test writes (the benchmark itself is not a test)."""

from __future__ import annotations

import pytest

from benchmarks import grow
from hpc_core.ledger import Event


def ev(kind: str, t: float, **data) -> Event:
    return Event(kind, t, "7", 0, data)


# one node from 0 (first update at 5, 300 updates by 35, grown), 3 nodes from 45 to 105
LEDGER = [
    ev("started", 0, nodes=["n4"], resume_at=0),
    ev("first_update", 5),
    ev("grown", 34, **{"from": 1, "to": 3}),
    ev("stopped", 35, cause="grow", reached=300),
    ev("started", 45, nodes=["n1", "n2", "n3"], resume_at=300),
    ev("first_update", 50),
    ev("finished", 105, reached=600),
]


def test_segments_rates_and_node_seconds_by_hand():
    segs = grow.segments(LEDGER)
    assert [(s["nodes"], s["resume_at"], s["reached"]) for s in segs] == [(1, 0, 300),
                                                                          (3, 300, 600)]  # fmt: skip
    assert grow.rate(segs[0]) == pytest.approx(300 / 30)
    assert grow.rate(segs[1]) == pytest.approx(300 / 55)
    assert grow.used_node_s(segs) == 1 * 35 + 3 * 60
    # the blocker freed its nodes at 30: 1 node open until then, 3 after, until 105
    assert grow.open_node_s(0, 30, 105, 3) == 30 + 3 * 75
