"""Helpers for integration tests that submit real jobs to the local Slurm cluster."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpc_core import slurm
from hpc_core.rundir import RunDir
from hpc_core.wait import wait_until
from hpc_train import testing as rehearsal
from hpc_train.runs import follow, logparse
from hpc_train.testing import STEADY  # tests poll at a steady 0.5 s


class Runs:
    """Submit tiny runs through the real CLI and watch them."""

    def __init__(self, corpus: Path, root: Path) -> None:
        self.corpus = corpus
        self.root = root

    def submit(
        self,
        name: str,
        max_update: int,
        nodes: str = "2",
        fairseq: Sequence[str] = (),
        env: dict[str, str] | None = None,
        save: Path | None = None,
        extra_cli: Sequence[str] = (),
        pace_s: float = 0.0,
    ) -> tuple[str, Path]:
        save = save or self.root / name
        job = rehearsal.submit_tiny(
            self.corpus, save, max_update, name, nodes, extra_cli, fairseq, env, pace_s=pace_s
        )
        return job, save

    @staticmethod
    def summary(save: Path) -> logparse.RunSummary:
        return follow.run_summary(RunDir(save))

    @staticmethod
    def wait_for_update(save: Path, update: int, timeout: float = 300) -> int:
        return rehearsal.wait_for_update(RunDir(save), update, timeout)

    @staticmethod
    def wait_for(what: str, predicate, timeout: float = 300):
        """``predicate``'s first true answer."""
        return wait_until(predicate, what, timeout=timeout, backoff=STEADY)

    @staticmethod
    def wait_idle_nodes(count: int, timeout: float = 300) -> None:
        """Wait until `count` nodes are idle (jobs of earlier tests may still be completing)."""
        Runs.wait_for(f"{count} idle nodes", lambda: slurm.idle_nodes("low") >= count, timeout)

    @staticmethod
    def wait_running(job_id: str, timeout: float = 300) -> slurm.JobState:
        return slurm.wait_for_job(job_id, lambda s: s.state == "RUNNING", timeout, STEADY)

    @staticmethod
    def wait_done(job_id: str, timeout: float = 600) -> slurm.JobState:
        return slurm.wait_for_job(job_id, timeout=timeout)

    @staticmethod
    def wait_processes_gone(job_id: str, timeout: float = 120) -> None:
        """Wait until no process on this host belongs to the job (``SLURM_JOB_ID`` in its
        environment: the launchers, torchrun, the ranks of every emulated node). A requeue,
        had a task's launcher decided on one, is asked for before that launcher ends."""
        Runs.wait_for(f"the end of job {job_id}'s processes",
                      lambda: not rehearsal.job_alive(job_id), timeout)  # fmt: skip

    @staticmethod
    def give_back(node: str) -> None:
        """A test's ``finally``: resume ``node`` where a blame drained it (or Slurm marked it
        down), for the next tests. A node nobody drained is left as it is: Slurm refuses to
        resume it, and that refusal would hide the test's own failure."""
        state = slurm.node_info(node).get("State", "")
        if "DRAIN" in state or "DOWN" in state:
            slurm.resume(node)

    @staticmethod
    def trained_updates(save: Path) -> list[int]:
        """Update numbers of the per-update loss lines (run with --log-interval 1)."""
        return [n for n, _ in Runs.summary(save).losses]

    @staticmethod
    def launcher_log(save: Path, job: str) -> str:
        """Every task's launcher output for ``job`` (submitit's ``JOB_TASK_log.out``)."""
        return "".join(p.read_text() for p in RunDir(save).task_logs(job))

    @staticmethod
    def explain(save: Path, job: str, lines: int = 40) -> str:
        """What a failing test prints: the launchers' own lines and the train log's tail."""
        ours = [ln for ln in Runs.launcher_log(save, job).splitlines() if "hpc-train" in ln]
        path = RunDir(save).train_log
        tail = path.read_text().splitlines()[-lines:] if path.exists() else ["(no train.log)"]
        return "\n".join(["launcher:", *ours, "train.log tail:", *tail])

    @staticmethod
    def notices(save: Path) -> list[int]:
        text = RunDir(save).train_log.read_text()
        return [int(m) for m in re.findall(r"saved on notice at update (\d+)", text)]


@pytest.fixture(scope="session")
def runs(slurm_cluster, corpus, tmp_path_factory) -> Runs:
    return Runs(corpus, tmp_path_factory.mktemp("runs"))
