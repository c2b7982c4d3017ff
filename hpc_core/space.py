"""Free space where a run writes: a file system's free bytes and inodes, and the sentence that
says what is short.

The one owner of the figures that ``submit``, each checkpoint save, the storage probe
(``hpc_train.faults.storage``), ``status`` and ``doctor`` report: ``os.statvfs`` of the path, or of
its nearest existing directory (a save dir not made yet is made on its parent's file system):
``f_bavail * f_frsize`` bytes (what an unprivileged writer can still use: the blocks kept for
root excluded) and ``f_favail`` inodes (None where the file system keeps no count: never short).
On FSx for Lustre a user or project quota can be lower than the file system's free space; the
file system's figures cannot show it (``lfs quota`` can), and a write over quota fails with
EDQUOT, which ``faults.storage`` reads as storage.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# a run's own files: per start a few per rank (heartbeats, stacks, reports), per save a few; this
# many lasts hundreds of starts of 8-GPU nodes
MIN_FREE_INODES = 10_000


@dataclass(frozen=True)
class Space:
    """A file system's room, as seen at ``path`` (the directory measured)."""

    path: Path
    free_bytes: int
    free_inodes: int | None  # None: the file system keeps no count
    total_bytes: int

    def describe(self) -> str:
        inodes = "" if self.free_inodes is None else f", {self.free_inodes:,} inodes"
        return f"{size(self.free_bytes)} free of {size(self.total_bytes)}{inodes} ({self.path})"


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a save dir not made yet)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def of(path: Path) -> Space:
    """The room of the file system ``path`` is (or will be made) on; OSError when even that
    cannot be asked (an evicted Lustre client, a file system gone)."""
    where = nearest_existing(path)
    st = os.statvfs(where)
    inodes = st.f_favail if st.f_files else None
    return Space(where, st.f_bavail * st.f_frsize, inodes, st.f_blocks * st.f_frsize)


def size(n: float) -> str:
    """Bytes for people: 4.47 GB, 812.3 MB, 3 kB (powers of 1000, as ``df -H``)."""
    for unit, scale, places in (("TB", 1e12, 2), ("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 0)):
        if abs(n) >= scale:
            return f"{n / scale:.{places}f} {unit}"
    return f"{n:.0f} B"


def set_aside_note(aside: Sequence[Path]) -> str:
    """The checkpoints set aside in a dir (they take space until a person deletes them)."""
    sizes = []
    for path in aside:
        try:
            sizes.append(f"{path.name} ({size(path.stat().st_size)})")
        except OSError:
            continue
    return (
        f"; set aside there, taking space until you delete them: {', '.join(sizes)}"
        if sizes
        else ""
    )


def short(
    room: Space, needed: int, aside: Sequence[Path] = (), inodes: int = MIN_FREE_INODES
) -> str | None:
    """What is short for ``needed`` bytes and ``inodes`` inodes in ``room``, in one clause
    naming the place and the figures; None when it fits."""
    said = []
    if room.free_bytes < needed:
        said.append(f"{size(room.free_bytes)} free, {size(needed)} needed")
    if room.free_inodes is not None and room.free_inodes < inodes:
        said.append(f"{room.free_inodes:,} inodes free, {inodes:,} wanted")
    if not said:
        return None
    return f"{room.path}: {'; '.join(said)}{set_aside_note(aside)}"


class NoSpace(OSError):
    """A write refused before it began: the room is short (errno ENOSPC, the path named)."""

    def __init__(self, what: str, path: Path, shortfall: str) -> None:
        super().__init__(errno.ENOSPC, f"no space for {what}: {shortfall}", str(path))
