"""The run directory (``--save-dir``): every path under it, the files the launcher and the
workers exchange, and the one way to write a file whole.

    <save-dir>/
      train.log                  fairseq's metrics (rank 0), one file across restarts
      checkpoint_last.pt         what every (re)start resumes from
      checkpoint_E_U.pt          interval checkpoints (the fallback)
      checkpoint_last.pt.bad-*   a checkpoint_last.pt that failed verification, kept aside
      slurm/                     submitit's per-task logs and pickles
      preflight/                 the all-reduce check's output (``--preflight``)
      .hpc-train/
        resume-<job>-<restart>.json   task 0's resume decision for that start
        stopped-<job>-<restart>.json  a worker's stop marker: it saved on notice at an update

Writes are atomic: a temporary sibling, fsync, rename, fsync of the directory. A reader sees the
old file or the new one, whole, never a mix; a write killed half-way leaves only a ``.*.tmp``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

TRAIN_LOG = "train.log"
LAST = "checkpoint_last.pt"
INTERVAL_RE = re.compile(r"checkpoint_(\d+)_(\d+)\.pt")
STATE = ".hpc-train"
# Set by the launcher in each worker's environment: the worker's stop marker, as a value.
STOP_MARKER_ENV = "HPC_TRAIN_STOP_MARKER"


# --- atomic writes ----------------------------------------------------------------------------


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_sibling(path: Path) -> Path:
    """``.<name>.<pid>.tmp`` beside ``path``: hidden, unique per writer, easy to clean up."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextmanager
def atomic_writer(path: Path | str, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary sibling for writing; on success fsync it, rename it over ``path`` and
    fsync the directory. On an exception the temporary is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        with open(tmp, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def atomic_write(path: Path | str, data: str | bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (see ``atomic_writer``)."""
    with atomic_writer(path, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def atomic_copy(src: Path | str, dst: Path | str, overwrite: bool = True) -> bool:
    """Make ``dst`` a whole copy of ``src`` atomically: hard link (or copy + fsync), rename."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and not overwrite:
        return False
    tmp = temp_sibling(dst)
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)  # same inode, no second write of gigabytes
        except OSError:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(dst.parent)
    return True


# --- what the launcher and the workers exchange ------------------------------------------------


@dataclass(frozen=True)
class StopMarker:
    """A worker saved ``checkpoint_last.pt`` at ``update`` on a notice and stopped."""

    update: int
    signal: str | None  # the notice's signal name; None when a peer rank had it
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class ResumeDecision:
    """Task 0's decision for one start, which every node follows."""

    args: list[str]  # fairseq arguments (``--continue-once PATH`` for a fallback)
    at_update: int  # the update the resumed checkpoint was saved at (0: fresh start)
    reason: str = ""


def _write_json(path: Path, value: Any) -> None:
    atomic_write(path, json.dumps(asdict(value)))


def write_stop(path: Path, marker: StopMarker) -> None:
    """Record a save on notice at ``path`` (the worker gets the path from its launcher)."""
    _write_json(path, marker)


@dataclass(frozen=True)
class RunDir:
    """The layout of one save dir; every path under it comes from here."""

    root: Path

    @property
    def train_log(self) -> Path:
        return self.root / TRAIN_LOG

    @property
    def slurm_logs(self) -> Path:
        """Where Slurm/submitit write the per-task logs of this run."""
        return self.root / "slurm"

    @property
    def preflight(self) -> Path:
        return self.root / "preflight"

    @property
    def state(self) -> Path:
        return self.root / STATE

    @property
    def checkpoint_last(self) -> Path:
        return self.root / LAST

    def task_log(self, job_id: str, task: int, stream: str = "out") -> Path:
        """submitit's log of one task (``stream``: out or err); requeues append to it."""
        return self.slurm_logs / f"{job_id}_{task}_log.{stream}"

    def interval_checkpoints(self) -> list[Path]:
        """``checkpoint_E_U.pt`` files, newest update first."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(2)), p) for p in self.root.glob("checkpoint_*_*.pt")
                 if (m := INTERVAL_RE.fullmatch(p.name))]  # fmt: skip
        return [p for _, p in sorted(found, key=lambda t: t[0], reverse=True)]

    def bad_last(self) -> Path:
        """Where a checkpoint_last.pt that failed verification is moved (never deleted)."""
        return self.root / f"{LAST}.bad-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"

    def partial_writes(self) -> list[Path]:
        """Temporaries of checkpoint writes that were killed half-way."""
        return sorted(self.root.glob(".checkpoint*.tmp")) if self.root.is_dir() else []

    def stop_marker(self, job_id: str, restart: int) -> Path:
        return self.state / f"stopped-{job_id}-{restart}.json"

    def resume_decision(self, job_id: str, restart: int) -> Path:
        return self.state / f"resume-{job_id}-{restart}.json"

    def read_stop(self, job_id: str, restart: int) -> StopMarker | None:
        path = self.stop_marker(job_id, restart)
        return StopMarker(**json.loads(path.read_text())) if path.exists() else None

    def write_decision(self, job_id: str, restart: int, decision: ResumeDecision) -> None:
        _write_json(self.resume_decision(job_id, restart), decision)

    def read_decision(self, job_id: str, restart: int) -> ResumeDecision | None:
        path = self.resume_decision(job_id, restart)
        return ResumeDecision(**json.loads(path.read_text())) if path.exists() else None
