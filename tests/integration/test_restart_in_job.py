"""In-job restarts on the local Slurm (tiny preset, 2 emulated nodes, ``--restart-in-job``):
a killed node's ranks or a hang is recovered inside the same allocation on the healthy node:
no requeue (Slurm's Restarts stays 0), the blamed node drained, the run completes. A kill by a
signal is no evidence about the node (docs/faults.md, "Blame on evidence"): its first restarts
on the node, recorded and not drained; the second drains it."""

from __future__ import annotations

import contextlib
import re
import time

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train import chaos
from hpc_train.faults.suspects import Evidence
from hpc_train.planning import goodput

pytestmark = pytest.mark.slurm

PER_UPDATE = ("--log-interval", "1", "--save-interval-updates", "10")
PACE_S = 0.1  # chaos pace: at most 10 updates/s, so a run is sized in seconds (worker.pace)
IN_JOB = (
    "--restart-in-job", "--hang-timeout-floor", "10", "--hang-factor", "10",
    "--hang-save-timeout", "60", "--hang-startup-timeout", "180",
)  # fmt: skip


def _kill(job: str, node: str) -> None:
    chaos.kill_node(job, node, stop_slurmd=False)


def _first_kill_kept(runs, save, job: str, victim: str, rounds: list[list[str]]) -> None:
    """Kill ``victim``'s ranks once: blamed on a signal kill, not drained, the in-job restart
    keeps it (``rounds``: the round's training nodes, unchanged); training goes on."""
    count = len([e for e in ledger.read(RunDir(save).ledger) if e.kind == "first_update"])
    _kill(job, victim)

    def again() -> bool:
        events = ledger.read(RunDir(save).ledger)
        return len([e for e in events if e.kind == "first_update"]) > count

    runs.wait_for("training again after the first kill", again, 240)
    events = ledger.read(RunDir(save).ledger)
    (blamed,) = [e for e in events if e.kind == "blamed"]
    assert (blamed.get("node"), blamed.get("drained")) == (victim, False), blamed.data
    assert blamed.get("evidence") == str(Evidence.SIGNAL), blamed.data
    # the restart after this kill (not one after a start-up crash of an earlier round)
    after = [e for e in events if e.kind == "restarted" and e.time >= blamed.time]
    assert len(after) == 1, [e.data for e in after]  # one restart: the kill's, no other
    (restarted,) = after
    assert restarted.get("left_out") == [] and restarted.get("members") == rounds[0]
    assert "DRAIN" not in slurm.node_info(victim)["State"]
    assert victim in slurm.hostnames(slurm.job_state(job).nodes)
    runs.wait_for_update(save, runs.summary(save).updates + 10)


def _recovered_in_job(runs, name: str, interrupt, kills_first: bool = False) -> None:
    """``interrupt`` once (with ``kills_first``: after a first kill of the same node, kept)."""
    runs.wait_idle_nodes(2)
    # paced (<= 10 updates/s): the interrupt lands mid-run, and training outlasts the release of
    # the node left out (its task's end, then EXIT_GRACE_S): measured 27-32 s after update 1
    max_update = 450 if kills_first else 400
    job, save = runs.submit(name, max_update, nodes="1-2", fairseq=PER_UPDATE, extra_cli=IN_JOB,
                            pace_s=PACE_S)  # fmt: skip
    nodes = slurm.hostnames(runs.wait_running(job).nodes)
    assert len(nodes) == 2, nodes
    runs.wait_for_update(save, 25)
    victim = nodes[-1]
    try:
        if kills_first:
            _first_kill_kept(runs, save, job, victim, [nodes])
        hit = time.monotonic()
        interrupt(job, victim)
        released = _released(runs, save, job, victim)
        final = runs.wait_done(job)
        took = time.monotonic() - hit
        info = slurm.node_info(victim)
    finally:
        runs.give_back(victim)
    assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
    assert final.restarts == 0  # never requeued: the allocation was kept
    events = ledger.read(RunDir(save).ledger)
    restarted = [e for e in events if e.kind == "restarted"][-1]  # the one that drained it
    assert restarted.get("left_out") == [victim] and restarted.get("members") == [nodes[0]]
    assert [e.get("drained") for e in events if e.kind == "blamed"][-1] is True
    assert not [e for e in events if e.kind == "requeued"]
    # each stop said as what followed it: an in-job round, restart n of --max-restarts (m)
    whys = [str(e.get("why")) for e in events if e.kind == "stopped"]
    assert [re.sub(r"/\d+$", "", w).rsplit(": ", 1)[-1] for w in whys] == [
        f"in-job round {n}" for n in range(1, len(whys) + 1)
    ] and len(whys) == (2 if kills_first else 1), whys
    assert "DRAIN" in info["State"] and info["Reason"].startswith("hpc-train: "), info
    assert released < [e for e in events if e.kind == "finished"][-1].time
    starts = [e for e in events if e.kind == "started"]
    rounds = [nodes, nodes, [nodes[0]]] if kills_first else [nodes, [nodes[0]]]
    assert [s.get("nodes") for s in starts] == rounds
    assert all(s.get("previous", "").startswith("in-job restart after ") for s in starts[1:])
    summary = runs.summary(save)
    assert summary.updates == max_update and summary.resumed_at[0] >= 20
    g = goodput.account(events, events[-1].time)
    assert sum(g.parts.values()) == pytest.approx(g.wall_s) and g.restarts == len(rounds) - 1
    assert g.in_job_restart_s > 0  # the hand-over inside the allocation, not queue
    assert took < 240, took


def _released(runs, save: str, job: str, victim: str) -> float:
    """Wait for task 0 to give ``victim`` (left out, drained) back while the job trains on:
    out of the job's nodes, drained and holding no job (what clustermgtd replaces). Returns
    the ledger's time of it."""

    def event():
        found = [e for e in ledger.read(RunDir(save).ledger) if e.kind == "released"]
        return found[-1] if found else None

    said = runs.wait_for(f"{victim} released from job {job}", event, 180)
    assert said.get("node") == victim
    state = slurm.job_state(job)
    assert state.state == "RUNNING" and victim not in slurm.hostnames(state.nodes), state
    node = slurm.node_info(victim)["State"]
    assert "DRAIN" in node and "ALLOC" not in node and "MIX" not in node, node
    return said.time


def test_a_killed_nodes_ranks_are_recovered_in_the_allocation(runs):
    """Killed twice on the same node: the first restarts on it (not drained), the second (its
    machine's second blame) drains it and the run goes on without it."""
    _recovered_in_job(runs, "injob-kill", _kill, kills_first=True)


def test_a_hang_is_recovered_in_the_allocation(runs):
    _recovered_in_job(runs, "injob-hang", lambda job, node: chaos.hang(job, node))


def test_a_hot_spare_takes_a_killed_nodes_place_at_the_same_width(runs):
    """``--nodes 2 --spares 1``: three nodes allocated, two train. One training node's ranks
    are killed twice: the first kill restarts on it (not drained, the spare stands by); the
    second (its machine's second blame) drains it and task 0 restarts in the allocation on the
    healthy node and the spare: two nodes again, the same update_freq, Slurm's Restarts 0."""
    runs.wait_idle_nodes(3)
    max_update = 450  # paced: training outlasts two kills and the release (measured 28 s in)
    job, save = runs.submit("injob-spare", max_update, nodes="2", fairseq=PER_UPDATE,
                            extra_cli=("--spares", "1", *IN_JOB[1:]), pace_s=PACE_S)  # fmt: skip
    nodes = slurm.hostnames(runs.wait_running(job).nodes)
    assert len(nodes) == 3, nodes
    runs.wait_for_update(save, 25)
    trained = next(e for e in ledger.read(RunDir(save).ledger) if e.kind == "started")
    assert trained.get("nodes") == nodes[:2] and trained.get("spares") == nodes[2:]
    victim = nodes[1]
    try:
        _first_kill_kept(runs, save, job, victim, [nodes[:2]])
        _kill(job, victim)
        _released(runs, save, job, victim)
        final = runs.wait_done(job)
        info = slurm.node_info(victim)
    finally:
        runs.give_back(victim)
    assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
    assert final.restarts == 0
    events = ledger.read(RunDir(save).ledger)
    kept, restarted = [e for e in events if e.kind == "restarted"]
    assert kept.get("left_out") == [] and kept.get("spare_in") == []
    assert restarted.get("left_out") == [victim] and restarted.get("spare_in") == [nodes[2]]
    assert "DRAIN" in info["State"], info
    starts = [e for e in events if e.kind == "started"]
    assert [s.get("nodes") for s in starts] == [nodes[:2], nodes[:2], [nodes[0], nodes[2]]]
    shapes = [(s.get("world"), s.get("update_freq")) for s in starts]
    assert len(set(shapes)) == 1 and shapes[0][0] == 2, shapes  # the recipe's batch, unchanged
    assert runs.summary(save).updates == max_update
    # the loss curve stays the recipe's: every update's loss (the resumed one where an update was
    # trained twice) equals that of the same run on two nodes never interrupted
    ref, ref_save = runs.submit("injob-spare-reference", max_update, nodes="2",
                                fairseq=PER_UPDATE)  # fmt: skip
    assert runs.wait_done(ref).state == "COMPLETED"
    resumed = dict(runs.summary(save).losses)
    assert resumed == dict(runs.summary(ref_save).losses) and len(resumed) == max_update


def test_a_lost_node_is_recovered_in_the_allocation(runs, restart_local_cluster):
    """A node lost whole (its ranks killed, then its slurmd: Slurm marks it DOWN after
    SlurmdTimeout): the job was submitted with --no-kill, so the allocation survives; task 0
    finds no step starts there and Slurm marks it not responding: a lost node, not a plain
    signal kill, drained at its first blame, and trains on without it. Slurm's Restarts 0, the
    run completes."""
    runs.wait_idle_nodes(2)
    max_update = 600  # paced: training goes on past SlurmdTimeout (20 s): the node DOWN mid-run
    job, save = runs.submit("injob-lost", max_update, nodes="1-2", fairseq=PER_UPDATE,
                            extra_cli=IN_JOB, pace_s=PACE_S)  # fmt: skip
    nodes = slurm.hostnames(runs.wait_running(job).nodes)
    assert len(nodes) == 2, nodes
    runs.wait_for_update(save, 25)
    victim = nodes[-1]
    try:
        chaos.kill_node(job, victim, stop_slurmd=True)
        runs.wait_for("the node DOWN", lambda: "DOWN" in slurm.node_info(victim)["State"], 120)
        assert slurm.job_state(job).state == "RUNNING", runs.explain(save, job)  # not NODE_FAIL
        final = runs.wait_done(job, timeout=900)
    finally:
        restart_local_cluster()
        with contextlib.suppress(slurm.SlurmError):
            slurm.resume(victim)  # drained by the blame: back for the next tests
    assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
    assert final.restarts == 0  # the allocation was kept
    events = ledger.read(RunDir(save).ledger)
    (restarted,) = [e for e in events if e.kind == "restarted"]
    assert restarted.get("left_out") == [victim] and restarted.get("members") == [nodes[0]]
    (blamed,) = [e for e in events if e.kind == "blamed"]
    assert blamed.get("evidence") == str(Evidence.LOST) and blamed.get("drained") is True
    assert not [e for e in events if e.kind == "requeued"]
    assert runs.summary(save).updates == max_update
