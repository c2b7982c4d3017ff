"""Slurm's silence is no answer (issue 46), on the real local Slurm: a rank killed while
slurmctld is stopped. Before, the launcher's probe whether a step still starts on the node said
"no" to the silence, SlurmdTimeout went unread and fell back to 300 s, and the wait never probed
again: the restart began 236-255 s after slurmctld answered again. Now task 0 asks again with
back-off while Slurm is silent and decides as soon as it answers."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train import chaos

pytestmark = pytest.mark.slurm

PER_UPDATE = ("--log-interval", "1", "--save-interval-updates", "10")
GOAL_S = 30.0  # from slurmctld answering again to the restart's decision (the goal)


def started_at(pidfile: Path) -> float:
    """When the process in ``pidfile`` started (seconds since the epoch, from /proc)."""
    pid = pidfile.read_text().strip()
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))  # fmt: skip
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def test_a_rank_killed_while_slurmctld_is_stopped_restarts_once_it_answers(
    runs, restart_local_cluster
):
    max_update = 80
    job, save = runs.submit("silence", max_update, fairseq=PER_UPDATE, pace_s=0.1)
    nodes = slurm.hostnames(runs.wait_running(job).nodes)
    runs.wait_for_update(save, 15)
    victim = nodes[-1]
    chaos.stop_local_slurmctld()
    try:
        assert slurm.unreachable() is not None  # silent now
        (rank, *_) = chaos.ranks_here(job, victim)
        os.kill(rank, signal.SIGKILL)  # the failure, while nobody can ask Slurm
        # the outage lasts until task 0 has asked about the node again, unanswered, twice
        runs.wait_for(
            "task 0 asking again while Slurm is silent",
            lambda: runs.launcher_log(save, job).count("Slurm does not answer") >= 2,
            180,
        )
    finally:
        restart_local_cluster()
    answered = started_at(chaos._local_pidfile("slurmctld"))  # before it could answer: strict
    assert slurm.unreachable() is None and answered > time.time() - 120
    requeued = runs.wait_for(
        "the requeue",
        lambda: next((e for e in ledger.read(RunDir(save).ledger)
                      if e.kind == Kind.REQUEUED and e.time > answered - 60), None),
        300,
    )  # fmt: skip
    final = runs.wait_done(job, timeout=600)
    log = runs.launcher_log(save, job)
    assert requeued.time - answered <= GOAL_S, (requeued.time - answered, runs.explain(save, job))
    assert "waiting up to 300 s" not in log  # never the fallback
    assert final.state == "COMPLETED", (final, runs.explain(save, job))
    assert runs.summary(save).updates == max_update
    blamed = [e for e in ledger.read(RunDir(save).ledger) if e.kind == Kind.BLAMED]
    assert [(e.get("node"), e.get("drained")) for e in blamed] == [(victim, False)]  # a kill
