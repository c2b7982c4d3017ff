"""Helpers for integration tests that submit real jobs to the local Slurm cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from hpc_train import logs, slurm


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
    ) -> tuple[str, Path]:
        save = save or self.root / name
        cmd = [
            sys.executable, "-m", "hpc_train.submit", "--preset", "tiny", "--nodes", nodes,
            "--gpus-per-node", "0", "--data", str(self.corpus), "--save-dir", str(save),
            "--max-update", str(max_update), "--time", "10", "--job-name", name, *extra_cli,
        ]  # fmt: skip
        if fairseq:
            cmd += ["--", *fairseq]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
        )
        assert proc.returncode == 0, proc.stderr
        return re.search(r"submitted job (\d+)", proc.stdout).group(1), save

    @staticmethod
    def summary(save: Path) -> logs.RunSummary:
        path = save / "train.log"
        return logs.summarize(path.read_text().splitlines() if path.exists() else [])

    def wait_for_update(self, save: Path, update: int, timeout: float = 300) -> int:
        deadline = time.monotonic() + timeout
        while (n := self.summary(save).updates) < update:
            assert time.monotonic() < deadline, f"no update {update} in {timeout:.0f} s (at {n})"
            time.sleep(0.5)
        return n

    @staticmethod
    def wait_for(what: str, predicate, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.5)

    @staticmethod
    def wait_idle_nodes(count: int, timeout: float = 300) -> None:
        """Wait until `count` nodes are idle (jobs of earlier tests may still be completing)."""

        def idle() -> int:
            out = slurm.run(["sinfo", "-h", "-p", "low", "-t", "idle", "-o", "%D"])
            return sum(int(n) for n in out.split())

        Runs.wait_for(f"{count} idle nodes", lambda: idle() >= count, timeout)

    @staticmethod
    def wait_running(job_id: str, timeout: float = 300) -> slurm.JobState:
        deadline = time.monotonic() + timeout
        while (state := slurm.job_state(job_id)).state != "RUNNING":
            assert time.monotonic() < deadline, f"job {job_id} not running: {state}"
            time.sleep(0.5)
        return state

    @staticmethod
    def wait_done(job_id: str, timeout: float = 600) -> slurm.JobState:
        deadline = time.monotonic() + timeout
        while not (state := slurm.job_state(job_id)).finished:
            assert time.monotonic() < deadline, f"job {job_id} still {state.state}"
            time.sleep(1)
        return state

    @staticmethod
    def trained_updates(save: Path) -> list[int]:
        """Update numbers of the per-update loss lines (run with --log-interval 1)."""
        return [n for n, _ in Runs.summary(save).losses]

    @staticmethod
    def notices(save: Path) -> list[int]:
        text = (save / "train.log").read_text()
        return [int(m) for m in re.findall(r"saved on notice at update (\d+)", text)]


@pytest.fixture(scope="session")
def runs(slurm_cluster, corpus, tmp_path_factory) -> Runs:
    return Runs(corpus, tmp_path_factory.mktemp("runs"))
