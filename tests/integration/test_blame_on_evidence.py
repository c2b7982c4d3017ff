"""Blame on evidence (issue 30 item 7), replayed on the local Slurm, which replaces no node: the
soak's schedule (a notice, a rank killed once with SIGKILL, a hang, a torchrun killed with
SIGKILL) on ``--nodes 2 --spares 1 --restart-in-job`` drains only the hung node (a hang with no
Python stack), leaves the two killed ones in the run, and the run goes on."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train import chaos
from hpc_train.faults.suspects import Evidence

pytestmark = pytest.mark.slurm

PER_UPDATE = ("--log-interval", "1", "--save-interval-updates", "10")
# the schedule's faults come faster than its saves (every 10 updates): on a loaded machine each
# restart may resume from the notice's save, and the no-progress guard (its own tests) would
# stop the run at the fourth; it is off here
CLI = (
    "--spares", "1", "--restart-in-job", "--hang-timeout-floor", "10", "--hang-factor", "10",
    "--hang-save-timeout", "60", "--hang-startup-timeout", "180",
    "--max-no-progress-restarts", "0",
)  # fmt: skip
# on the node, through srun --overlap: SIGKILL one rank of the job, or its torchrun agent
KILL = """
import os, signal, sys
from hpc_train import chaos
job, node, what = sys.argv[1:]
pid = chaos.ranks_here(job, node)[0] if what == "rank" else chaos.agent_here(job, node)
os.kill(pid, signal.SIGKILL)
"""


def _kill(job: str, node: str, what: str) -> None:
    slurm.run(["srun", f"--jobid={job}", "--overlap", f"--nodelist={node}", "-N1", "-n1",
               sys.executable, "-c", KILL, job, node, what], timeout=60)  # fmt: skip


def _events(save: Path) -> list[ledger.Event]:
    return ledger.read(RunDir(save).ledger)


def _training(save: Path) -> list[str]:
    """The nodes of the latest start or in-job round (not its spare): task 0's first."""
    starts = [e for e in _events(save) if e.kind == "started" and e.get("nodes")]
    return list(starts[-1].get("nodes"))


def _resumed(runs, save: Path, after: int, what: str) -> None:
    """Wait for the run to train again: a first update of a start or round after the
    ``after``-th."""

    def trained() -> bool:
        return len([e for e in _events(save) if e.kind == "first_update"]) > after

    runs.wait_for(f"training again after {what}", trained, 240)


def test_the_soak_schedule_drains_only_the_hung_node_and_the_run_goes_on(runs):
    runs.wait_idle_nodes(3)
    # trains until the test cancels it, paced (chaos pace, <= 10 updates/s): CPU left to others
    job, save = runs.submit("blame-evidence", 200_000, nodes="2", fairseq=PER_UPDATE,
                            extra_cli=CLI, pace_s=0.1)  # fmt: skip
    runs.wait_running(job)
    runs.wait_for_update(save, 20)
    try:
        chaos.notice(job)  # saved on notice, requeued: Slurm's one restart
        _resumed(runs, save, 1, "the notice")
        killed = _training(save)[1]  # not task 0's node: its launcher decides for the run
        _kill(job, killed, "rank")
        _resumed(runs, save, 2, f"a rank killed on {killed}")
        assert killed in _training(save), runs.explain(save, job)  # restarted on it, not without
        chaos.hang(job, killed)
        _resumed(runs, save, 3, f"a hang on {killed}")
        other = _training(save)[1]  # the hot spare, in the hung node's place
        _kill(job, other, "torchrun")
        _resumed(runs, save, 4, f"torchrun killed on {other}")
        states = slurm.partition_nodes("low")
        state = slurm.job_state(job)
    finally:
        with contextlib.suppress(slurm.SlurmError):
            slurm.cancel(job)
        for node in slurm.partition_nodes("low"):
            with contextlib.suppress(slurm.SlurmError):
                slurm.resume(node)
    events = _events(save)
    blamed = [(e.get("node"), e.get("evidence"), e.get("drained")) for e in events
              if e.kind == "blamed"]  # fmt: skip
    assert blamed == [
        (killed, str(Evidence.SIGNAL), False),
        (killed, str(Evidence.HANG_NO_STACK), True),
        (other, str(Evidence.SIGNAL), False),
    ], runs.explain(save, job)
    left_out = [e.get("left_out") for e in events if e.kind == "restarted"]
    assert left_out == [[], [killed], []]
    usable = [n for n, s in states.items() if slurm.node_usable(s)]
    assert len(usable) >= 2 and killed not in usable, states
    assert state.state == "RUNNING" and state.restarts == 1, state  # the run goes on
