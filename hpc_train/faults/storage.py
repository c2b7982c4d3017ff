"""Whether a failure is a storage failure, and whose (``classify``: pure), and the probe of the
save dir that feeds it (``probe``).

A storage failure is the save dir's file system refusing a write: ENOSPC (full), EDQUOT (over a
user, group or project quota: FSx for Lustre has all three), EROFS (read-only), EIO (on FSx for
Lustre, what a client the servers evicted sees, on that node only, until it reconnects). It is
never a user error (the code is fine) and not a node's fault unless only that node sees it.

The evidence, none of it a file that had to be written to the failed file system:

- the ranks' failure reports (``contract.FailureRecord``): the errno found anywhere in the
  exception's chain and the file it names; a report said on stderr because it could not be
  written (``agent_exit.Tee.failures``) is the same record;
- a probe of the save dir on each node (``probe``): the free space and inodes (``hpc_core.space``)
  and a test write of a small file, removed; compared with the bytes a checkpoint needs.

``classify`` (None: no storage failure, the other classes apply):

- a report whose errno is ENOSPC, EDQUOT or EROFS (unless it names a file outside the save dir),
  or EIO naming a file in the save dir; or a probe that cannot write, or finds less room than a
  checkpoint needs: storage. A rank that left no report at all (its report lost with the file
  system) is no crash when its node's probe fails: storage.
- EIO or EROFS seen on some nodes while the others' probes write and find room: those nodes'
  (``Storage.node_only``: a client evicted, not the file system). ENOSPC and EDQUOT are the file
  system's whatever node saw them: its capacity and its quotas are the same from every node.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpc_core import space
from hpc_train.contract import FailureRecord

STORAGE_ERRNOS = {
    errno.ENOSPC: "full",
    errno.EDQUOT: "over its quota",
    errno.EROFS: "read-only",
    errno.EIO: "failing with I/O errors",
}
CAPACITY = frozenset({errno.ENOSPC, errno.EDQUOT})  # the file system's, from every node alike
PROBE_PREFIX = ".hpc-train-probe-"


@dataclass(frozen=True)
class Probe:
    """What one node found at the save dir: its room (None: ``statvfs`` failed) and whether a
    small file could be written there (``errno`` None: it could)."""

    node: str
    path: Path
    free_bytes: int | None
    free_inodes: int | None
    errno: int | None = None
    error: str | None = None

    def fails(self, needed: int | None) -> bool:
        """Did it fail to write, or find less room than ``needed`` bytes?"""
        if self.errno is not None or self.error is not None or self.free_bytes is None:
            return True
        return needed is not None and self.free_bytes < needed


def probe(save_dir: Path, node: str) -> Probe:
    """Look at ``save_dir`` from this node: its room, then a test write of a few bytes (fsynced,
    removed). Never raises; leaves no file behind (a failed write leaves none to remove)."""
    try:
        room = space.of(save_dir)
    except OSError as err:
        return Probe(node, save_dir, None, None, err.errno, f"{type(err).__name__}: {err}")
    try:
        with tempfile.NamedTemporaryFile(dir=room.path, prefix=PROBE_PREFIX) as fh:
            fh.write(b"hpc-train probe")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        return Probe(node, save_dir, room.free_bytes, room.free_inodes, err.errno,
                     f"{type(err).__name__}: {err}")  # fmt: skip
    return Probe(node, save_dir, room.free_bytes, room.free_inodes)


@dataclass(frozen=True)
class Storage:
    """A storage failure: what the file system did (``errno``), where, the figures, who saw it;
    ``node_only``: only ``nodes`` see it while the others write fine (those nodes' fault)."""

    errno: int | None  # None: no errno survived; a probe found the file system short or failing
    path: Path
    nodes: tuple[str, ...]
    node_only: bool
    free_bytes: int | None
    needed_bytes: int | None

    @property
    def what(self) -> str:
        if self.errno in STORAGE_ERRNOS:
            return f"{STORAGE_ERRNOS[self.errno]} ({errno.errorcode[self.errno]})"
        return "short of room for a checkpoint"

    def line(self) -> str:
        """One line: the path, what it did, the free space, the space a checkpoint needs."""
        free = (
            "free space unknown"
            if self.free_bytes is None
            else f"{space.size(self.free_bytes)} free"
        )
        need = (
            ""
            if self.needed_bytes is None
            else f", a checkpoint needs {space.size(self.needed_bytes)}"
        )
        whose = f"on {', '.join(self.nodes)} only: that node's, not the file system's" if (
            self.node_only) else f"seen on {', '.join(self.nodes) or 'no node'}"  # fmt: skip
        return f"storage: {self.path} is {self.what}: {free}{need}; {whose}"


def _in(path: str | None, save_dir: Path) -> bool | None:
    """Is ``path`` in ``save_dir`` (None: no path to tell)?"""
    if not path:
        return None
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(save_dir))


def storage_errno(record: FailureRecord, save_dir: Path) -> int | None:
    """The report's errno when it is the save dir's storage failing (see the module docs)."""
    number, inside = record.errno, _in(record.errno_path, save_dir)
    if number not in STORAGE_ERRNOS or inside is False:
        return None
    return number if number != errno.EIO or inside else None


def classify(
    reports: Sequence[FailureRecord],
    probes: Sequence[Probe],
    save_dir: Path,
    needed: int | None = None,
) -> Storage | None:
    """Is this a storage failure, and whose (see the module docstring)? ``needed``: the bytes a
    checkpoint takes (the last one's, or the preset's estimate)."""
    seen = [(r.node or f"rank {r.rank}", n) for r in reports if (n := storage_errno(r, save_dir))]
    failing = [p for p in probes if p.fails(needed)]
    if not seen and not failing:
        return None
    nodes = tuple(dict.fromkeys([node for node, _ in seen] + [p.node for p in failing]))
    fine = [p for p in probes if not p.fails(needed) and p.node not in nodes]
    number = seen[0][1] if seen else next((p.errno for p in failing if p.errno), None)
    node_only = (
        bool(fine)
        and number not in CAPACITY
        and not any(
            p.free_bytes is not None and needed is not None and p.free_bytes < needed
            for p in failing
        )
    )
    free = [p.free_bytes for p in probes if p.free_bytes is not None]
    return Storage(number, save_dir, nodes, node_only, min(free) if free else None, needed)
