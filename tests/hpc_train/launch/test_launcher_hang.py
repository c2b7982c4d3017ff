"""The launcher on a hang, in seconds: the real ``Launcher.run`` and its watchdog thread with a
fake Slurm (records drains, requeues and exclusions: no Slurm here) and a fake torchrun: one
Python process that beats once, as a worker does, then stops itself with SIGSTOP (what
``chaos hang`` does to a rank). The real-Slurm test is tests/integration/test_hang.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hpc_core import ledger
from hpc_core.rundir import SUSPECT, RunDir, incident_report
from hpc_train.contract import StartDecision, write_decision
from hpc_train.faults import end_evidence
from hpc_train.job.limits import HangLimits, Watch
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Recovery, Training
from hpc_train.launch import launcher, restart_policy
from hpc_train.launch.restart_policy import Action
from hpc_train.watch import hang_monitor


class StoppedRank(launcher.Launcher):
    """torchrun replaced by one rank that completes update 3, then is SIGSTOPped."""

    def torchrun_command(self, start: launcher.Start, nproc: int, args: list[str]) -> list[str]:
        body = (
            "import os, signal; from pathlib import Path; from hpc_train.worker.heartbeat import Heartbeat\n"
            "d = Path(os.environ['HPC_TRAIN_HEARTBEAT_DIR'])\n"
            "hb = Heartbeat(d, 0); hb.arm_stacks(d); hb.completed(3); hb.training()\n"
            "os.kill(os.getpid(), signal.SIGSTOP)\n"
        )
        return [sys.executable, "-c", body]


@pytest.fixture(autouse=True)
def quick_incidents(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog's polls and waits in tenths of a second, on node n1."""
    monkeypatch.setattr(hang_monitor, "POLL_S", 0.1)
    monkeypatch.setattr(hang_monitor, "STACK_WAIT_S", 0.5)
    monkeypatch.setattr(end_evidence, "REPORT_WAIT_S", 0.5)
    monkeypatch.setenv("SLURMD_NODENAME", "n1")


def spec_in(tmp_path: Path, no_drain: bool = False, max_update: int | None = None) -> JobSpec:
    hang = HangLimits(factor=1.0, floor_s=1.0, startup_s=30.0)
    return JobSpec(
        Training("tiny", Path("/d"), tmp_path, max_update=max_update), Sizing(gpus_per_node=0),
        recovery=Recovery(no_drain=no_drain), watch=Watch(hang=hang),
    )  # fmt: skip


def test_a_stopped_rank_is_a_hang_task_0_blames_its_node_requeues_and_excludes_it(
    tmp_path, fake_slurm
):
    start = launcher.Start("41", 0, 1, "n1", 0, ("n1",))
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        StoppedRank(spec_in(tmp_path)).run(start, gpus=0)
    assert fake_slurm.requeued == ["41"] and fake_slurm.excluded == [("41", ["n1"])]
    (node, reason), *_ = fake_slurm.drained
    assert node == "n1" and reason.startswith("hpc-train: hang in job 41: rank 0 on n1 gave no")
    incident = RunDir(tmp_path).incident("41", 0)
    report = json.loads(incident_report(incident, "n1").read_text())
    assert report["ranks"] == [
        {"rank": 0, "node": "n1", "update": 3, "time": report["ranks"][0]["time"], "stack": False}
    ]
    verdict = json.loads((incident / SUSPECT).read_text())
    assert verdict["suspect"]["node"] == "n1"
    events = {e.kind: e for e in ledger.read(RunDir(tmp_path).ledger)}
    assert events["stopped"].get("cause") == "hang"
    assert (events["blamed"].get("node"), events["blamed"].get("drained")) == ("n1", True)


def test_no_drain_still_excludes_and_other_tasks_leave_the_blame_to_task_0(tmp_path, fake_slurm):
    start = launcher.Start("41", 0, 1, "n1", 0, ("n1",))
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        StoppedRank(spec_in(tmp_path, no_drain=True)).run(start, gpus=0)
    assert fake_slurm.drained == [] and fake_slurm.excluded == [("41", ["n1"])]
    write_decision(
        RunDir(tmp_path),
        "41",
        1,
        StartDecision([], 0, world_size=1, batch_per_device=1, update_freq=1),
    )
    with pytest.raises(RuntimeError, match="task 0 blames a node and requeues"):
        StoppedRank(spec_in(tmp_path)).run(launcher.Start("41", 1, 2, "n1", 1, ("n0", "n1")), 0)
    assert fake_slurm.requeued == ["41"] and len(fake_slurm.excluded) == 1


def test_the_hang_decision_is_pure():
    hang = "rank 1 on n2: no update for 301 s"
    requeue = restart_policy.after_exit(-9, False, task=0, restart=0, max_restarts=3, hang=hang)
    assert (requeue.action, requeue.cause, requeue.blame) == (Action.RESTART, "hang", True)
    assert "without the suspect node" in requeue.why
    last = restart_policy.after_exit(-9, False, task=0, restart=3, max_restarts=3, hang=hang)
    assert last.action is Action.FAIL and last.blame  # drained all the same
    peer = restart_policy.after_exit(-9, False, task=1, restart=0, max_restarts=3, hang=hang)
    assert peer.action is Action.FAIL and not peer.blame
    cancel = restart_policy.after_exit(-9, False, 0, 0, 3, cancelled=True, hang=hang)
    assert cancel.action is Action.CANCELLED and not cancel.blame
    crash = restart_policy.after_exit(1, False, task=0, restart=0, max_restarts=3)
    assert crash.action is Action.RESTART and crash.blame  # task 0 looks for a node at fault
    bug = restart_policy.after_exit(1, False, 0, 0, 3, crash=("user error", "ValueError: x"))
    assert bug.action is Action.RESTART and not bug.blame  # the code's fault, no node's


class StuckAgent(launcher.Launcher):
    """torchrun replaced by an agent whose one rank (a child) completes the last update and
    exits; then the agent stops itself with SIGSTOP (what was measured: task 0's torchrun
    stopped after training, the job held its nodes 12+ minutes). ``reached``: the rank's last
    update."""

    reached = 12

    def torchrun_command(self, start: launcher.Start, nproc: int, args: list[str]) -> list[str]:
        rank = (
            "import os; from pathlib import Path; from hpc_train.worker.heartbeat import Heartbeat\n"
            "d = Path(os.environ['HPC_TRAIN_HEARTBEAT_DIR'])\n"
            f"hb = Heartbeat(d, 0); hb.completed({self.reached}); hb.training(stopping=True)\n"
        )
        body = (
            "import os, signal, subprocess, sys\n"
            f"p = subprocess.Popen([sys.executable, '-c', {rank!r}])\n"
            "os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)\n"  # exited, never reaped
            "os.kill(os.getpid(), signal.SIGSTOP)\n"
        )
        return [sys.executable, "-c", body]


def test_an_agent_stuck_after_its_ranks_finished_is_killed_and_the_run_finishes(
    tmp_path, fake_slurm
):
    spec = spec_in(tmp_path, max_update=12)
    done = StuckAgent(spec).run(launcher.Start("41", 0, 1, "n1", 0, ("n1",)), gpus=0)
    assert done["restarts"] == 0 and fake_slurm.requeued == []
    (finished,) = [e for e in ledger.read(RunDir(tmp_path).ledger) if e.kind == "finished"]
    assert "training finished; then torchrun" in finished.get("why")
    assert "state T" in finished.get("why") and "killed" in finished.get("why")
    assert finished.get("reached") == 12  # the goodput counts the wait as no progress


def test_an_agent_stuck_before_the_end_is_a_hang(tmp_path, fake_slurm):
    """The same stuck agent, but its rank stopped at update 5 of 12 (no save on notice): a
    hang, task 0 requeues."""
    agent = StuckAgent(spec_in(tmp_path, max_update=12))
    agent.reached = 5
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        agent.run(launcher.Start("41", 0, 1, "n1", 0, ("n1",)), gpus=0)
    (stopped,) = [e for e in ledger.read(RunDir(tmp_path).ledger) if e.kind == "stopped"]
    assert stopped.get("cause") == "hang" and "torchrun stuck" in stopped.get("why")
