"""The launcher's decisions after torchrun exits, in milliseconds: the real ``Launcher.run``
with a fake Slurm (records requeues instead of calling scontrol: no Slurm needed) and a fake
torchrun (a Python one-liner that exits with a code and may write the stop marker, as the
workers do after a save on notice). The real-Slurm tests in tests/integration cover the rest."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_core import ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_core.wait import FAST, process_exited, wait_until
from hpc_train.contract import (
    ENDED,
    Cause,
    LauncherBeat,
    StartDecision,
    StartFiles,
    StopMarker,
    read_stop,
    write_decision,
    write_launcher_beat,
    write_stop,
)
from hpc_train.faults import failures, quarantine
from hpc_train.faults.suspects import Evidence
from hpc_train.job.limits import Watch
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Notifications, Recovery, Training
from hpc_train.launch import launcher as launcher_module
from hpc_train.launch import lifecycle, restart_policy, starts
from hpc_train.launch.restart_policy import Action


class FakeTorchrun(launcher_module.Launcher):
    """torchrun replaced by ``python -c``: exits ``code``; with ``save`` it first writes the
    stop marker at the path the launcher passed (what preemption.install_save_on_notice does)."""

    def __init__(
        self,
        spec: JobSpec,
        code: int,
        save: bool = False,
        term: bool = False,
        notice: bool | str = False,
    ) -> None:
        super().__init__(spec)
        self.code, self.save, self.term, self.notice = code, save, term, notice
        self.argv: list[str] = []

    def torchrun_command(
        self, start: launcher_module.Start, nproc: int, args: list[str]
    ) -> list[str]:
        self.argv = args
        body = "import json, os, sys\n"
        if self.save:
            body += "p = os.environ['HPC_TRAIN_STOP_MARKER']\n"
            body += (
                "open(p, 'w').write(json.dumps({'update': 7, 'signal': 'SIGUSR2', 'time': 1.0}))\n"
            )
        if self.notice:  # a preemption's USR2 reaches every task's launcher first
            body += "import signal, time; os.kill(os.getppid(), signal.SIGUSR2); time.sleep(0.2)\n"
        if self.notice == "then save":  # a rank with no handler yet saves on the launcher's record
            body += "p = os.environ['HPC_TRAIN_NOTICE_PENDING']\n"
            body += "assert json.load(open(p))['signal'] == 'SIGUSR2', p\n"
            body += "m = os.environ['HPC_TRAIN_STOP_MARKER']\n"
            body += (
                "open(m, 'w').write(json.dumps({'update': 7, 'signal': 'SIGUSR2', 'time': 1.0}))\n"
            )
        if self.term:  # what scancel does to the launcher: SIGTERM, with no notice before it
            body += "import signal, time; os.kill(os.getppid(), signal.SIGTERM); time.sleep(0.2)\n"
        return [sys.executable, "-c", body + f"sys.exit({self.code})"]


def spec_in(tmp_path: Path, max_restarts: int = 3) -> JobSpec:
    return JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(gpus_per_node=0),
        recovery=Recovery(max_restarts=max_restarts),
    )


def start(task: int = 0, restart: int = 0) -> launcher_module.Start:
    """Task 0 of a one-node start (it decides at once), or task 1 of two (it waits for the
    decision the test wrote for task 0)."""
    return launcher_module.Start("41", task, 1 if task == 0 else 2, "n1", restart)


def test_clean_exit_finishes_without_requeue(tmp_path, fake_slurm):
    assert FakeTorchrun(spec_in(tmp_path), 0).run(start(), gpus=0)["restarts"] == 0
    assert fake_slurm.requeued == []


def test_a_crash_on_task_0_requeues_once_and_the_task_fails(tmp_path, fake_slurm):
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        FakeTorchrun(spec_in(tmp_path), 1).run(start(), gpus=0)
    assert fake_slurm.requeued == ["41"]


class SummaryOnStderr(FakeTorchrun):
    """torchrun replaced by ``python -c``: 100 KiB of warnings on stderr (more than a pipe
    holds), then torchrun's failure summary naming rank 1 killed by SIGKILL; exits 1."""

    SUMMARY = "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n" \
        "  exitcode  : -9 (pid: 16440)  (SIGKILL)\n"  # fmt: skip

    def torchrun_command(self, start, nproc, args):
        noise = "UserWarning: " + "w" * 1010 + "\n"
        body = f"import sys\nfor _ in range(100): sys.stderr.write({noise!r})\n"
        return [sys.executable, "-c", body + f"sys.stderr.write({self.SUMMARY!r}); sys.exit(1)"]


def test_torchruns_failure_summary_reaches_the_task_log_and_the_exit_record(
    tmp_path, fake_slurm, capsys
):
    """Every stderr line of torchrun reaches the task's log (through the launcher's file), and
    the root cause is in this node's exit record for task 0 to weigh."""
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        SummaryOnStderr(spec_in(tmp_path), 1).run(start(), gpus=0)
    record = failures.read_exits(StartFiles(RunDir(tmp_path), "41", 0), 1)[0]
    assert (record.returncode, record.root_rank, record.root_exitcode) == (1, 1, -9)
    err = capsys.readouterr().err
    assert err.count("UserWarning: ") == 100 and SummaryOnStderr.SUMMARY in err


def test_a_crash_on_another_task_leaves_the_requeue_to_task_0(tmp_path, fake_slurm):
    write_decision(
        RunDir(tmp_path),
        "41",
        0,
        StartDecision([], 0, world_size=1, batch_per_device=1, update_freq=1),
    )  # task 0 decided
    with pytest.raises(RuntimeError, match="task 0 decides"):
        FakeTorchrun(spec_in(tmp_path), 1).run(start(task=1), gpus=0)
    assert fake_slurm.requeued == []


def test_save_on_notice_is_a_stop_not_a_finish(tmp_path, fake_slurm):
    """Exit 0 with the marker on task 1: this task succeeds as stopped; task 0 requeues."""
    write_decision(
        RunDir(tmp_path),
        "41",
        0,
        StartDecision([], 0, world_size=1, batch_per_device=1, update_freq=1),
    )
    out = FakeTorchrun(spec_in(tmp_path), 0, save=True).run(start(task=1), gpus=0)
    assert out["stopped"] is True
    assert read_stop(RunDir(tmp_path), "41", 0) == StopMarker(7, "SIGUSR2", 1.0)
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        FakeTorchrun(spec_in(tmp_path), 0, save=True).run(start(task=0), gpus=0)
    assert fake_slurm.requeued == ["41"]


def test_a_cancelled_job_is_never_requeued(tmp_path, fake_slurm):
    """scancel: SIGTERM to the launcher, torchrun exits non-zero; Slurm says COMPLETING."""
    fake_slurm.state = "COMPLETING"
    out = FakeTorchrun(spec_in(tmp_path), 1, term=True).run(start(task=0), gpus=0)
    assert out["restarts"] == 0 and fake_slurm.requeued == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the launcher's handler is gone


def test_slurms_cancelled_state_counts_as_a_cancel_too(tmp_path, fake_slurm):
    fake_slurm.state = "CANCELLED"
    FakeTorchrun(spec_in(tmp_path), 1).run(start(task=0), gpus=0)
    assert fake_slurm.requeued == []


def test_sigterm_after_a_notice_is_the_end_of_a_grace_time_not_a_cancel(tmp_path, fake_slurm):
    launcher = FakeTorchrun(spec_in(tmp_path), 1, term=True)
    launcher._signals.append("notice")  # USR2 came first (preemption, time limit)
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        launcher.run(start(task=0), gpus=0)
    assert fake_slurm.requeued == ["41"]


def test_the_requeue_after_a_save_on_notice_is_not_a_cancel_on_the_other_tasks(
    tmp_path, fake_slurm, capsys
):
    """Task 0 requeues once the save is durable; Slurm's SIGTERM then reaches task 1's launcher
    before its workers exit. That task stopped on notice: it was not cancelled."""
    write_decision(
        RunDir(tmp_path),
        "41",
        0,
        StartDecision([], 0, world_size=1, batch_per_device=1, update_freq=1),
    )
    fake_slurm.state = "COMPLETING"
    out = FakeTorchrun(spec_in(tmp_path), -15, save=True, term=True).run(start(task=1), gpus=0)
    assert out["stopped"] is True and fake_slurm.requeued == []
    said = capsys.readouterr().out
    assert "after the save on notice" in said and "cancelled" not in said


def test_the_last_allowed_restart_fails_instead_of_requeueing(tmp_path, fake_slurm):
    spec = spec_in(tmp_path, max_restarts=2)
    with pytest.raises(RuntimeError, match=r"no restarts left \(--max-restarts 2\)"):
        FakeTorchrun(spec, 1).run(start(restart=2), gpus=0)
    with pytest.raises(RuntimeError, match="restart budget exhausted"):
        FakeTorchrun(spec, 0).run(start(restart=3), gpus=0)
    assert fake_slurm.requeued == []


def test_the_resume_decision_reaches_the_workers(tmp_path, fake_slurm):
    write_decision(
        RunDir(tmp_path),
        "41",
        0,
        StartDecision(
            ["--continue-once", "/c.pt"], 5, world_size=1, batch_per_device=1, update_freq=1
        ),
    )
    launcher = FakeTorchrun(spec_in(tmp_path), 0)
    launcher.run(start(task=1), gpus=0)
    assert launcher.argv[-2:] == ["--continue-once", "/c.pt"]


@pytest.mark.parametrize(
    ("code", "saved", "task", "restart", "action"),
    [
        (0, False, 0, 0, Action.FINISHED),
        (0, False, 1, 5, Action.FINISHED),
        (0, True, 1, 0, Action.SAVED_ON_NOTICE),
        (-15, True, 1, 0, Action.SAVED_ON_NOTICE),
        (0, True, 0, 0, Action.RESTART),
        (1, False, 0, 2, Action.RESTART),
        (1, False, 0, 3, Action.FAIL),
        (1, False, 1, 0, Action.FAIL),
    ],
)
def test_after_exit_policy(code, saved, task, restart, action):
    assert restart_policy.after_exit(code, saved, task, restart, max_restarts=3).action is action
    cancelled = restart_policy.after_exit(code, saved, task, restart, 3, cancelled=True)
    assert cancelled.action is Action.CANCELLED  # a cancel is final, whatever the exit


def test_restart_budget_counts_restarts_of_any_kind():
    assert restart_policy.restart_allowed(3, 3) and not restart_policy.restart_allowed(4, 3)
    assert not restart_policy.restart_allowed(1, 0)


def test_notice_wait_ends_when_the_save_is_durable_not_when_workers_exit(tmp_path, monkeypatch):
    """The workers may take tens of seconds to exit after their save (DataLoader processes);
    task 0 lets submitit requeue as soon as the stop marker says the checkpoint is on disk."""
    import subprocess
    import time

    launcher = launcher_module.Launcher(spec_in(tmp_path))
    run = RunDir(tmp_path)
    launcher._marker = run.stop_marker("41", 0)
    launcher._proc = subprocess.Popen(["sleep", "30"])  # workers still tearing down
    monkeypatch.setenv(launcher_module.SAVE_WAIT_ENV, "20")
    try:
        write_stop(launcher._marker, StopMarker(7, "SIGUSR2"))
        started = time.monotonic()
        resubmission = launcher.checkpoint()
        assert time.monotonic() - started < 2  # not the workers' exit, not the 20 s bound
        assert resubmission.function.spec == launcher.spec  # submitit requeues the same run
        assert launcher._signals == ["notice"]
    finally:
        launcher._proc.kill()
        launcher._proc.wait()


def kinds(tmp_path: Path) -> list[tuple[str, int]]:
    return [(e.kind, e.restart) for e in ledger.read(RunDir(tmp_path).ledger)]


def test_task_0_records_each_stage_in_the_ledger(tmp_path, fake_slurm):
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        FakeTorchrun(spec_in(tmp_path), 1).run(start(restart=1), gpus=0)
    assert kinds(tmp_path) == [("started", 1), ("stopped", 1), ("requeued", 1)]
    started, stopped, _ = ledger.read(RunDir(tmp_path).ledger)
    assert started.get("world") == 1 and started.get("update_freq") == 2
    assert started.get("previous").startswith("no save on notice")
    assert (stopped.get("cause"), stopped.get("returncode")) == ("crash", 1)
    FakeTorchrun(spec_in(tmp_path), 0).run(start(restart=2), gpus=0)
    assert kinds(tmp_path)[-2:] == [("started", 2), ("finished", 2)]


def test_other_tasks_write_no_ledger_events(tmp_path, fake_slurm):
    write_decision(
        RunDir(tmp_path),
        "41",
        0,
        StartDecision([], 0, world_size=1, batch_per_device=1, update_freq=1),
    )
    FakeTorchrun(spec_in(tmp_path), 0).run(start(task=1), gpus=0)
    assert kinds(tmp_path) == []


def test_a_cancel_is_recorded_as_its_own_cause(tmp_path, fake_slurm):
    fake_slurm.state = "CANCELLED"
    FakeTorchrun(spec_in(tmp_path), 1).run(start(task=0), gpus=0)
    assert [e.get("cause") for e in ledger.read(RunDir(tmp_path).ledger)] == [None, "cancelled"]


def test_notify_runs_the_users_command_on_stop_and_requeue_and_finish(tmp_path, fake_slurm):
    """--notify: `sh -c CMD` on task 0, the ledger event as JSON on stdin."""
    got = tmp_path / "events.jsonl"
    spec = dataclasses.replace(
        spec_in(tmp_path), notify=Notifications(command=f"cat >> {got}; echo >> {got}")
    )
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        FakeTorchrun(spec, 1).run(start(), gpus=0)
    FakeTorchrun(spec, 0).run(start(restart=1), gpus=0)
    events = [json.loads(line) for line in got.read_text().splitlines()]
    assert [(e["event"], e["restart"]) for e in events] == [
        ("stopped", 0),
        ("requeued", 0),
        ("finished", 1),
    ]  # never "started": only what a human needs to hear
    assert events[0]["cause"] == "crash" and events[0]["save_dir"] == str(tmp_path)


def test_a_failing_notify_command_is_logged_and_training_goes_on(tmp_path, fake_slurm, capsys):
    spec = dataclasses.replace(
        spec_in(tmp_path), notify=Notifications(command="echo mail server down >&2; exit 3")
    )
    assert FakeTorchrun(spec, 0).run(start(), gpus=0)["restarts"] == 0
    assert "--notify command exited 3 on finished: mail server down" in capsys.readouterr().out


def test_the_next_start_says_why_the_previous_one_stopped(tmp_path):
    run = RunDir(tmp_path)
    assert starts.previous_stop(StartFiles(run, "41", 1)).startswith(
        "no save on notice (node failure"
    )
    ledger.record(run.ledger, "stopped", "41", 0, cause="hang", why="no update for 31 s")
    assert starts.previous_stop(StartFiles(run, "41", 1)) == (
        "hang (no update for 31 s): last periodic checkpoint"
    )
    write_stop(run.stop_marker("41", 1), StopMarker(7, "SIGUSR2"))
    assert starts.previous_stop(StartFiles(run, "41", 2)) == "saved on notice (SIGUSR2) at update 7"


def test_the_next_start_says_how_the_last_in_job_round_stopped_not_the_first(tmp_path):
    """Seen in a soak (2026-11-26): a straggler's eviction stopped round 0 of start 3 on notice
    at update 12646, round 1 saved on a preemption's notice at 15287, and start 4 said "saved on
    notice at update 12646" (round 0's marker). The last round's own marker is read."""
    run = RunDir(tmp_path)
    write_stop(run.stop_marker("41", 3), StopMarker(12646, None))
    ledger.record(run.ledger, "restarted", "41", 3, round=1, why="straggler")
    write_stop(run.stop_marker("41.1", 3), StopMarker(15287, "SIGUSR2"))
    assert (
        starts.previous_stop(StartFiles(run, "41", 4))
        == "saved on notice (SIGUSR2) at update 15287"
    )


def test_the_same_user_error_in_two_starts_in_a_row_stops_the_run(tmp_path, fake_slurm):
    """The workers' reports (hpc_train.faults.failures) written as a crashing rank would."""
    run = RunDir(tmp_path)
    bug = failures.Failure(0, 30, "ValueError", "bad batch")
    failures.write(run, "41", 0, bug)
    failures.write(run, "41", 1, bug)
    with pytest.raises(RuntimeError, match="same error at the same update"):
        FakeTorchrun(spec_in(tmp_path), 1).run(start(restart=1), gpus=0)
    assert fake_slurm.requeued == []
    stopped = [e for e in ledger.read(run.ledger) if e.kind == "stopped"]
    assert [e.get("cause") for e in stopped] == ["user error"]
    assert "ValueError: bad batch (rank 0, update 30)" in stopped[0].get("why")


def test_a_notice_then_the_requeues_sigterm_is_not_a_cancel_even_without_a_save(
    tmp_path, fake_slurm, capsys
):
    """Preempted as training ended: no save on notice, task 0 requeued, Slurm's SIGTERM killed
    torchrun on task 1. Its launcher saw USR2 first (seen on the real cluster): no cancel."""
    write_decision(
        RunDir(tmp_path),
        "41",
        0,
        StartDecision([], 0, world_size=1, batch_per_device=1, update_freq=1),
    )
    fake_slurm.state = "COMPLETING"
    launcher = FakeTorchrun(spec_in(tmp_path), 1, notice=True, term=True)
    with pytest.raises(RuntimeError, match="task 0 decides on a requeue"):
        launcher.run(start(task=1), gpus=0)
    assert launcher._signals == ["notice", "SIGTERM"]
    assert "cancelled" not in capsys.readouterr().out
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # handlers restored


def test_a_notice_before_the_ranks_have_a_handler_is_recorded_for_them(tmp_path, fake_slurm):
    """USR2 reaches the launcher while torchrun (USR2 ignored) is still starting its ranks: the
    launcher records it where the ranks look each update, and they save on it."""
    write_decision(
        RunDir(tmp_path),
        "41",
        0,
        StartDecision([], 0, world_size=1, batch_per_device=1, update_freq=1),
    )
    out = FakeTorchrun(spec_in(tmp_path), 0, notice="then save").run(start(task=1), gpus=0)
    assert out["stopped"] is True
    assert json.loads(RunDir(tmp_path).notice_pending("41", 0).read_text())["signal"] == "SIGUSR2"


def test_restarts_that_never_advance_stop_the_run_before_torchrun(tmp_path, fake_slurm):
    """Three starts already began at update 0 (the ledger says so): the fourth, a third restart
    with no checkpoint advanced, is stopped by task 0 with the reason, no torchrun, no requeue;
    the ledger says why."""
    run = RunDir(tmp_path)
    for restart in range(3):
        ledger.record(run.ledger, "started", "41", restart, resume_at=0)
    fake = FakeTorchrun(spec_in(tmp_path, max_restarts=20), 0)
    with pytest.raises(RuntimeError, match="3 restarts in a row resumed from update 0"):
        fake.run(start(restart=3), gpus=0)
    assert fake.argv == [] and fake_slurm.requeued == []
    stopped = [e for e in ledger.read(run.ledger) if e.kind == "stopped"]
    assert [e.get("cause") for e in stopped] == ["no progress"]


def test_a_requeue_that_could_not_start_stops_the_run_with_the_nodes(tmp_path, fake_slurm):
    """Two nodes in the partition, one already drained: a crash's requeue of a 2-node job
    could never start on the local cluster (nothing replaces drained nodes): task 0 says so in
    the log and the ledger and fails the run instead of leaving it PENDING forever."""
    fake_slurm.partition = {"n1": "idle", "n2": "drained"}
    spec = JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
    )
    with pytest.raises(RuntimeError, match="cannot start: 1 usable node"):
        FakeTorchrun(spec, 1).run(start(), gpus=0)
    assert fake_slurm.requeued == []
    (blocked,) = [e for e in ledger.read(RunDir(tmp_path).ledger) if e.kind == "requeue_blocked"]
    assert "n2 (drained)" in blocked.get("why") and blocked.get("waiting") is False


def test_where_nodes_are_replaced_a_short_requeue_waits_and_excludes_no_name(tmp_path, fake_slurm):
    """``--nodes-replaced yes`` (a cluster that replaces drained nodes): the same short
    partition, the crash's requeue goes ahead and waits for the replacement (the ledger says
    so), and the blamed node, drained, is not excluded by name: its replacement may be used.
    A quarantined node (blamed twice) is, replaced or not."""
    fake_slurm.partition = {"n1": "idle", "n2": "drained", "n3": "idle"}
    spec = JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
        recovery=Recovery(nodes_replaced="yes"),
    )
    for restart in (7, 8):  # an earlier job of the run blamed n3 twice
        ledger.record(RunDir(tmp_path).ledger, "blamed", "40", restart, node="n3", why="hang")
    quarantine.update(RunDir(tmp_path))  # what a blame does
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        FakeTorchrun(spec, 1).run(start(), gpus=0)
    assert fake_slurm.requeued == ["41"] and fake_slurm.excluded == [("41", ["n3"])]
    (blocked,) = [e for e in ledger.read(RunDir(tmp_path).ledger) if e.kind == "requeue_blocked"]
    assert "waiting for the cluster to replace" in blocked.get("why")
    assert blocked.get("waiting") is True


def test_a_quarantined_node_drained_where_nodes_are_replaced_is_not_excluded_by_name(
    tmp_path, fake_slurm
):
    """The same, with the quarantined n3 drained: its drain keeps it out until clustermgtd
    replaces it, and the replacement is another machine the quarantine does not hold
    (``faults.quarantine``), so the requeue names no node: by name it would be out of the
    job for good (the 2026-11-26 soak's extra requeue came from a name held so)."""
    fake_slurm.partition = {"n1": "idle", "n2": "idle", "n3": "drained"}
    spec = JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
        recovery=Recovery(nodes_replaced="yes"),
    )
    for restart in (7, 8):
        ledger.record(RunDir(tmp_path).ledger, "blamed", "40", restart, node="n3", why="hang")
    quarantine.update(RunDir(tmp_path))
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        FakeTorchrun(spec, 1).run(start(), gpus=0)
    assert fake_slurm.requeued == ["41"] and fake_slurm.excluded == []


def blamed_before(run: RunDir, node: str) -> None:
    """An earlier job of the run blamed ``node``'s machine (the fake Slurm's: no address): its
    next blame drains it, whatever the evidence (``faults.suspects.drain_verdict``)."""
    ledger.record(run.ledger, Kind.BLAMED, "40", 0, node=node, why="crash in job 40: killed")


class FailsOnce(FakeTorchrun):
    """torchrun replaced by ``python -c``: exits 1 in the first round, 0 after (a transient
    crash); the nodes of each round it was started on are kept in ``rounds``."""

    def __init__(self, spec: JobSpec) -> None:
        super().__init__(spec, 1)
        self.rounds: list[tuple[str, ...]] = []

    def torchrun_command(self, start, nproc, args):
        self.rounds.append(start.hosts)
        self.code = 1 if len(self.rounds) == 1 else 0
        return super().torchrun_command(start, nproc, args)


def in_job_spec(tmp_path: Path, nodes_min: int = 1) -> JobSpec:
    return JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(nodes_min=nodes_min, nodes_max=2, gpus_per_node=0),
        recovery=Recovery(restart_in_job=True),
        watch=Watch(no_watchdog=True),
    )


def two_nodes(task: int) -> launcher_module.Start:
    return launcher_module.Start("41", task, 2, "n1", 0, ("n1", "n2"))


def test_a_crash_restarts_in_the_allocation_on_the_same_nodes_without_a_requeue(
    tmp_path, fake_slurm, monkeypatch
):
    """A crash no node is blamed for (a transient one): task 0 restarts training in the job
    on both nodes (round 1 of job 41), with no requeue; the run finishes."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    run = RunDir(tmp_path)
    from hpc_train.contract import NodeReport, write_node_report

    for key in ("41", "41.1"):  # task 1's launcher reports in both rounds
        write_node_report(run, key, 0, NodeReport(1, "n2", 0))
    # its torchrun failed too
    failures.write_exit(StartFiles(run, "41", 0), failures.NodeExit(1, "n2", 1))
    fake = FailsOnce(in_job_spec(tmp_path))
    done = fake.run(two_nodes(0), gpus=0)
    assert done["restarts"] == 0 and fake_slurm.requeued == []
    assert fake.rounds == [("n1", "n2"), ("n1", "n2")]
    events = ledger.read(run.ledger)
    (restarted,) = [e for e in events if e.kind == "restarted"]
    assert restarted.get("members") == ["n1", "n2"] and restarted.get("round") == 1
    assert [e.kind for e in events if e.kind in ("started", "finished")] == [
        "started",
        "started",
        "finished",
    ]


def test_the_other_nodes_follow_task_0s_verdict(tmp_path, fake_slurm):
    """Task 1's torchrun failed: it waits for task 0's word. Left out (blamed): its task ends
    well; a requeue: it waits for Slurm to end it."""
    from hpc_train.contract import RoundAction, RoundVerdict, write_verdict

    write_decision(RunDir(tmp_path), "41", 0, StartDecision([], 0, world_size=2,
                                                            batch_per_device=1, update_freq=1))  # fmt: skip
    write_verdict(
        RunDir(tmp_path), "41", 0, RoundVerdict(RoundAction.RESTART_IN_JOB, "crash", ["n1"])
    )
    done = FakeTorchrun(in_job_spec(tmp_path), 1).run(two_nodes(1), gpus=0)
    assert done["left_out"] is True
    write_verdict(
        RunDir(tmp_path), "41", 0, RoundVerdict(RoundAction.REQUEUE, "requeue did not take effect")
    )
    with pytest.raises(RuntimeError, match="task 0: requeue"):
        FakeTorchrun(in_job_spec(tmp_path), 1).run(two_nodes(1), gpus=0)


def test_too_few_healthy_nodes_for_min_requeue_instead(tmp_path, fake_slurm, monkeypatch):
    """With --nodes 2-2 a node its blame drains leaves one: below MIN, so task 0 requeues
    without it (and tells the others so)."""
    from hpc_train.contract import RoundAction, read_verdict

    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    run = RunDir(tmp_path)
    from hpc_train.contract import NodeReport, write_node_report

    write_node_report(run, "41", 0, NodeReport(1, "n2", 0))
    failures.write_exit(StartFiles(run, "41", 0), failures.NodeExit(1, "n2", -9))
    fake = FakeTorchrun(in_job_spec(tmp_path, nodes_min=2), 1)
    blamed_before(run, "n2")  # its kill by a signal drains it: its machine's second blame
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        fake.run(two_nodes(0), gpus=0)
    assert fake_slurm.requeued == ["41"] and fake_slurm.excluded == [("41", ["n2"])]
    verdict = read_verdict(run, "41", 0)
    assert verdict is not None and verdict.action == RoundAction.REQUEUE


def test_the_log_and_the_ledger_say_an_in_job_round_or_a_requeue_truthfully(
    tmp_path, fake_slurm, monkeypatch, capsys
):
    """What follows a crash is said as what it is, restart n of --max-restarts m: "in-job round
    1/20" when task 0 restarts in the allocation, "requeue 1/20" when it requeues (before, an
    in-job round was announced as "requeueing (restart 1/20)")."""
    from hpc_train.contract import NodeReport, write_node_report

    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    for spec, requeues in ((in_job_spec(tmp_path / "in"), False),
                           (in_job_spec(tmp_path / "rq", nodes_min=2), True)):  # fmt: skip
        run = spec.run_dir
        for key in ("41", "41.1"):
            write_node_report(run, key, 0, NodeReport(1, "n2", 0))
        failures.write_exit(StartFiles(run, "41", 0), failures.NodeExit(1, "n2", 1))
        if requeues:  # n2 killed by a signal, its machine's second blame: drained, left out
            failures.write_exit(StartFiles(run, "41", 0), failures.NodeExit(1, "n2", -9))
            blamed_before(run, "n2")
        if requeues:  # n2 left out: below --nodes MIN 2
            with pytest.raises(RuntimeError, match="requeue did not take effect"):
                FailsOnce(spec).run(two_nodes(0), gpus=0)
        else:
            FailsOnce(spec).run(two_nodes(0), gpus=0)
        (stopped,) = [e for e in ledger.read(run.ledger) if e.kind == "stopped"]
        said = "requeue 1/20" if requeues else "in-job round 1/20"
        assert stopped.get("why").endswith(f": {said}") and "requeueing" not in stopped.get("why")
        assert f"job 41: torchrun exited with 1: {said}" in (capsys.readouterr().out)


class AgentKilled(FakeTorchrun):
    """torchrun replaced by ``python -c``: in the first round it starts a "rank" in a session
    of its own (as torchrun starts its ranks: they outlive it), writes its pid to ``pid_file``
    and is SIGKILLed (chaos's kill of the agent); it exits 0 after (the next round trains)."""

    def __init__(self, spec: JobSpec, pid_file: Path) -> None:
        super().__init__(spec, 0)
        self.pid_file, self.rounds = pid_file, 0

    def torchrun_command(self, start, nproc, args):
        self.rounds += 1
        if self.rounds > 1:
            return super().torchrun_command(start, nproc, args)
        body = (
            "import os, signal, subprocess, sys\n"
            "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
            " start_new_session=True)\n"
            f"open({str(self.pid_file)!r}, 'w').write(str(rank.pid))\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n"
        )
        return [sys.executable, "-c", body]


def test_a_killed_agents_rank_is_ended_and_the_run_restarts_in_the_job_on_its_node(
    tmp_path, fake_slurm, monkeypatch
):
    """torchrun SIGKILLed, its rank alive (in a session of its own it outlives its agent and
    would train on with its peers: no node's torchrun would end, task 0 would never decide and
    the others would wait for its word in vain): the launcher ends the rank as torchrun exits,
    and the kill by a signal restarts in the job on the same node, not drained."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    run, pid_file = RunDir(tmp_path), tmp_path / "rank.pid"
    fake = AgentKilled(in_job_spec(tmp_path), pid_file)
    try:
        done = fake.run(launcher_module.Start("41", 0, 1, "n1", 0, ("n1",)), gpus=0)
        assert process_exited(int(pid_file.read_text()))  # ended with its agent, not left on
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError, OSError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert done["restarts"] == 0 and fake.rounds == 2
    assert fake_slurm.requeued == [] and fake_slurm.drained == []
    events = ledger.read(run.ledger)
    blamed = [(e.get("node"), e.get("evidence"), e.get("drained")) for e in events
              if e.kind == "blamed"]  # fmt: skip
    assert blamed == [("n1", str(Evidence.SIGNAL), False)]
    assert [e.get("left_out") for e in events if e.kind == "restarted"] == [[]]
    assert failures.read_exits(StartFiles(run, "41", 0), 1)[0].returncode == -signal.SIGKILL


def test_only_this_starts_processes_on_this_node_are_its_leftovers(tmp_path):
    """``lifecycle.leftovers`` matches a process by the start and save dir in its environment
    and, on a host several nodes share (the local cluster), by its node."""
    env = {**os.environ, "HPC_TRAIN_SAVE_DIR": str(tmp_path), "HPC_TRAIN_START": "41.2:1"}
    others = [{"SLURMD_NODENAME": "n1"}, {"HPC_TRAIN_START": "41.1:1"},
              {"HPC_TRAIN_SAVE_DIR": "/elsewhere"}]  # fmt: skip
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**env, "SLURMD_NODENAME": "n3", **o}) for o in [{}, *others]]  # fmt: skip
    try:
        found = lifecycle.leftovers(tmp_path, ("41.2", 1), "n3")
        assert found == [procs[0].pid]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert lifecycle.leftovers(tmp_path, ("41.2", 1), "n3") == []  # gone (zombies count too)


def spares_spec(tmp_path: Path) -> JobSpec:
    return JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
        recovery=Recovery(spares=1),
        watch=Watch(no_watchdog=True),
    )


def test_a_blamed_node_is_replaced_by_the_hot_spare_at_the_same_width(
    tmp_path, fake_slurm, monkeypatch
):
    """--nodes 2 --spares 1 on n1-n3: n1, n2 train, n3 stands by. n2's torchrun is killed and
    n2 blamed and drained (the verdict: say, its machine's second blame): task 0 restarts in the job on n1 and n3 (two nodes again, no requeue), records
    the swap, and gives n2 back to Slurm once its task has ended."""
    from hpc_train.contract import NodeReport, RoundAction, read_verdict, write_node_report

    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    run = RunDir(tmp_path)
    write_node_report(run, "41", 0, NodeReport(1, "n2", 0))
    write_node_report(run, "41.1", 0, NodeReport(1, "n3", 0))  # the spare, as a member
    failures.write_exit(StartFiles(run, "41", 0), failures.NodeExit(1, "n2", -9))
    fake = FailsOnce(spares_spec(tmp_path))
    blamed_before(run, "n2")  # its kill by a signal drains it: its machine's second blame
    first = starts.allocation_start("41", 0, ("n1", "n2", "n3"), 0, spares=1)
    assert first is not None and first.standby == ("n3",)
    done = fake.run(first, gpus=0)
    assert done["restarts"] == 0 and fake_slurm.requeued == []
    assert fake.rounds == [("n1", "n2"), ("n1", "n3")]
    verdict = read_verdict(run, "41", 0)
    assert verdict is not None and verdict.action == RoundAction.RESTART_IN_JOB
    assert (verdict.members, verdict.standby) == (["n1", "n3"], [])
    events = ledger.read(run.ledger)
    (restarted,) = [e for e in events if e.kind == "restarted"]
    assert restarted.get("spare_in") == ["n3"] and restarted.get("left_out") == ["n2"]
    assert [e.get("spares") for e in events if e.kind == "started"] == [["n3"], None]
    assert [e.get("world") for e in events if e.kind == "started"] == [2, 2]
    # n2, left out, goes back to Slurm once its task has ended (task 0's release thread)
    assert fake_slurm.released == []  # its launcher has not said so
    write_launcher_beat(run, "41", 0, LauncherBeat(1, "n2", 1, 0.0, ENDED))
    wait_until(lambda: fake_slurm.released or None, "n2's release", timeout=10, backoff=FAST)
    assert fake_slurm.released == [("41", "n2")]


def test_a_hot_spare_waits_joins_the_round_that_takes_it_and_ends_when_the_run_does(
    tmp_path, fake_slurm
):
    """n3 stands by: round 0 restarts without it (it waits on), round 1 takes it in (it trains
    as task 1 of round 2); another spare is released by task 0's ``done``."""
    from hpc_train.contract import RoundAction, RoundVerdict, write_verdict

    run = RunDir(tmp_path)
    write_verdict(
        run, "41", 0, RoundVerdict(RoundAction.RESTART_IN_JOB, "crash", ["n1", "n2"], ["n3"])
    )
    write_verdict(
        run, "41.1", 0, RoundVerdict(RoundAction.RESTART_IN_JOB, "hang: n2", ["n1", "n3"], [])
    )
    write_decision(run, "41.2", 0, StartDecision([], 0, world_size=2, batch_per_device=1,
                                                 update_freq=1))  # fmt: skip
    spare = launcher_module.Start("41", 2, 3, "n1", 0, ("n1", "n2", "n3"))
    fake = FailsOnce(spares_spec(tmp_path))
    fake.code, fake.rounds = 0, [("first",)]  # exits 0: the round it joined finishes
    done = fake._stand_by(spare, gpus=0, trains=2)
    assert done["restarts"] == 0 and "spare" not in done
    assert fake.rounds[1:] == [("n1", "n3")]
    write_verdict(run, "42", 0, RoundVerdict(RoundAction.DONE, "max-update reached", [], ["n3"]))
    other = launcher_module.Start("42", 2, 3, "n1", 0, ("n1", "n2", "n3"))
    assert (
        FakeTorchrun(spares_spec(tmp_path), 1)._stand_by(other, gpus=0, trains=2)["spare"] is True
    )


def test_task_0_releases_its_spares_when_the_run_finishes(tmp_path, fake_slurm, monkeypatch):
    from hpc_train.contract import NodeReport, RoundAction, read_verdict, write_node_report

    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    write_node_report(RunDir(tmp_path), "41", 0, NodeReport(1, "n2", 0))
    first = starts.allocation_start("41", 0, ("n1", "n2", "n3"), 0, spares=1)
    FakeTorchrun(spares_spec(tmp_path), 0).run(first, gpus=0)
    verdict = read_verdict(RunDir(tmp_path), "41", 0)
    assert verdict is not None and verdict.action == RoundAction.DONE and verdict.standby == ["n3"]


def test_the_last_nodes_of_the_allocation_are_the_spares_and_refill_tops_up_to_the_width():
    assert starts.allocation_start("41", 2, ("n1", "n2", "n3"), 0, spares=1) is None
    one = starts.allocation_start("41", 1, ("n1", "n2", "n3"), 0, spares=1)
    assert one == starts.Start("41", 1, 2, "n1", 0, ("n1", "n2"), 0, ("n3",))
    plain = starts.allocation_start("41", 1, ("n1", "n2"), 3, spares=0)
    assert plain == starts.Start("41", 1, 2, "n1", 3, ("n1", "n2"))
    assert restart_policy.refill(["n1"], ["n3", "n4"], 2) == (["n1", "n3"], ["n4"])
    assert restart_policy.refill(["n1", "n2"], ["n3"], 2) == (["n1", "n2"], ["n3"])  # nobody blamed
    assert restart_policy.refill(["n1"], [], 3) == (
        ["n1"],
        [],
    )  # no spare left: narrower (or requeue)


def grew_at(tmp_path: Path, restart: int) -> None:
    """Task 0 of start ``restart`` grew: its grow watch sent the notice (``_own_notice``) and
    submitit called ``checkpoint()``, which records the stop and the requeue."""
    launcher = launcher_module.Launcher(spec_in(tmp_path))
    launcher._begin(start(restart=restart))
    launcher._own_notice.send(Cause.GROW, "41")  # the fake Slurm records the USR2
    launcher.checkpoint()  # no workers: they have exited


def test_a_grow_on_the_last_allowed_restart_spends_no_restart(tmp_path, fake_slurm):
    """--max-restarts 2: two failures (restarts 1 and 2), then a grow from start 3 (restart 2):
    Slurm's count says 3, yet the grown start is no failure restart: it trains, and it still
    fails on a crash (no restart left), not before."""
    grew_at(tmp_path, restart=2)
    (stop,) = [e for e in ledger.read(RunDir(tmp_path).ledger) if e.kind == "stopped"]
    assert stop.get("cause") == "grow"
    spec = spec_in(tmp_path, max_restarts=2)
    assert FakeTorchrun(spec, 0).restarts_spent(start(restart=3)) == 2
    assert FakeTorchrun(spec, 0).run(start(restart=3), gpus=0)["restarts"] == 3
    with pytest.raises(RuntimeError, match=r"no restarts left \(--max-restarts 2\)"):
        FakeTorchrun(spec, 1).run(start(restart=3), gpus=0)
    with pytest.raises(RuntimeError, match="restart budget exhausted"):
        FakeTorchrun(spec, 0).run(start(restart=4), gpus=0)  # a failure's restart: counted


def test_only_grows_before_this_start_are_left_out_of_the_budget(tmp_path, fake_slurm):
    """A grow recorded at this start or later (another job's ledger lines too) is not one of
    the requeues Slurm counted before it."""
    grew_at(tmp_path, restart=1)
    ledger.record(RunDir(tmp_path).ledger, "stopped", "99", 0, cause="grow")
    launcher = launcher_module.Launcher(spec_in(tmp_path))
    assert launcher.restarts_spent(start(restart=1)) == 1
    assert launcher.restarts_spent(start(restart=2)) == 1


def test_straggler_eviction_asks_the_one_budget_with_in_job_restarts_in_it(
    tmp_path, fake_slurm, monkeypatch
):
    """--max-restarts 1, spent by an in-job restart (Slurm's count still 0): the straggler
    thread may name a node but not evict it, as no restart is left to resume without it."""
    ledger.record(RunDir(tmp_path).ledger, "restarted", "41", 0, round=1)
    spec = spec_in(tmp_path, max_restarts=1)
    spec = dataclasses.replace(
        spec, recovery=dataclasses.replace(spec.recovery, evict_stragglers=True)
    )
    asked: list[bool] = []
    monkeypatch.setattr(lifecycle.straggler_monitor, "watch",
                        lambda files, start, limits, evict, *rest: asked.append(evict))  # fmt: skip
    FakeTorchrun(spec, 0).run(start(), gpus=0)
    assert asked == [False]


def test_the_spot_watch_polls_at_the_planners_interval_unless_told(tmp_path, monkeypatch):
    """costs.SPOT_POLL_S owns the default (the planner counts a notice seen that late)."""
    polled: list[float] = []

    class Watcher:
        def __init__(self, on_notice, log, endpoint, interval_s):
            polled.append(interval_s)

        def start(self):
            pass

    monkeypatch.setattr(lifecycle, "SpotWatcher", Watcher)
    monkeypatch.setattr(lifecycle, "endpoint_to_watch", lambda: "http://127.0.0.1:9")
    monkeypatch.setattr(lifecycle.costs, "SPOT_POLL_S", 7.5)
    monkeypatch.delenv("HPC_TRAIN_SPOT_POLL_S", raising=False)
    lifecycle.watch_spot("41")
    monkeypatch.setenv("HPC_TRAIN_SPOT_POLL_S", "1")
    lifecycle.watch_spot("41")
    assert polled == [7.5, 1.0]


def test_only_task_0_asks_slurm_whether_the_job_was_cancelled(tmp_path, fake_slurm):
    """Issue 46: every node asked `scontrol show job` after a non-zero exit (39 look-ups at 39
    nodes). Now task 0 alone asks (one look-up per job); its cancel verdict (``DONE``) is
    every other launcher's answer: task 1, its torchrun failed with no SIGTERM first (Slurm
    says CANCELLED, unasked), follows that word and ends well without a look-up of its own."""
    from hpc_train.contract import RoundAction, read_verdict

    fake_slurm.state = "CANCELLED"
    FakeTorchrun(in_job_spec(tmp_path), 1).run(start(task=0), gpus=0)
    assert fake_slurm.jobs_asked == ["41"] and fake_slurm.requeued == []
    verdict = read_verdict(RunDir(tmp_path), "41", 0)  # task 0's word to everyone, no spares
    assert verdict is not None and verdict.action == RoundAction.DONE
    assert "cancelled" in verdict.why
    write_decision(RunDir(tmp_path), "41", 0, StartDecision([], 0, world_size=2,
                                                            batch_per_device=1, update_freq=1))  # fmt: skip
    done = FakeTorchrun(in_job_spec(tmp_path), 1).run(two_nodes(1), gpus=0)
    assert "left_out" not in done and fake_slurm.jobs_asked == ["41"]  # task 1 asked nothing


def test_a_cancel_is_told_from_a_crash_on_every_task_by_its_signals(tmp_path, fake_slurm):
    """scancel's SIGTERM with no notice before it is a cancel on task 1 too, without asking
    Slurm; task 1's crash with no SIGTERM is not, and asks Slurm nothing either."""
    write_decision(RunDir(tmp_path), "41", 0, StartDecision([], 0, world_size=1,
                                                            batch_per_device=1, update_freq=1))  # fmt: skip
    out = FakeTorchrun(spec_in(tmp_path), 1, term=True).run(start(task=1), gpus=0)
    assert out["restarts"] == 0 and fake_slurm.requeued == []  # the task ends well: cancelled
    with pytest.raises(RuntimeError, match="task 0 decides on a requeue"):
        FakeTorchrun(spec_in(tmp_path), 1).run(start(task=1), gpus=0)
    assert fake_slurm.jobs_asked == []
