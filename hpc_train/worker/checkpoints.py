"""Checkpoint files in the save dir: atomic writes, verification, fallback, safe loading.

Atomic: fairseq writes its first file through ``<name>.tmp`` + rename without fsync and then
*copies* it in place (O_TRUNC) to ``checkpoint_last.pt``; a kill during that copy leaves a
truncated ``checkpoint_last.pt`` that crashes the next start. In the training worker
``install_atomic_writes()`` replaces both steps: write to a temporary file, fsync, rename, fsync
the directory; the other names are hard links made the same way (a copy where links fail). At any
moment each name holds either the old or the new checkpoint, whole.

Verified (``hpc_core.integrity``): every file is sealed as it is written (``integrity.seal``:
its records' CRC32s read back and its digest recorded in the zip's comment, before the rename);
a copy is verified before it takes its name (``atomic_copy``'s copies, the local tier's). What a start resumes from is checked
twice: task 0 (``choose_resume``, before the start) checks what is cheap: the end record and the
digest record in place, the pickle loads (mmap) with model weights and an update; then the rank
that loads it (``install_verified_loads``: fairseq's ``load_checkpoint_to_cpu``) reads every
byte once for the CRC32 of every record and the digest, on other threads beside the load, and
nothing trains until both are done. A file that fails either is set aside (``integrity.set_aside``:
renamed ``<name>.bad-<time>-<pid>``, never deleted), with its reason in the log and the ledger
(``Kind.SET_ASIDE``); so is every other name of the same inode (fairseq's extra names are hard
links: one file). Task 0 then resumes from the newest checkpoint that passes (fairseq's
``--continue-once``); a rank that finds its file bad raises ``CorruptCheckpoint`` before any
update, and the next start resumes from the newest good one.

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
import contextlib
import logging
import time
import typing
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_core import integrity, ledger, rundir, space
from hpc_core.ledger import Kind
from hpc_core.rundir import LAST
from hpc_train.worker import lean_import

logger = logging.getLogger("hpc_train.worker.checkpoints")
# a checkpoint's pickle, record headers and directory: under 1 MB for roberta-large (0.5 MB of
# pickle, ~100 B of header and 64 B of alignment per record, ~1,200 records); room to spare
OVERHEAD_BYTES = 4 << 20


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


def warm() -> None:
    """Import what ``inspect`` loads a checkpoint with (torch, fairseq's globals): 1.7-4 s and
    ~270 MB of a process, once. Task 0's launcher asks it where nothing waits on it (while the
    other nodes report at a resume, while its ranks train), so that the decision after a
    failure, on the critical path of every in-job round and requeue, finds them imported. An
    import that fails here fails again where it is needed, and is said there."""
    with contextlib.suppress(Exception):
        allowed_globals()


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


def state_bytes(obj: Any) -> int:
    """The bytes ``torch.save`` writes for ``obj``: its tensors' storages (one shared by several
    tensors once), plus ``OVERHEAD_BYTES`` for the pickle, the record headers and the directory."""
    import torch

    seen: dict[tuple[int, str], int] = {}
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            seen[(storage.data_ptr(), str(value.device))] = storage.nbytes()
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    return sum(seen.values()) + OVERHEAD_BYTES


def room_for(path: Path, needed: int) -> None:
    """``space.NoSpace`` (ENOSPC, with the figures and what is set aside there) when ``path``'s
    file system cannot take ``needed`` bytes: refused before a byte is written, the checkpoints
    already there untouched. A file system that cannot be asked is left to the write."""
    try:
        room = space.of(path.parent)
    except OSError:
        return
    found = space.short(room, needed, rundir.RunDir(path.parent).set_aside_files(), inodes=2)
    if found is not None:
        raise space.NoSpace(path.name, path, found)


def atomic_save(obj: Any, path: Path | str) -> str | None:
    """torch.save through ``rundir.atomic_writer`` (temp sibling, fsync, rename, dir fsync),
    sealed before the rename (``integrity.seal``: every record's CRC32 read back, the digest
    recorded in the file); the digest. Refused first when the file system has no room for it
    (``room_for``)."""
    import torch

    room_for(Path(path), state_bytes(obj))
    with rundir.atomic_writer(path) as fh:
        torch.save(obj, fh)
        fh.flush()
        return integrity.seal(Path(fh.name))


def verified_copy(src: Path | str, dst: Path | str, overwrite: bool = True) -> bool:
    """``rundir.atomic_copy`` whose copies (never its links) are verified before the rename."""
    return rundir.atomic_copy(src, dst, overwrite, check=integrity.refuse_copy)


def install_atomic_writes() -> None:
    """Route fairseq's checkpoint writes and copies through the atomic versions above."""
    from fairseq import checkpoint_utils

    def persistent_save(obj: Any, filename: str, async_write: bool = False) -> None:
        atomic_save(obj, filename)

    checkpoint_utils.torch_persistent_save = persistent_save
    checkpoint_utils.PathManager.copy = staticmethod(verified_copy)


# --- verification and fallback ----------------------------------------------------------------


def inspect(path: Path) -> tuple[str | None, int]:
    """(None, num_updates) if ``path`` looks like a whole fairseq checkpoint, else (reason, 0).

    What is cheap, for task 0 before a start: the end record and the digest record where they
    belong (a truncated file has neither: ``integrity.end_problem``), then a load with mmap
    (the pickle only, cheap even for multi-GB files) under weights_only and the allow-list. The
    CRCs and the digest are checked as the rank loads it (``load_verified``)."""
    if not path.exists():
        return "missing", 0
    problem = integrity.end_problem(path)
    if problem is None and not zipfile.is_zipfile(path):
        problem = "not a torch zip archive (truncated or garbage)"
    if problem is not None:
        return problem, 0
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
    set_aside: tuple[integrity.SetAside, ...]  # the checkpoints that failed, moved aside on the way
    reason: str  # why, for the log
    at_update: int = 0  # the update the resumed checkpoint was saved at
    held: str = ""  # non-empty: checkpoints were written but none verifies: never a fresh start

    def fairseq_args(self) -> list[str]:
        return ["--continue-once", str(self.continue_from)] if self.continue_from else []


def _inode(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


def _first_good(
    run: rundir.RunDir, candidates: list[Path], aside: list[integrity.SetAside]
) -> tuple[Path, int] | None:
    """The first of ``candidates`` that passes ``inspect`` and is no other name of a file set
    aside (a hard link: the same bytes); each that fails is set aside into ``aside``."""
    bad = {_inode(p): p.name for p in run.set_aside_files()}
    for candidate in candidates:
        if not candidate.exists():
            continue
        twin = bad.get(_inode(candidate))
        problem, updates = (f"the same file (inode) as {twin}", 0) if twin else inspect(candidate)
        if problem is None:
            return candidate, updates
        aside.append(integrity.set_aside(candidate, problem))
        bad[_inode(aside[-1].moved_to)] = aside[-1].moved_to.name
    return None


def choose_resume(save_dir: Path) -> ResumePoint:
    """Decide what to resume from: ``checkpoint_last.pt``, else the newest interval checkpoint
    that passes; every one that fails on the way is set aside (never deleted)."""
    run = rundir.RunDir(save_dir)
    last = run.checkpoint_last
    remove_partial_writes(run)
    if not last.exists() and not run.interval_checkpoints():
        if earlier := run.set_aside_files():  # every one failed before: not a fresh start
            names = ", ".join(p.name for p in earlier)
            why = f"no checkpoint left but those set aside ({names})"
            return ResumePoint(None, (), why, held=f"{why}; restore a good one, or delete them "
                               "to start from scratch")  # fmt: skip
        return ResumePoint(None, (), "fresh start: no checkpoint yet")
    aside: list[integrity.SetAside] = []
    found = _first_good(run, [last], aside)
    if found is not None:
        return ResumePoint(None, (), f"resume from {LAST}", at_update=found[1])
    problem = aside[0].why if aside else "missing"
    found = _first_good(run, run.interval_checkpoints(), aside)
    if found is not None:
        why = f"{LAST} {problem}: resume from {found[0].name}"
        return ResumePoint(found[0], tuple(aside), why, at_update=found[1])
    why = f"{LAST} {problem} and no interval checkpoint verifies; each set aside"
    held = f"{why}; restore a good one, or delete them to start from scratch"
    return ResumePoint(None, tuple(aside), why, held=held)


# --- the rank's load, verified ----------------------------------------------------------------


def load_verified(
    path: Path, load: Callable[[], Any]
) -> tuple[Any, integrity.IntegrityCheck, float]:
    """``load()`` (the state in ``path``) with ``integrity.verify(path)`` beside it on other
    threads: the file's bytes are read for both at once, mostly from the page cache (the
    second reader finds what the first brought in); (state, check, the load's seconds). A file
    that fails is set aside and ``integrity.CorruptCheckpoint`` raised, the state thrown away."""
    with ThreadPoolExecutor(1, thread_name_prefix="verify") as pool:
        checking = pool.submit(integrity.verify, path)
        began = time.monotonic()
        try:
            state = load()
        except Exception as err:
            check = checking.result()
            if check.ok:
                raise
            raise refused(path, check) from err
        load_s = time.monotonic() - began
        check = checking.result()
    if not check.ok:
        raise refused(path, check)
    return state, check, load_s


def refused(path: Path, check: integrity.IntegrityCheck) -> integrity.CorruptCheckpoint:
    """``path`` set aside for what ``check`` found; the error that says so (``aside``)."""
    aside = integrity.set_aside(path, check.problem or "failed verification")
    err = integrity.CorruptCheckpoint(
        f"{path.name} failed verification ({aside.why}); set aside as {aside.moved_to.name}: "
        "the next start resumes from the newest checkpoint that verifies"
    )
    err.aside = aside
    return err


def install_verified_loads(run: rundir.RunDir, start: tuple[str, int] | None, rank: int) -> None:
    """Every checkpoint fairseq loads (``checkpoint_utils.load_checkpoint_to_cpu``: the resume
    on rank 0, every rank with ``--load-checkpoint-on-all-dp-ranks``) through ``load_verified``;
    rank 0 records what it verified (``Kind.VERIFIED``) or set aside (``Kind.SET_ASIDE``)."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_checkpoint_to_cpu

    def note(kind: Kind, **data: Any) -> None:
        if start is not None and rank == 0:
            ledger.record(run.ledger, kind, *start, **data)

    def verified_load(path: str, *args: Any, **kwargs: Any) -> Any:
        try:
            state, check, load_s = load_verified(Path(path), lambda: load(path, *args, **kwargs))
        except integrity.CorruptCheckpoint as err:
            if (aside := err.aside) is not None:
                logger.error(f"checkpoint {aside.describe()}")
                note(Kind.SET_ASIDE, file=aside.file, moved_to=str(aside.moved_to), why=aside.why)
            raise
        logger.info(f"verified {check.describe()}; the load took {load_s:.2f} s beside it")
        note(Kind.VERIFIED, file=check.path.name, update=num_updates(state), sha256=check.sha256,
             bytes=check.bytes, verify_s=round(check.seconds, 3), load_s=round(load_s, 3))  # fmt: skip
        return state

    checkpoint_utils.load_checkpoint_to_cpu = verified_load
