"""Data preparation as a Slurm job: the same command on one whole node (``--exclusive``, as the
seed's ``srun --exclusive -n 1 preprocess.sh``), its log beside ``--out``, followed to its end."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hpc_train.data import manifest
from hpc_train.runs.follow import follow_job

JOB_NAME = "hpc-train-data"
# options that only say how to submit (or to show what would be); the job runs without them
SUBMIT_FLAGS = ("--submit", "--follow", "--dry-run")
SUBMIT_OPTIONS = ("--partition", "--time")


def job_argv(argv: Sequence[str]) -> list[str]:
    """The command line the job runs: ``argv`` without the options about submitting it."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in SUBMIT_FLAGS or ("=" in arg and arg.split("=", 1)[0] in SUBMIT_OPTIONS):
            continue
        elif arg in SUBMIT_OPTIONS:
            skip = True
        else:
            out.append(arg)
    return out


def log_pattern(out: Path) -> Path:
    """Where the job's output goes (``%j``: the job id), beside the corpus."""
    return out.absolute().parent / f"{out.name}.prepare-%j.log"


def sbatch_args(
    out: Path, command: Sequence[str], partition: str | None, minutes: int | None
) -> list[str]:
    args = [
        "--job-name", JOB_NAME, "--nodes", "1", "--ntasks", "1", "--exclusive", "--mem", "0",
        "--output", str(log_pattern(out)), "--chdir", str(Path.cwd()),
    ]  # fmt: skip
    if partition:
        args += ["--partition", partition]
    if minutes:
        args += ["--time", str(minutes)]
    return [*args, "--wrap", shlex.join(command)]


def command(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "hpc_train.data", *job_argv(argv)]


def follow(job_id: str, out: Path, say: Callable[[str], None] = print) -> int:
    """Print the job's state changes and its log until it ends; 0 if it completed."""
    log = Path(str(log_pattern(out)).replace("%j", job_id))
    state = follow_job(job_id, log, say, say)
    ready = (out / manifest.NAME).is_file()
    ok = state.state == "COMPLETED" or (state.state == "GONE" and ready)
    say(f"job {job_id} {state.state}: " + (f"corpus ready in {out}" if ok else "no corpus"))
    return 0 if ok else 1
