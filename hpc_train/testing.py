"""Rehearsals: a tiny run submitted and watched as a user would, for the integration tests and
the benchmarks. Not part of the product.

``submit_tiny`` submits through the real CLI (``python -m hpc_train.submit``), then
``wait_for_update`` waits on the run's train.log and ``wait_for_event`` on its ledger, each
through ``hpc_core.wait.wait_until`` (a deadline, a steady poll).

No module of ``hpc_train``, ``hpc_core`` or ``nccl_checks`` imports this one: import-linter's
contract "Product code never imports the rehearsal helpers" (pyproject.toml) checks it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hpc_core import ledger, procs
from hpc_core.rundir import RunDir
from hpc_core.slurm_env import JOB_ID
from hpc_core.wait import Backoff, wait_until
from hpc_train import contract
from hpc_train.runs import follow

STEADY = Backoff(0.5, 1.0, 0.5)  # rehearsals poll at a steady 0.5 s


def submit_tiny(
    data: Path,
    save: Path,
    max_update: int,
    name: str,
    nodes: str = "2",
    options: Sequence[str] = (),
    fairseq: Sequence[str] = (),
    env: dict[str, str] | None = None,
    time_min: int = 10,
    pace_s: float = 0.0,
) -> str:
    """Submit the tiny preset on CPU nodes through the real CLI (``python -m hpc_train.submit``
    with ``options``, then ``-- fairseq``); the job id. RuntimeError with the CLI's error.
    ``pace_s``: every update takes at least that long (``chaos JOB pace``, asked before the
    submission: a run sized in seconds, not for the fastest machine)."""
    contract.ask_pace(RunDir(save), pace_s)
    cmd = [
        sys.executable, "-m", "hpc_train.submit", "--preset", "tiny", "--nodes", nodes,
        "--gpus-per-node", "0", "--data", str(data), "--save-dir", str(save),
        "--max-update", str(max_update), "--time", str(time_min), "--job-name", name, *options,
    ]  # fmt: skip
    if fairseq:
        cmd += ["--", *fairseq]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )
    found = re.search(r"submitted job (\d+)", proc.stdout)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"submit failed: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return found.group(1)


def job_alive(job_id: str, **env: str) -> bool:
    """Does a process on this host belong to ``job_id`` (``SLURM_JOB_ID`` in its environment,
    and each of ``env``, e.g. ``SLURM_PROCID="2"``: one task's; ``hpc_core.procs``)? The
    launchers, torchrun and the ranks of every emulated node run here."""
    return next(procs.carrying({JOB_ID: job_id, **env}), None) is not None


def wait_for_update(run: RunDir, update: int, timeout: float, backoff: Backoff = STEADY) -> int:
    """Wait until train.log shows ``update`` trained; the highest update logged by then."""

    def reached() -> int | None:
        n = follow.run_summary(run).updates
        return n if n >= update else None

    return wait_until(reached, f"update {update} in {run.root}", timeout, backoff)


def wait_for_event(
    run: RunDir,
    what: str,
    match: Callable[[ledger.Event], bool],
    timeout: float | None,
    backoff: Backoff = STEADY,
) -> ledger.Event:
    """Wait until the run's ledger holds an event ``match`` accepts; the first such event.
    ``match`` may raise to give up early (the job ended without it)."""

    def found() -> ledger.Event | None:
        return next((e for e in ledger.read(run.ledger) if match(e)), None)

    return wait_until(found, what, timeout, backoff)
