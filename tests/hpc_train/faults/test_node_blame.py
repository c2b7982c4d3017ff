"""Blaming a node after a crash or a node failure: whom the policy blames on the evidence read
once, and the drain and the quarantine that follow through the one ``Blamer`` (a fake Slurm
records drains: no Slurm in this tier; tests/integration has the real runs)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train.contract import Cause, StartFiles
from hpc_train.faults import end_evidence, failures, quarantine
from hpc_train.faults.end_evidence import Ended, Ending, SlurmWord, Where
from hpc_train.faults.failures import Failure, NodeExit
from hpc_train.faults.suspects import Blame, Evidence
from hpc_train.job.limits import Watch
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Training
from hpc_train.launch import launcher, recovery
from hpc_train.launch.context import Here
from hpc_train.launch.restart_policy import EndOptions
from hpc_train.launch.transition import InJobRound, Proceed, Requeue
from hpc_train.testing import end_case
from tests.hpc_train.faults.blaming import blame

GLOO_PEER = ("DistBackendError", "[gloo] Connection closed by peer [10.0.0.2]:5")
HOSTS = ("n1", "n2")


def failure(rank: int, kind: tuple[str, str], update: int = 40) -> Failure:
    return Failure(rank, update, *kind)


def test_blamed_twice_the_node_is_quarantined_and_its_drain_reason_says_so(tmp_path, fake_slurm):
    run, notes = RunDir(tmp_path), []

    def note(kind: str, **data: object) -> None:
        notes.append(data)
        ledger.record(run.ledger, kind, "9", len(notes), **data)

    said: list[str] = []
    blame(StartFiles(run, "9", 0), "n2", "hang in job 9: x", True, note, said.append,
                     Evidence.HANG_NO_STACK)  # fmt: skip
    blame(StartFiles(run, "9", 1), "n2", "crash in job 9: y", True, note, said.append,
                     Evidence.OWN_ERROR)  # its machine's second blame: drained  # fmt: skip
    blame(StartFiles(run, "9", 2), "n3", "z", False, note, said.append, Evidence.HARDWARE)
    first, second = fake_slurm.drained
    assert first == ("n2", "hpc-train: hang in job 9: x")
    assert second[1].startswith("hpc-train: quarantined, blamed 2x within 24 h: crash in job 9")
    assert [n["drained"] for n in notes] == [True, True, False]  # n3: --no-drain
    assert (
        quarantine.nodes(run) == ["n2"]
        and "quarantined" in said[1]
        and "quarantined" not in said[2]
    )


def test_a_name_blamed_on_two_machines_is_not_quarantined(tmp_path, fake_slurm):
    """Where clustermgtd replaces a drained node, the name's next machine has another address:
    a blame of each is one blame of each machine (``hpc_core.slurm.machine``), recorded in the
    ledger; the drain reason and the log do not say quarantined."""
    run, said = RunDir(tmp_path), []

    def note(kind: str, **data: object) -> None:
        ledger.record(run.ledger, kind, "9", 0, **data)

    fake_slurm.nodes["n2"] = {"State": "ALLOCATED", "NodeAddr": "10.0.1.5"}
    blame(StartFiles(run, "9", 0), "n2", "crash", True, note, said.append, Evidence.HARDWARE)
    fake_slurm.nodes["n2"] = {"State": "ALLOCATED", "NodeAddr": "10.0.1.9"}  # replaced
    blame(StartFiles(run, "9", 1), "n2", "lost", True, note, said.append, Evidence.LOST)
    assert [d[1] for d in fake_slurm.drained] == ["hpc-train: crash", "hpc-train: lost"]
    assert quarantine.nodes(run) == [] and "quarantined" not in said[1]
    assert [e.get("machine") for e in ledger.read(run.ledger)] == ["10.0.1.5", "10.0.1.9"]
    blame(StartFiles(run, "9", 2), "n2", "hang", True, note, said.append,
                     Evidence.HANG_NO_STACK)  # the new one again  # fmt: skip
    assert "quarantined: machine 10.0.1.9" in said[2] and quarantine.nodes(run) == ["n2"]


def _noting(run: RunDir) -> Callable[..., None]:
    """The launcher's ``note``: a ledger event of job 9."""

    def note(kind: str, **data: object) -> None:
        ledger.record(run.ledger, kind, "9", 0, **data)

    return note


def test_task_0_names_a_hangs_suspect_from_the_watchers_reports_and_blames_it(
    tmp_path, fake_slurm, monkeypatch
):
    """The watchers only report (each node's ranks, whether each gave a stack: the hang
    monitor's ``node-<node>.json``); task 0 reads them with the end's evidence, its policy names
    the suspect (``suspects.hang_suspect``) and the executor records it in ``suspect.json`` and
    blames it on its evidence: one suspect type throughout."""
    from dataclasses import asdict

    from hpc_core.rundir import SUSPECT, incident_report
    from hpc_train.faults.suspects import RankReport, Suspect

    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    spec = JobSpec(Training("tiny", Path("/d"), tmp_path), sizing=Sizing(gpus_per_node=0))
    notes: list[tuple[str, dict[str, object]]] = []
    start = launcher.Start("9", 0, 2, "n1", 0, HOSTS, round=1)
    here = Here.of(spec, start, lambda k, **d: notes.append((k, d)))
    files = here.files
    for node, stack in (("n1", True), ("n2", False)):
        ranks = [asdict(RankReport(int(node[1]), node, 5, 1.0, stack))]
        report = incident_report(files.incident, node)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps({"node": node, "why": "no update", "ranks": ranks}))
    ev = end_evidence.at_exit(here.where(), Ended(-9, False, hang="no update"), (), 100)
    t = recovery.what_follows(ev, here.options)
    ((found, leave),) = [(b, b.leaves) for b in t.blames]
    assert t.hang is not None and isinstance(t.hang.suspect, Suspect)
    assert (found.node, found.rank) == ("n2", 2) and leave
    assert found.evidence is Evidence.HANG_NO_STACK
    assert t.said[0].startswith("hang: suspect n2")
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        recovery.carry_out(here, t, ev)
    assert json.loads((files.incident / SUSPECT).read_text())["suspect"]["node"] == "n2"
    ((kind, data),) = [(k, d) for k, d in notes if k == "blamed"]
    assert kind == "blamed" and data["node"] == "n2" and data["rank"] == 2
    assert data["why"].startswith("hang in job 9.1: rank 2 on n2 gave no Python stack")
    assert fake_slurm.drained[0][0] == "n2"


def test_blame_is_decided_once_and_recorded_through_one_blamer_with_one_suspect_type():
    """Whom to blame is decided in one place (the policy: ``restart_policy.blame_of`` builds
    every ``Blame``), recorded in one (``faults.node_blame.Blamer``, built only by ``Here``: no
    watcher builds its own), and a suspect has one class: ``faults.suspects.Suspect``."""
    import ast

    import hpc_train

    built: dict[str, list[str]] = {"Blame": [], "Blamer": []}
    classes = []
    for path in sorted(Path(hpc_train.__file__).parent.rglob("*.py")):
        where = f"{path.parent.name}/{path.stem}"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if name in built:
                    built[name].append(where)
            if isinstance(node, ast.ClassDef) and node.name in ("Suspect", "Blame", "Blamer"):
                classes.append(f"{where}.{node.name}")
    assert set(built["Blame"]) == {"launch/restart_policy"}
    assert set(built["Blamer"]) == {"launch/context"}
    assert sorted(classes) == [
        "faults/node_blame.Blamer", "faults/suspects.Blame", "faults/suspects.Suspect"
    ]  # fmt: skip


def test_a_first_kill_by_a_signal_is_recorded_not_drained_the_second_drains(tmp_path, fake_slurm):
    """The soak's case (issue 30): a rank killed once with SIGKILL, no evidence about its node,
    drained nothing; the same machine killed again is drained (and quarantined). The fake Slurm
    records drains (no Slurm in this tier) and answers the node's NodeAddr (its machine)."""
    run, said = RunDir(tmp_path), []
    note = _noting(run)
    fake_slurm.nodes["n2"] = {"State": "ALLOCATED", "NodeAddr": "10.0.1.5"}
    why = "crash in job 9: rank 1 on n2 was killed (SIGKILL)"
    first = blame(StartFiles(run, "9", 0), "n2", why, True, note, said.append, Evidence.SIGNAL)
    assert not first.drain and fake_slurm.drained == []
    (event,) = ledger.read(run.ledger)
    assert event.kind == "blamed" and event.get("drained") is False
    assert event.get("evidence") == str(Evidence.SIGNAL) and event.get("machine") == "10.0.1.5"
    assert event.get("verdict", "").startswith("not drained: a kill by a signal is no evidence")
    assert "not drained" in said[0] and quarantine.nodes(run) == []
    why = "crash in job 9: torchrun on n2 was killed (SIGKILL)"
    second = blame(StartFiles(run, "9", 1), "n2", why, True, note, said.append, Evidence.SIGNAL)
    assert second.drain
    ((node, reason),) = fake_slurm.drained
    assert node == "n2" and reason.startswith("hpc-train: quarantined, blamed 2x within 24 h")
    last = ledger.read(run.ledger)[-1]
    assert last.get("drained") is True and "blamed 1x before" in last.get("verdict", "")
    assert "quarantined: machine 10.0.1.5" in said[1] and quarantine.nodes(run) == ["n2"]


def test_a_replaced_machine_under_the_same_name_starts_fresh(tmp_path, fake_slurm):
    """clustermgtd's replacement has a new NodeAddr: its first kill drains nothing, although
    the name's old machine was killed (and drained) before."""
    run, said = RunDir(tmp_path), []
    note = _noting(run)
    fake_slurm.nodes["n2"] = {"State": "ALLOCATED", "NodeAddr": "10.0.1.5"}
    for restart in (0, 1):
        blame(StartFiles(run, "9", restart), "n2", "kill", True, note, said.append, Evidence.SIGNAL)
    assert [n for n, _ in fake_slurm.drained] == ["n2"]  # the old machine's second
    fake_slurm.nodes["n2"] = {"State": "IDLE", "NodeAddr": "10.0.1.9"}  # replaced
    fresh = blame(StartFiles(run, "9", 2), "n2", "kill", True, note, said.append, Evidence.SIGNAL)
    assert not fresh.drain and [n for n, _ in fake_slurm.drained] == ["n2"]
    assert quarantine.nodes(run) == []  # the old machine's quarantine holds not the new one
    assert [e.get("drained") for e in ledger.read(run.ledger)] == [False, True, False]


@pytest.mark.parametrize(
    "found", [Evidence.HARDWARE, Evidence.HEALTH_CHECK, Evidence.LOST, Evidence.HANG_NO_STACK]
)
def test_evidence_about_the_node_drains_it_at_the_first_blame(tmp_path, fake_slurm, found):
    run, said = RunDir(tmp_path), []
    note = _noting(run)
    verdict = blame(StartFiles(run, "9", 0), "n2", "x", True, note, said.append, found)
    assert verdict.drain and [n for n, _ in fake_slurm.drained] == ["n2"]
    (event,) = ledger.read(run.ledger)
    assert event.get("drained") is True and event.get("evidence") == str(found)
    assert f"drained: {found} is evidence about the node itself" in said[0]


def test_no_drain_leaves_the_node_out_but_drains_nothing(tmp_path, fake_slurm):
    run, said = RunDir(tmp_path), []
    note = _noting(run)
    verdict = blame(StartFiles(run, "9", 0), "n2", "x", False, note, said.append, Evidence.LOST)
    assert verdict.drain and fake_slurm.drained == []  # the caller still leaves it out
    assert "--no-drain: left out, not drained" in said[0]


def test_a_node_slurm_lost_is_named_with_its_state(tmp_path, monkeypatch):
    """Task 0 after a start Slurm ended by itself: of its nodes, those Slurm reports lost
    (down, failed, not responding), with state and reason; one it cannot read is said."""
    states = {
        "n1": {"State": "ALLOCATED"},
        "n2": {"State": "DOWN+NOT_RESPONDING", "Reason": "Not responding"},
        "n3": {"State": "IDLE+DRAIN"},
    }

    class Nodes:  # a fake Slurm that answers node records only (no Slurm in this tier)
        SlurmError = end_evidence.slurm.SlurmError
        SlurmUnreachable = end_evidence.slurm.SlurmUnreachable
        machine = staticmethod(end_evidence.slurm.machine)

        @staticmethod
        def node_info(node: str) -> dict[str, str]:
            if node == "n4":
                raise Nodes.SlurmError("Invalid node name")
            return states[node]

    monkeypatch.setattr(end_evidence, "slurm", Nodes)
    where = Where(StartFiles(RunDir(tmp_path), "41", 1), 0, ("n1",), 1)
    ev = end_evidence.at_start(Ending.UNRECORDED, where, nodes=("n1", "n2", "n3", "n4"),
                               detail="no save on notice")  # fmt: skip
    opt = EndOptions(100, 3, False, 1, True, "no", None)
    t = recovery.what_follows(ev, opt)
    assert isinstance(t, Proceed)
    assert [(b.node, b.evidence) for b in t.blames] == [("n2", Evidence.LOST)]
    assert (
        t.why == "node failure (n2 DOWN+NOT_RESPONDING (Not responding)): last periodic checkpoint"
    )
    assert t.said[:-1] == ("cannot read node n4 (Invalid node name)",)
    assert t.said[-1].startswith("weighed: Proceed in ")  # the executor's loop says it last


def test_crash_evidence_is_every_nodes_exit_record_and_the_reports(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    failures.write(run, "9", 0, failure(0, GLOO_PEER))
    failures.write_exit(StartFiles(run, "9", 0), NodeExit(0, "n1", 1, 0, 1))
    monkeypatch.setattr(end_evidence, "EVIDENCE_WAIT_S", 0.3)  # n2 never writes its record
    where = Where(StartFiles(run, "9", 0), 0, HOSTS, 2, node="n1")
    ev = end_evidence.at_exit(where, Ended(1, False), (), 100)  # returns after the wait
    assert [f.rank for f in ev.failures] == [0] and [e.node for e in ev.exits] == ["n1"]


class CrashingRank(launcher.Launcher):
    """torchrun replaced by one rank on n1 that beats at update 7, reports a CUDA error (as a
    worker's crash handler does) and exits 1."""

    def torchrun_command(self, start, nproc, args):
        body = (
            "import os; from pathlib import Path; from hpc_train.worker.heartbeat import Heartbeat\n"
            "from hpc_core.rundir import RunDir; from hpc_train.faults import failures\n"
            "hb = Heartbeat(Path(os.environ['HPC_TRAIN_HEARTBEAT_DIR']), 0); hb.completed(7)\n"
            f"run = RunDir(Path({str(self.spec.training.save_dir)!r}))\n"
            "failures.write(run, '41', 0, failures.Failure(0, 7, 'RuntimeError', "
            "'CUDA error: uncorrectable ECC error encountered'))\n"
            "raise SystemExit(1)\n"
        )
        return [sys.executable, "-c", body]


def test_task_0_blames_the_node_of_a_machine_error_drains_and_excludes_it(
    tmp_path, fake_slurm, monkeypatch
):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    spec = JobSpec(Training("tiny", Path("/d"), tmp_path), sizing=Sizing(gpus_per_node=0))
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        CrashingRank(spec).run(launcher.Start("41", 0, 1, "n1", 0, ("n1",)), gpus=0)
    assert fake_slurm.requeued == ["41"] and fake_slurm.excluded == [("41", ["n1"])]
    ((node, reason),) = fake_slurm.drained
    assert node == "n1" and reason.startswith("hpc-train: crash in job 41: rank 0 failed")
    events = ledger.read(RunDir(tmp_path).ledger)
    assert [e.get("cause") for e in events if e.kind == "stopped"] == ["infrastructure"]


class Trains(launcher.Launcher):
    """torchrun replaced by a process that exits 0 (training finished)."""

    def torchrun_command(self, start, nproc, args):
        return [sys.executable, "-c", "pass"]


def test_after_slurm_requeued_by_itself_task_0_blames_the_node_it_lost(tmp_path, fake_slurm):
    """Start #1 on n1, n2 ended with no word (NODE_FAIL); start #2: n2 is DOWN."""
    run = RunDir(tmp_path)
    ledger.record(run.ledger, "started", "41", 0, nodes=["n1", "n2"])
    fake_slurm.nodes["n2"] = {"State": "DOWN+NOT_RESPONDING", "Reason": "Not responding"}
    spec = JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(gpus_per_node=0),
        watch=Watch(no_watchdog=True),
    )
    done = Trains(spec).run(launcher.Start("41", 0, 1, "n1", 1, ("n1",)), gpus=0)
    assert done["restarts"] == 1
    assert fake_slurm.drained == [
        ("n2", "hpc-train: node failure in job 41: DOWN+NOT_RESPONDING (Not responding)")
    ]
    events = ledger.read(run.ledger)
    (started,) = [e for e in events if e.kind == "started" and e.restart == 1]
    assert started.get("previous").startswith("node failure (n2 DOWN+NOT_RESPONDING")
    # the next start finds the end recorded (blamed): no second blame
    assert end_evidence.unrecorded_end(StartFiles(run, "41", 2), ledger.read(run.ledger)) == []


def test_a_last_in_job_round_slurm_ended_is_unrecorded_though_an_earlier_round_stopped(
    tmp_path,
):
    """Round 0 of start 1 stopped (a crash task 0 recorded) and the launcher restarted in the
    job on n1, n3; round 1 then ended with no word (NODE_FAIL): its nodes are the ones to look
    at, not nothing because round 0 had said how it ended."""
    from hpc_train.contract import StopMarker, write_stop

    run = RunDir(tmp_path)
    ledger.record(run.ledger, "started", "41", 1, nodes=["n1", "n2"])
    ledger.record(run.ledger, "stopped", "41", 1, cause="crash")
    ledger.record(run.ledger, "restarted", "41", 1, round=1, members=["n1", "n3"])
    ledger.record(run.ledger, "started", "41", 1, nodes=["n1", "n3"])
    events = ledger.read(run.ledger)
    assert end_evidence.unrecorded_end(StartFiles(run, "41", 2), events) == ["n1", "n3"]
    write_stop(run.stop_marker("41.1", 1), StopMarker(90, "SIGUSR2"))  # round 1 saved on notice
    assert end_evidence.unrecorded_end(StartFiles(run, "41", 2), ledger.read(run.ledger)) == []


class PeerWitness(launcher.Launcher):
    """torchrun replaced by rank 0 on n1, which beats at update 7, reports only that its peer
    went away (gloo: connection closed) and exits 1; n2's launcher (the test writes its records)
    says its rank was killed by SIGKILL."""

    def torchrun_command(self, start, nproc, args):
        body = (
            "import os; from pathlib import Path; from hpc_train.worker.heartbeat import Heartbeat\n"
            "from hpc_core.rundir import RunDir; from hpc_train.faults import failures\n"
            "hb = Heartbeat(Path(os.environ['HPC_TRAIN_HEARTBEAT_DIR']), 0); hb.completed(7)\n"
            f"run = RunDir(Path({str(self.spec.training.save_dir)!r}))\n"
            f"failures.write(run, '41', 0, failures.Failure(0, 7, *{GLOO_PEER!r}))\n"
            "raise SystemExit(1)\n"
        )
        return [sys.executable, "-c", body]


def test_a_killed_rank_is_the_restarts_cause_not_its_peers_lost_connection(
    tmp_path, fake_slurm, monkeypatch
):
    """The soak's case: a rank killed with SIGKILL showed as "infrastructure (... gloo ...
    Connection ... by peer)". The stop's cause is the crash, its error names the killed node."""
    from hpc_train.contract import NodeReport, write_node_report

    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    run = RunDir(tmp_path)
    write_node_report(run, "41", 0, NodeReport(1, "n2", 0))  # task 1 is up
    # its rank 2 got SIGKILL
    failures.write_exit(StartFiles(run, "41", 0), NodeExit(1, "n2", 1, 2, -9))
    spec = JobSpec(Training("tiny", Path("/d"), tmp_path), sizing=Sizing(gpus_per_node=0))
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        PeerWitness(spec).run(launcher.Start("41", 0, 2, "n1", 0, HOSTS), gpus=0)
    (stopped,) = [e for e in ledger.read(run.ledger) if e.kind == "stopped"]
    assert stopped.get("cause") == "crash"
    assert stopped.get("error") == "n2: rank 2 on n2 was killed (SIGKILL)"
    assert stopped.get("reached") == 7  # how far the start got, for the goodput


def test_task_0_requeues_a_first_signal_kill_without_draining_or_excluding_its_node(
    tmp_path, fake_slurm, monkeypatch
):
    """The same kill through the launcher: blamed (the ledger says on what, and why not
    drained), requeued, n2 neither drained nor excluded: the requeued job may run on it."""
    from hpc_train.contract import NodeReport, write_node_report

    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    run = RunDir(tmp_path)
    write_node_report(run, "41", 0, NodeReport(1, "n2", 0))
    failures.write_exit(StartFiles(run, "41", 0), NodeExit(1, "n2", 1, 2, -9))
    spec = JobSpec(Training("tiny", Path("/d"), tmp_path), sizing=Sizing(gpus_per_node=0))
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        PeerWitness(spec).run(launcher.Start("41", 0, 2, "n1", 0, HOSTS), gpus=0)
    assert fake_slurm.requeued == ["41"]
    assert fake_slurm.excluded == [] and fake_slurm.drained == []
    (blamed,) = [e for e in ledger.read(run.ledger) if e.kind == "blamed"]
    assert blamed.get("node") == "n2" and blamed.get("drained") is False
    assert blamed.get("evidence") == str(Evidence.SIGNAL)


# --- Slurm's silence is no answer (issue 46): a fake controller that answers none of the first
# look-ups, and a fake clock: the waits are counted, not slept. The policy decides a signal kill
# of n2 (the table's crash, in-job) with none of Slurm's word given: the executor's loop asks.
# The parts of one question are asked one after another here, in ``ask``'s order (node, step,
# job, config, partition), so that the fake's silences fall on the same look-ups at every run
# (they are asked at once otherwise: tests/hpc_train/faults/test_end_evidence.py).


def asked_in_order(monkeypatch) -> None:
    monkeypatch.setattr(end_evidence, "_at_once", lambda calls: {n: c() for n, c in calls.items()})


class Clock:
    """A clock that a sleep moves on: ``slept`` adds up what the executor's loop waited."""

    def __init__(self) -> None:
        self.now, self.slept = 1000.0, 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def signal_kill_decided(
    tmp_path, monkeypatch, clock: Clock, cpu=lambda: 0.0, read_cpu_s: float = 0.0
) -> tuple[Blame, list[str]]:
    """What the executor's loop decides for n2's signal kill, and what it said while asking
    (``cpu``: the CPU clock the loop reads, at its start and at the transition; ``read_cpu_s``:
    the evidence's own)."""
    said: list[str] = []
    monkeypatch.setattr(recovery, "log", said.append)
    asked_in_order(monkeypatch)
    case = end_case(tmp_path, Cause.CRASH, "in-job")
    ev = dataclasses.replace(case.evidence, slurm=SlurmWord(), read_cpu_s=read_cpu_s)
    found = recovery.what_follows(ev, case.options, sleep=clock.sleep, clock=clock, cpu=cpu)
    assert isinstance(found, InJobRound)
    (blame_n2,) = [b for b in found.blames if b.node == "n2"]
    return blame_n2, [*said, *found.said]


def test_a_silent_controller_is_asked_again_and_the_probe_made_once_it_answers(
    tmp_path, monkeypatch, fake_slurm
):
    """The kill came while slurmctld was stopped: the node's state and the step probe get no
    answer. Before issue 46, the probe's silence read as "no step starts" and SlurmdTimeout's
    as its 300 s default, and the wait never probed again: 236-255 s after slurmctld was back.
    Now node and step are asked again with back-off; once the controller answers the step
    starts, and the signal kill stands at once: no wait for Slurm's word at all."""
    fake_slurm.silent = 8  # node and step (with the job's state), then again three times
    clock = Clock()
    blamed, said = signal_kill_decided(tmp_path, monkeypatch, clock)
    assert blamed.evidence is Evidence.SIGNAL
    assert fake_slurm.asked == ["node n2", "step n2"] * 5  # probed once it answered
    assert "config" not in fake_slurm.asked  # no SlurmdTimeout needed: the step started
    assert clock.slept <= 4 * 5.0  # the polls while silent (LOST_POLL: 1 s, 1.5 s ... 5 s)
    assert sum("Slurm does not answer" in line for line in said) == 4


def test_the_decision_says_in_one_line_what_it_was_weighed_as_and_what_it_asked(
    tmp_path, monkeypatch, fake_slurm
):
    """The executor's loop logs one ``weighed:`` line for the decision (``recovery.Weighed``):
    the transition and the questions asked, read back as the scale benchmark reads task 0's
    log. Here the five questions of the silent controller's case above, and the CPU the loop
    spent between its start and the transition (its clock read twice: 0.37 s apart) beside the
    evidence's own (``read_cpu_s``)."""
    fake_slurm.silent = 8
    cpu = iter([12.0, 12.37]).__next__
    _, said = signal_kill_decided(tmp_path, monkeypatch, Clock(), cpu, read_cpu_s=0.05)
    (line,) = [line for line in said if line.startswith("weighed:")]
    got = recovery.Weighed.parsed(f"[2026-11-30T01:00:00Z] hpc-train n1: {line}")
    assert got is not None and got.transition == "InJobRound"
    assert got.questions == len(fake_slurm.asked) // 2 == 5  # a node and a step each
    assert got.read_s == 0.0  # the table's evidence: nothing read
    assert got.cpu_s == 0.42 and line.endswith("; 0.42 s of CPU)")


@pytest.mark.parametrize("weighed", [
    recovery.Weighed("Requeue", 0.01),
    recovery.Weighed("InJobRound", 0.27, read_s=0.02),
    recovery.Weighed("InJobRound", 1.5, read_s=0.02, questions=2, slurm_s=1.21),
    recovery.Weighed("Stop", 0.3, questions=1, slurm_s=0.25),
    recovery.Weighed("InJobRound", 1.4, 0.07, 1, 1.31, "step queue1-dy-p3dn-41", 1.3),
    recovery.Weighed("InJobRound", 1.4, 0.07, 1, 1.31, "step s40", 1.3, cpu_s=0.03),
    recovery.Weighed("Requeue", 0.01, cpu_s=0.0),
    recovery.Weighed("Stop", 0.3, read_s=0.1, cpu_s=0.12),
])  # fmt: skip
def test_a_weighed_line_reads_back_as_written(weighed):
    assert recovery.Weighed.parsed(weighed.line()) == weighed
    assert recovery.Weighed.parsed("weighed: nothing like it") is None
    assert recovery.Weighed.parsed("weighed: Stop in 0.30 s (and something unknown)") is None


def test_a_probe_unanswered_is_made_again_and_slurms_word_then_awaited(
    tmp_path, monkeypatch, fake_slurm
):
    """The node's state answered, the probe not (srun and `scontrol ping` both unanswered:
    None): probed again; then no step starts (its slurmd gone) and Slurm marks it not
    responding within SlurmdTimeout, read only now that the controller answers."""
    fake_slurm.gone.add("n2")
    polls = {"n": 0}
    real_node_info = fake_slurm.node_info

    def node_info(node: str) -> dict[str, str]:
        polls["n"] += 1
        answer = real_node_info(node)
        if polls["n"] == 1:
            fake_slurm.silent = 1  # the step probe that follows goes unanswered
        if polls["n"] == 3:  # Slurm's word, the poll after the probe said no step
            answer = {"State": "IDLE+NOT_RESPONDING", "Reason": "Not responding"}
        return answer

    fake_slurm.node_info = node_info
    blamed, _ = signal_kill_decided(tmp_path, monkeypatch, Clock())
    seen = fake_slurm.asked
    assert seen[:4] == ["node n2", "step n2", "node n2", "step n2"]  # probed again
    assert "config" in seen and seen.index("config") > 3  # SlurmdTimeout read once it answered
    assert blamed.evidence is Evidence.LOST and "IDLE+NOT_RESPONDING" in blamed.why


def test_a_controller_silent_past_patience_leaves_the_signal_kill_standing(
    tmp_path, monkeypatch, fake_slurm
):
    """A controller that never answers again: at most ``SILENCE_PATIENCE_S`` of asking (then
    the executor's requeue meets the same silence with its own patience), never a verdict."""
    fake_slurm.silent = 10**6
    clock = Clock()
    blamed, said = signal_kill_decided(tmp_path, monkeypatch, clock)
    assert blamed.evidence is Evidence.SIGNAL
    patience = slurm.SILENCE_PATIENCE_S
    assert patience - 5 <= clock.slept <= patience + 5
    assert any("Slurm silent for" in line for line in said)
    assert "config" not in fake_slurm.asked


def test_a_step_that_starts_while_slurms_word_is_awaited_ends_the_wait(
    tmp_path, monkeypatch, fake_slurm
):
    """Right after slurmctld came back a first step may be refused (seen on the local
    cluster: the wait for Slurm's word then ran its whole SlurmdTimeout, 20 s). The step is
    probed again at each look: once one starts, the signal kill stands at once."""
    fake_slurm.gone.add("n2")
    monkeypatch.setattr(fake_slurm, "slurmd_timeout_s", lambda: 300.0)
    probes = {"n": 0}
    real_step = fake_slurm.step_starts

    def step_starts(job_id: str, node: str, timeout: float = 20.0) -> bool | None:
        probes["n"] += 1
        if probes["n"] == 2:
            fake_slurm.gone.discard(node)  # the node's slurmd takes steps again
        return real_step(job_id, node, timeout)

    fake_slurm.step_starts = step_starts
    clock = Clock()
    blamed, _ = signal_kill_decided(tmp_path, monkeypatch, clock)
    assert blamed.evidence is Evidence.SIGNAL and probes["n"] == 2
    assert clock.slept < 5  # one poll, not the 300 s allowed for Slurm's word


def test_a_controller_back_after_patience_decides_the_requeue_without_asking_forever(
    tmp_path, monkeypatch, fake_slurm
):
    """Silent past ``SILENCE_PATIENCE_S`` (the signal kill stands), the last step probe
    unanswered, then answering when the requeue's partition is asked: the policy, deciding
    again on that word, weighs the unanswered probe as silence, never as "no step starts" (a
    KeyError before: the wait for Slurm's word looked for a probe that never said no)."""
    clock = Clock()
    patience_ends = clock.now + slurm.SILENCE_PATIENCE_S
    real_answer = fake_slurm._answer
    late = []  # the looks after patience: the node and the step unanswered, then Slurm answers

    def answer(what: str) -> None:
        if clock.now > patience_ends:
            late.append(what)
        fake_slurm.silent = 1 if len(late) <= 2 else 0
        real_answer(what)

    monkeypatch.setattr(fake_slurm, "_answer", answer)
    monkeypatch.setattr(recovery, "log", lambda _: None)
    asked_in_order(monkeypatch)
    case = end_case(tmp_path, Cause.CRASH, "requeue")
    ev = dataclasses.replace(case.evidence, slurm=SlurmWord())
    found = recovery.what_follows(ev, case.options, sleep=clock.sleep, clock=clock)
    assert isinstance(found, Requeue), found
    (blamed,) = [b for b in found.blames if b.node == "n2"]
    assert blamed.evidence is Evidence.SIGNAL
    assert clock.slept <= slurm.SILENCE_PATIENCE_S + 15
    assert late == ["node n2", "step n2"]  # past the patience: weighed once, not asked again
