"""The quarantine list: a node blamed twice within the window stays out."""

from __future__ import annotations

import json

import pytest

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_train.contract import StartFiles
from hpc_train.faults import quarantine, suspects
from hpc_train.faults.suspects import Evidence
from tests.hpc_train.faults.blaming import blame

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
    (entry,) = suspects.quarantined(events)
    assert entry.node == "n1" and entry.since == 1_000_000 + 5 * HOUR
    assert entry.reasons == ("hang: rank 3 gave no stack", "crash: CUDA error")
    assert [e.node for e in suspects.quarantined(events, window_s=48 * HOUR)] == ["n1", "n3"]


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
    entries = suspects.quarantined([blamed("n1", 0), blamed("n1", 1)])
    assert quarantine.drain_reason("n1", "hang", entries).startswith(
        "hpc-train: quarantined, blamed 2x within 24 h: hang"
    )
    assert quarantine.drain_reason("n2", "hang", entries) == "hpc-train: hang"
    assert len(quarantine.drain_reason("n1", "x" * 500, entries)) == 200


def on(machine: str, event: ledger.Event) -> ledger.Event:
    return ledger.Event(event.kind, event.time, event.job, event.restart,
                        {**event.data, "machine": machine})  # fmt: skip


def test_blames_count_against_the_machine_not_the_name():
    """Seen in a soak (2026-11-26): n2 blamed for a crash, replaced, its new machine blamed as
    the lost node, and the name quarantined for two machines' faults. Now two machines under
    one name are two bad days; the same machine twice is quarantined, with its address."""
    replaced = [on("10.0.1.5", blamed("n2", 0)), on("10.0.1.9", blamed("n2", 1))]
    assert suspects.quarantined(replaced) == []
    (entry,) = suspects.quarantined([*replaced, on("10.0.1.9", blamed("n2", 2, "crash"))])
    assert (entry.node, entry.machine, entry.reasons) == ("n2", "10.0.1.9", ("hang", "crash"))
    unknown = [blamed("n3", 0), blamed("n3", 1)]  # older ledgers: no machine, held by name
    assert [(e.node, e.machine) for e in suspects.quarantined(unknown)] == [("n3", "")]


def test_a_quarantined_name_is_held_only_while_its_machine_is_the_quarantined_one(tmp_path):
    """The list asks Slurm for each node's machine now (a stand-in answers here): the same
    machine is held, a replacement is not, one Slurm cannot tell of is held (the strict side),
    and an entry of no known machine holds the name without asking."""
    from hpc_core import slurm

    run = RunDir(tmp_path)
    for at in (0, 1):
        ledger.record(run.ledger, "blamed", "7", at, node="n2", why="hang", machine="10.0.1.5")
        ledger.record(run.ledger, "blamed", "7", at, node="n4", why="hang")
    quarantine.update(run)
    assert json.loads(run.quarantine.read_text())[0]["machine"] == "10.0.1.5"
    now = {"n2": "10.0.1.5"}

    def machine_now(node: str) -> str:
        assert node != "n4", "an entry held by name needs no question"
        if node not in now:
            raise slurm.SlurmError("Node n2 not found")
        return now[node]

    assert quarantine.nodes(run, machine_now) == ["n2", "n4"]
    now["n2"] = "10.0.1.77"  # clustermgtd launched another instance under the name
    assert quarantine.nodes(run, machine_now) == ["n4"]
    del now["n2"]
    assert quarantine.nodes(run, machine_now) == ["n2", "n4"]


def test_the_machine_is_the_nodes_address_with_its_instance_where_slurm_has_one():
    from hpc_core import slurm

    assert slurm.machine({"NodeName": "q-st-p4d-1", "NodeAddr": "10.0.1.5"}) == "10.0.1.5"
    with_id = {"NodeAddr": "10.0.1.5", "InstanceId": "i-0abc"}
    assert slurm.machine(with_id) == "10.0.1.5 i-0abc"
    assert slurm.machine({"NodeAddr": "10.0.1.5", "InstanceId": "(null)"}) == "10.0.1.5"


@pytest.mark.slurm
def test_a_node_given_a_new_address_is_a_new_machine_to_the_quarantine(slurm_cluster, tmp_path):
    """Real Slurm: two blames recorded with the machine Slurm reports quarantine n3; the same
    name given another NodeAddr (what clustermgtd does for a new instance; the local slurmd
    answers on any loopback address) is not held, and is again once the address is back."""
    from hpc_core import slurm

    run, said = RunDir(tmp_path), []

    def note(kind: str, **data: object) -> None:
        ledger.record(run.ledger, kind, "9", 0, **data)

    for why, evidence in (("hang", Evidence.HANG_NO_STACK), ("crash", Evidence.SIGNAL)):
        blame(StartFiles(run, "9", 0), "n3", why, False, note, said.append, evidence)
    assert "quarantined: machine 127.0.0.1" in said[1]
    assert quarantine.nodes(run) == ["n3"]
    try:
        slurm.run(["scontrol", "update", "nodename=n3", "nodeaddr=127.0.0.23"])
        assert slurm.node_machine("n3") == "127.0.0.23"
        assert quarantine.nodes(run) == []
    finally:
        slurm.run(["scontrol", "update", "nodename=n3", "nodeaddr=127.0.0.1"])
    assert quarantine.nodes(run) == ["n3"]
