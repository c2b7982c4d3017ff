"""Tiered saves (``--local-save-dir``): periodic checkpoints land on node-local disk first.

``contract.LOCAL_SAVE_DIR`` (set by the launcher) names this run's directory on the node's local disk
(``RunDir.local_tier``). The background writer (``hpc_train.worker.async_save``) hands a periodic save
to ``write_then_copy``: the snapshot is written to the local disk (atomic, durable there), then
that file is copied to the save dir with the same protocol (``copy_durable``: temp, fsync,
verified, rename, dir fsync; always the bytes, never a link), then the node's older local
checkpoints are deleted (``prune``: it keeps the newest only). The copy's verification reads it
back (its CRCs and the digest recorded as the local file was written: ``hpc_core.integrity``);
a copy that does not match never gets its name: the local file is set aside, and the snapshot,
held until then, is written to the save dir directly. The writer then makes fairseq's extra names.
Still one save in flight, and everything that waits for "durable" (``async_save.flush``,
``when_durable``: the stop marker, the ledger's event, the launcher) waits for the copy in the
save dir: nothing ever believes in a checkpoint that is only local. Resume reads the save dir
only (``checkpoints.choose_resume``). A save on notice (``preemption.saving_on_notice``) skips
the local disk: it is written straight to the save dir, as without tiers. A local dir that
cannot be made or written at start-up (``usable``), or a local write that fails (disk full,
``write_then_copy`` returns None), logs one line and the saves go straight to the save dir from
then on: a save is never lost to the local tier.

The trade-off. The training stall is the snapshot either way (plus the wait for the previous
save); what the tier changes is the background work: the bytes are written twice and read once
more (the local file is in the page cache, so the read is cheap), and a save becomes durable in
the save dir later than with a direct write (local write + copy). What it buys on FSx for
Lustre (~150 MB/s for a whole 1.2 TiB file system): ``torch.save``'s stream of small writes, and
its serialization of the snapshot, run against fast NVMe; the shared file system sees one
sequential copy in large blocks, the pattern it streams best (and the copy's verification reads
it back: one more read, from the page cache); and a save that fails on
the shared side is still whole on the node. It does not yet let the next snapshot start while
the copy runs (one save in flight), nor does a restart read the local copy.

This module knows nothing of the writer (``async_save`` imports it, never the reverse) and
imports neither torch nor fairseq.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc_core import integrity
from hpc_core.rundir import RunDir, atomic_writer

logger = logging.getLogger("hpc_train.worker.local_tier")

# Set by the launcher with ``--local-save-dir``: this run's directory on node-local disk.
COPY_BLOCK = 16 << 20  # the copy to the save dir reads and writes in blocks this large


def problem(directory: Path) -> str | None:
    """Why ``directory`` cannot take checkpoints (None: it can): it is made when missing, and a
    probe file written and fsynced in it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory) as fh:
            fh.write(b"probe")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None


def usable(directory: Path | None) -> Path | None:
    """The local tier the launcher asked for (``contract.WorkerEnv.local_save_dir``), if it is
    usable; one line logged when it is not (the saves then go straight to the save dir)."""
    if directory is None:
        return None
    found = problem(directory)
    if found is not None:
        logger.warning(f"local save dir {directory} unusable ({found}): saving to the save dir")
        return None
    for stale in RunDir(directory).partial_writes():  # a local write killed half-way
        stale.unlink(missing_ok=True)
    logger.info(f"tiered saves: written to {directory} first, then copied to the save dir")
    return directory


def copy_durable(src: Path, dst: Path) -> None:
    """``dst`` a whole, durable, verified copy of ``src`` (``rundir.atomic_writer``: temp, fsync,
    verified (``integrity.refuse_copy``: its CRCs and the digest recorded when ``src`` was
    written), rename, dir fsync). The bytes are copied, never hard-linked: the save dir must not
    share the local disk's inode (on one file system, as in the tests, a link would succeed).
    CorruptCheckpoint when the copy does not verify: ``dst`` is untouched."""
    with open(src, "rb") as source, atomic_writer(dst, check=integrity.refuse_copy) as fh:
        shutil.copyfileobj(source, fh, COPY_BLOCK)


def prune(keep: Path) -> None:
    """Delete the checkpoints in ``keep``'s directory other than ``keep`` (the newest)."""
    for old in RunDir(keep.parent).checkpoint_files():
        if old != keep:
            old.unlink(missing_ok=True)


def write_then_copy(
    write: Callable[[Any, str], None], held: list[Any], local: Path, target: Path
) -> tuple[float, float] | None:
    """Write ``held[0]`` (the snapshot) to ``local`` with ``write``, copy it to ``target``,
    prune the older local files; (write seconds, copy seconds). ``held`` is emptied once the
    copy has verified. A local write that fails (OSError), or a copy that does not verify (the
    local file set aside, never deleted), logs one line and returns None with ``held`` intact:
    the caller writes the snapshot to ``target`` itself and stops using the tier."""
    started = time.monotonic()
    try:
        write(held[0], str(local))
    except OSError as err:
        logger.warning(
            f"local save dir {local.parent} unusable ({type(err).__name__}: {err}): "
            "saving to the save dir directly from now on"
        )
        return None
    written = time.monotonic()
    try:
        copy_durable(local, target)
    except integrity.CorruptCheckpoint as err:
        aside = integrity.set_aside(local, str(err))
        logger.error(
            f"{err}: copied from {local}, set aside as {aside.moved_to}; {target.name} written "
            "to the save dir directly, and every save after it"
        )
        return None
    held.clear()
    copy_s = time.monotonic() - written
    prune(local)
    return written - started, copy_s
