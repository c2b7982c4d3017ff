"""Task 0's straggler thread, in seconds: real heartbeat files, the real ``Launcher.run`` with
the fake Slurm of tests/hpc_train/conftest.py (no Slurm in this tier) and a fake torchrun: one
Python process that writes both nodes' heartbeats (n2's compute 3x n1's) and, on the notice,
saves as a worker does (the stop marker) and exits. The real-Slurm test, with ``chaos slow``
throttling a node, is tests/integration/test_stragglers.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_train.contract import StartFiles
from hpc_train.faults.suspects import Evidence, Suspect
from hpc_train.job.limits import StragglerLimits, Watch
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Recovery, Training
from hpc_train.launch import launcher, restart_policy
from hpc_train.launch.restart_policy import Action, Decision
from hpc_train.watch import straggler_monitor
from hpc_train.worker.heartbeat import Heartbeat


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beat(run: RunDir, node: str, rank: int, compute_s: float) -> None:
    hb = Heartbeat(run.heartbeats("7", 0, node), rank)
    hb.compute(compute_s)
    hb.completed(1)


def test_task_0_reads_a_bounded_number_of_nodes_a_poll_and_still_names_the_straggler(
    tmp_path, monkeypatch
):
    """Issue 46: at 64 nodes reading every node's heartbeats every poll is task 0's file
    operations growing with the node count. At most NODES_PER_POLL nodes a poll, in turn, the
    others as last read: every node is in every sample once each has been read, and a slow one
    is still named after the window."""
    run, clock = RunDir(tmp_path), Clock()
    hosts = [f"n{i}" for i in range(1, 41)]
    for rank, node in enumerate(hosts):
        beat(run, node, rank, 0.14 if node == "n33" else 0.10)
    read: list[str] = []
    real = straggler_monitor.read_beats
    monkeypatch.setattr(straggler_monitor, "read_beats",
                        lambda d, *a: (read.append(d.name), real(d, *a))[1])  # fmt: skip
    notes: list[tuple[str, dict[str, Any]]] = []
    watch = straggler_monitor.StragglerWatch(
        StartFiles(run, "7", 0), hosts, StragglerLimits(0.2, 60.0), False,
        lambda kind, **data: notes.append((kind, data)), lambda _: None, clock,
    )  # fmt: skip
    sizes = []
    for _ in range(12):  # 0 ... 110 s
        read.clear()
        sizes.append(len(watch.sample().compute_s))
        assert len(read) == straggler_monitor.NODES_PER_POLL
        clock.now += 10
    assert sizes[:3] == [16, 32, 40] and set(sizes[3:]) == {40}
    for _ in range(10):
        watch.check()
        clock.now += 10
    assert [data["node"] for _, data in notes] == ["n33"]


def test_a_straggler_is_named_once_in_the_log_and_the_ledger(tmp_path):
    run, clock = RunDir(tmp_path), Clock()
    beat(run, "n1", 0, 0.10)
    beat(run, "n2", 1, 0.14)  # 1.4x
    beat(run, "n3", 2, 0.10)
    notes: list[tuple[str, dict[str, Any]]] = []
    lines: list[str] = []
    watch = straggler_monitor.StragglerWatch(
        StartFiles(run, "7", 0), ["n1", "n2", "n3", "n4"], StragglerLimits(0.2, 60.0), False,
        lambda kind, **data: notes.append((kind, data)), lines.append, clock,
    )  # fmt: skip
    assert watch.sample().compute_s == {"n1": 0.1, "n2": 0.14, "n3": 0.1}  # n4: no heartbeat
    for _ in range(10):  # 0 ... 90 s
        watch.check()
        clock.now += 10
    assert [kind for kind, _ in notes] == ["straggler"]
    (_, data), (line,) = notes[0], lines
    assert data["node"] == "n2" and data["ratio"] == pytest.approx(1.4) and data["seconds"] == 60
    assert line.startswith("straggler: node n2") and "1.40x the median" in line
    assert watch.evicted is None


def test_the_eviction_decision():
    requeue = Decision(Action.RESTART, "stopped on notice: requeueing (restart 1/20)", "notice")
    node = Suspect("n2", "straggler: ...", Evidence.STRAGGLER)
    got = restart_policy.evicting(requeue, node.node)
    assert (got.action, got.cause, got.why.endswith("evicting n2")) == (
        Action.RESTART,
        "straggler",
        True,
    )
    assert restart_policy.evicting(requeue, None) is requeue
    finished = Decision(Action.FINISHED, "training finished", "finished")
    assert restart_policy.evicting(finished, node.node) is finished  # it ended first: nothing to do


class SlowPeer(launcher.Launcher):
    """torchrun replaced by one process writing both nodes' heartbeats (n2 3x slower); on the
    notice it writes the stop marker, as the workers' save on notice does, and exits 0."""

    def torchrun_command(self, start: launcher.Start, nproc: int, args: list[str]) -> list[str]:
        body = (
            "import os, signal, time; from pathlib import Path\n"
            "from hpc_train.contract import StopMarker, write_stop\n"
            "from hpc_train.worker.heartbeat import Heartbeat\n"
            "got = []; signal.signal(signal.SIGUSR2, lambda *a: got.append(1))\n"
            "d = Path(os.environ['HPC_TRAIN_HEARTBEAT_DIR'])\n"
            "for node, rank, s in ((d, 0, 0.1), (d.parent / 'n2', 1, 0.3)):\n"
            "    hb = Heartbeat(node, rank); hb.compute(s); hb.completed(1); hb.training()\n"
            "end = time.monotonic() + 20\n"
            "while not got and time.monotonic() < end: time.sleep(0.02)\n"
            "if not got: raise SystemExit(3)\n"
            "write_stop(Path(os.environ['HPC_TRAIN_STOP_MARKER']), StopMarker(5, 'SIGUSR2'))\n"
        )
        return [sys.executable, "-c", body]


@pytest.mark.parametrize("round_", [0, 1])
def test_evict_stragglers_saves_drains_requeues_and_excludes_the_node(
    tmp_path: Path, fake_slurm, monkeypatch: pytest.MonkeyPatch, round_: int
):
    """Round 1: a start after an in-job restart, whose heartbeats are under ``42.1`` (found by
    bench-soak, 2026-11-26: the watch read round 0's, stale, and a slow node went unnamed)."""
    monkeypatch.setattr(straggler_monitor, "POLL_S", 0.05)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    spec = JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(gpus_per_node=0),
        watch=Watch(stragglers=StragglerLimits(window_s=0.3)),
        recovery=Recovery(evict_stragglers=True),
    )
    run = spec.run_dir
    key = "42" if round_ == 0 else f"42.{round_}"  # contract.StartFiles.name
    (run.node_report(key, 0, 1)).parent.mkdir(parents=True, exist_ok=True)
    run.node_report(key, 0, 1).write_text('{"task": 1, "node": "n2", "gpus": 0}')
    start = launcher.Start("42", 0, 2, "n1", 0, ("n1", "n2"), round=round_)
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        SlowPeer(spec).run(start, gpus=0)
    assert fake_slurm.requeued == ["42"] and fake_slurm.excluded == [("42", ["n2"])]
    ((node, reason),) = fake_slurm.drained
    assert node == "n2" and reason.startswith("hpc-train: straggler in job 42: node n2")
    events = {e.kind: e for e in ledger.read(run.ledger)}
    assert events["straggler"].get("node") == "n2"
    assert events["straggler"].get("ratio") == pytest.approx(3.0)
    assert events["blamed"].get("node") == "n2" and events["blamed"].get("drained") is True
    assert events["stopped"].get("cause") == "straggler"
    assert "evicting n2" in events["stopped"].get("why")
