"""The job spec: one validated value that carries a run from the CLI to every rank.

The submit CLI builds it, ``--dry-run`` renders from it, submitit pickles it into the job, and the
launcher reads it on every (re)start. Nothing here imports torch, fairseq or submitit.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from hpc_train import batch, presets
from hpc_train.environment import INSTANCE_TYPES


class SpecError(ValueError):
    """Bad input for a run; the message is one line meant for the user."""


@dataclass(frozen=True)
class JobSpec:
    preset: str
    data: Path
    save_dir: Path
    nodes_min: int = 1
    nodes_max: int = 1
    gpus_per_node: int = 8
    partition: str | None = None
    time_min: int = 24 * 60
    global_batch: int | None = None  # None: the preset's
    max_update: int | None = None  # None: the preset's
    instance_type: str = "p3dn.24xlarge"
    job_name: str = "hpc-train"
    max_restarts: int = 20
    keep_checkpoints: int = 3
    cpus_per_task: int | None = None
    preflight: bool = False  # all-reduce health check on the allocation before training
    extra_args: tuple[str, ...] = field(default=())

    @property
    def recipe(self) -> presets.Preset:
        return presets.get(self.preset)

    @property
    def sequences_per_update(self) -> int:
        return self.global_batch if self.global_batch is not None else self.recipe.global_batch

    @property
    def updates(self) -> int:
        return self.max_update if self.max_update is not None else self.recipe.max_update

    @property
    def log_dir(self) -> Path:
        """Where Slurm/submitit write the per-task logs of this run."""
        return self.save_dir / "slurm"

    @property
    def train_log(self) -> Path:
        """fairseq's metrics log (rank 0), one file across restarts."""
        return self.save_dir / "train.log"  # written by hpc_train.train

    @property
    def nodes_arg(self) -> str:
        """Slurm's --nodes value: ``N`` or ``MIN-MAX`` for an elastic run."""
        if self.nodes_min == self.nodes_max:
            return str(self.nodes_min)
        return f"{self.nodes_min}-{self.nodes_max}"

    def ranks_per_node(self, gpu: bool) -> int:
        return self.gpus_per_node if gpu and self.gpus_per_node > 0 else 1


def parse_nodes(text: str) -> tuple[int, int]:
    """``"2"`` → (2, 2); ``"1-4"`` → (1, 4). SpecError when malformed or below 1."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not m:
        raise SpecError(f"--nodes {text!r}: expected N or MIN-MAX, e.g. 2 or 1-4")
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) else low
    if low < 1:
        raise SpecError(f"--nodes {text}: at least 1 node is needed")
    if high < low:
        raise SpecError(f"--nodes {text}: MAX is smaller than MIN")
    return low, high


def parse_time(text: str) -> int:
    """Slurm time formats → minutes: ``90``, ``H:MM:SS``, ``D-HH[:MM[:SS]]``."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise SpecError(f"--time {text!r}: expected minutes, H:MM:SS or D-HH:MM:SS")
    days, first, second, third = (int(g) if g else None for g in m.groups())
    if days is None and second is None:
        minutes = first  # plain minutes
    elif days is None and third is None:
        minutes = first + (second or 0) / 60  # MM:SS
    elif days is None:
        minutes = first * 60 + (second or 0) + (third or 0) / 60  # H:MM:SS
    else:
        minutes = days * 1440 + first * 60 + (second or 0) + (third or 0) / 60
    total = max(1, round(minutes))
    return total


def is_binarized(data: Path) -> bool:
    """A fairseq-preprocess'ed masked-LM corpus: dict.txt and train.{bin,idx}."""
    return all((data / name).is_file() for name in ("dict.txt", "train.bin", "train.idx"))


def check_data(data: Path) -> None:
    if not data.exists():
        raise SpecError(f"--data {data}: no such directory")
    if not is_binarized(data):
        raise SpecError(
            f"--data {data}: not a binarized fairseq corpus (needs dict.txt, train.bin, "
            "train.idx; prepare one with `python -m hpc_train.data`)"
        )


def check_writable(save_dir: Path) -> None:
    """The save dir, or the nearest directory that would hold it, must be writable."""
    probe = save_dir
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise SpecError(f"--save-dir {save_dir}: not writable ({probe} is not a writable dir)")


def validate(spec: JobSpec, check_paths: bool = True) -> batch.BatchPlan:
    """Check everything that can be checked before submitting; return the largest-world plan.

    Raises SpecError (one line). ``check_paths=False`` skips the data and save-dir checks
    (``--dry-run`` on a machine without the data).
    """
    try:
        recipe = spec.recipe
    except ValueError as err:
        raise SpecError(str(err)) from None
    if spec.nodes_min < 1 or spec.nodes_max < spec.nodes_min:
        raise SpecError(f"--nodes {spec.nodes_arg}: need 1 <= MIN <= MAX")
    if spec.gpus_per_node < 0:
        raise SpecError("--gpus-per-node must be >= 0 (0: CPU ranks, one per node)")
    if spec.gpus_per_node and spec.instance_type not in INSTANCE_TYPES:
        known = ", ".join(sorted(INSTANCE_TYPES))
        raise SpecError(f"--instance-type {spec.instance_type}: unknown (known: {known})")
    if spec.updates < 1:
        raise SpecError("--max-update must be >= 1")
    if spec.sequences_per_update < 1:
        raise SpecError("--global-batch must be >= 1")
    if spec.max_restarts < 0 or spec.keep_checkpoints < 1:
        raise SpecError("--max-restarts must be >= 0 and --keep-checkpoints >= 1")
    world = spec.nodes_max * spec.ranks_per_node(gpu=True)
    try:
        plan = batch.plan(spec.sequences_per_update, recipe.batch_per_device, world)
    except ValueError as err:
        raise SpecError(f"--global-batch: {err}") from None
    if check_paths:
        check_data(spec.data)
        check_writable(spec.save_dir)
    return plan
