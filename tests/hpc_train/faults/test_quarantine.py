"""The quarantine list: a node blamed twice within the window stays out."""

from __future__ import annotations

import json

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_train.faults import quarantine

HOUR = 3600.0


def blamed(node: str, at_h: float, why: str = "hang") -> ledger.Event:
    return ledger.Event("blamed", 1_000_000 + at_h * HOUR, "7", 0, {"node": node, "why": why})


def test_twice_within_the_window_is_quarantined_once_or_far_apart_is_not():
    events = [
        blamed("n1", 0, "hang: rank 3 gave no stack"),
        blamed("n2", 1),
        blamed("n1", 5, "crash: CUDA error"),
        blamed("n3", 0),
        blamed("n3", 30),  # 30 h apart: two bad days, not one bad node
        ledger.Event("started", 1_000_000, "7", 1, {"node": "n2"}),  # not a blame
    ]
    (entry,) = quarantine.decide(events)
    assert entry.node == "n1" and entry.since == 1_000_000 + 5 * HOUR
    assert entry.reasons == ("hang: rank 3 gave no stack", "crash: CUDA error")
    assert [e.node for e in quarantine.decide(events, window_s=48 * HOUR)] == ["n1", "n3"]


def test_the_list_in_the_save_dir_follows_the_ledger(tmp_path):
    run = RunDir(tmp_path)
    assert quarantine.nodes(run) == []  # no list yet
    ledger.record(run.ledger, "blamed", "7", 0, node="n2", why="hang")
    assert quarantine.update(run) == [] and quarantine.nodes(run) == []
    ledger.record(run.ledger, "blamed", "7", 1, node="n2", why="start refused: 0 GPUs")
    assert [e.node for e in quarantine.update(run)] == ["n2"]
    assert quarantine.nodes(run) == ["n2"]
    listed = json.loads(run.quarantine.read_text())
    assert listed[0]["reasons"] == ["hang", "start refused: 0 GPUs"]
    run.quarantine.write_text("{not json")
    assert quarantine.nodes(run) == []  # an unreadable list keeps nobody out, and says nothing


def test_the_drain_reason_says_quarantined_only_for_a_quarantined_node():
    entries = quarantine.decide([blamed("n1", 0), blamed("n1", 1)])
    assert quarantine.drain_reason("n1", "hang", entries).startswith(
        "hpc-train: quarantined, blamed 2x within 24 h: hang"
    )
    assert quarantine.drain_reason("n2", "hang", entries) == "hpc-train: hang"
    assert len(quarantine.drain_reason("n1", "x" * 500, entries)) == 200
