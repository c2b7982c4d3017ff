"""Checkpoint files in the save dir: atomic writes, verification, fallback, safe loading.

Atomic: fairseq writes its first file through ``<name>.tmp`` + rename without fsync and then
*copies* it in place (O_TRUNC) to ``checkpoint_last.pt``; a kill during that copy leaves a
truncated ``checkpoint_last.pt`` that crashes the next start. In the training worker
``install_atomic_writes()`` replaces both steps: write to a temporary file, fsync, rename, fsync
the directory; the other names are hard links made the same way (a copy where links fail). At any
moment each name holds either the old or the new checkpoint, whole.

Fallback: before a (re)start, ``choose_resume`` checks ``checkpoint_last.pt``; a missing, empty or
unreadable one is moved aside (never deleted) and the newest valid ``checkpoint_E_U.pt`` is
resumed instead (fairseq's ``--continue-once``).

Trust decision: a fairseq checkpoint is a pickle. Since torch 2.6, ``torch.load`` only unpickles
tensors and allow-listed globals. Rather than switching that off
(``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``), hpc-train allow-lists exactly the classes fairseq's
checkpoints and its rank-to-rank state broadcast contain (argparse / omegaconf config objects).
A checkpoint that needs anything else is refused. The save dir is still trusted not to hold a
crafted file that abuses those classes; keep it writable only by the training user.
"""

from __future__ import annotations

import argparse
import collections
import os
import typing
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_core import rundir
from hpc_core.rundir import LAST
from hpc_train.worker import lean_import


def allowed_globals() -> list[Any]:
    """The globals fairseq 0.12 checkpoints need (measured with
    ``torch.serialization.get_unsafe_globals_in_checkpoint``)."""
    lean_import.import_fairseq()  # task 0's launcher too: without scikit-learn and SciPy
    from fairseq.distributed.utils import _TensorPlaceholder
    from omegaconf import base, dictconfig, listconfig, nodes

    return [
        _TensorPlaceholder,  # stands for tensors in rank 0's broadcast of the loaded state
        argparse.Namespace,  # the legacy args stored in every fairseq checkpoint
        dictconfig.DictConfig,  # cfg, when rank 0 broadcasts the loaded state to other ranks
        listconfig.ListConfig,
        base.ContainerMetadata,
        base.Metadata,
        nodes.AnyNode,
        nodes.StringNode,
        nodes.IntegerNode,
        nodes.FloatNode,
        nodes.BooleanNode,
        typing.Any,
        collections.defaultdict,
        dict,
        list,
        int,
    ]


def allow_fairseq_globals() -> None:
    """Allow-list those globals for every ``torch.load`` in this process (fairseq's included)."""
    import torch

    torch.serialization.add_safe_globals(allowed_globals())


def load(path: Path | str, mmap: bool = False) -> dict[str, Any]:
    """Load a fairseq checkpoint on the CPU with weights_only=True and the allow-list
    (``mmap=True``: tensors stay on disk until touched, cheap for multi-GB files)."""
    import torch

    with torch.serialization.safe_globals(allowed_globals()):
        return torch.load(Path(path), map_location="cpu", weights_only=True, mmap=mmap)


def num_updates(state: dict[str, Any]) -> int:
    """The update counter a checkpoint was saved at."""
    return int(state["optimizer_history"][-1]["num_updates"])


# --- atomic writes ----------------------------------------------------------------------------


def atomic_save(obj: Any, path: Path | str) -> None:
    """torch.save through ``rundir.atomic_writer`` (temp sibling, fsync, rename, dir fsync)."""
    import torch

    with rundir.atomic_writer(path) as fh:
        torch.save(obj, fh)


def install_atomic_writes() -> None:
    """Route fairseq's checkpoint writes and copies through the atomic versions above."""
    from fairseq import checkpoint_utils

    def persistent_save(obj: Any, filename: str, async_write: bool = False) -> None:
        atomic_save(obj, filename)

    checkpoint_utils.torch_persistent_save = persistent_save
    checkpoint_utils.PathManager.copy = staticmethod(rundir.atomic_copy)


# --- verification and fallback ----------------------------------------------------------------


def inspect(path: Path) -> tuple[str | None, int]:
    """(None, num_updates) if ``path`` is a loadable fairseq checkpoint, else (reason, 0).

    Checks the zip container (a truncated file has no central directory), then loads it with
    mmap (cheap even for multi-GB files) under weights_only and the allow-list.
    """
    if not path.exists():
        return "missing", 0
    if path.stat().st_size == 0:
        return "empty (0 bytes)", 0
    if not zipfile.is_zipfile(path):
        return "not a torch zip archive (truncated or garbage)", 0
    try:
        state = load(path, mmap=True)
        updates = num_updates(state)
        if "model" not in state:
            return "no model weights in it", 0
    except Exception as err:  # any failure to load is a reason to fall back
        return f"does not load: {type(err).__name__}: {str(err).splitlines()[0][:120]}", 0
    return None, updates


def remove_partial_writes(run: rundir.RunDir) -> list[Path]:
    """Delete temporaries of writes that were killed half-way (never a whole checkpoint)."""
    stale = run.partial_writes()
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


@dataclass(frozen=True)
class ResumePoint:
    """What a (re)start resumes from."""

    continue_from: Path | None  # an interval checkpoint for --continue-once, or None
    moved_aside: Path | None  # where a bad checkpoint_last.pt went
    reason: str  # why, for the log
    at_update: int = 0  # the update the resumed checkpoint was saved at

    def fairseq_args(self) -> list[str]:
        return ["--continue-once", str(self.continue_from)] if self.continue_from else []


def choose_resume(save_dir: Path) -> ResumePoint:
    """Decide what to resume from; move a bad checkpoint_last.pt aside (never delete it)."""
    run = rundir.RunDir(save_dir)
    last = run.checkpoint_last
    remove_partial_writes(run)
    moved = None
    problem: str | None
    if not last.exists():
        if not run.interval_checkpoints():
            return ResumePoint(None, None, "fresh start: no checkpoint yet")
        problem = "missing"
    else:
        problem, updates = inspect(last)
        if problem is None:
            return ResumePoint(None, None, f"resume from {last.name}", at_update=updates)
        moved = run.bad_last()
        os.replace(last, moved)
    for candidate in run.interval_checkpoints():
        bad, updates = inspect(candidate)
        if bad is None:
            why = f"{LAST} {problem}: resume from {candidate.name}"
            return ResumePoint(candidate, moved, why, at_update=updates)
    return ResumePoint(
        None, moved, f"{LAST} {problem} and no valid interval checkpoint: fresh start"
    )
