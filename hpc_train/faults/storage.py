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
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpc_core import space
from hpc_core.ledger import Event, Kind
from hpc_train.contract import FailureRecord

STORAGE_ERRNOS = {
    errno.ENOSPC: "full",
    errno.EDQUOT: "over its quota",
    errno.EROFS: "read-only",
    errno.EIO: "failing with I/O errors",
}
CAPACITY = frozenset({errno.ENOSPC, errno.EDQUOT})  # the file system's, from every node alike
PROBE_PREFIX = ".hpc-train-probe-"
QUOTA_UNKNOWN = "quota unknown (no `lfs quota` on this node)"
QUOTA_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 30.0


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
    quota: str = QUOTA_UNKNOWN  # what ``lfs quota`` says of this user here (``quota``)

    def fails(self, needed: int | None) -> bool:
        """Did it fail to write, or find less room than ``needed`` bytes?"""
        if self.errno is not None or self.error is not None or self.free_bytes is None:
            return True
        return needed is not None and self.free_bytes < needed


def probe(save_dir: Path, node: str, timeout: float = PROBE_TIMEOUT_S) -> Probe:
    """Look at ``save_dir`` from this node: its room, then a test write of a few bytes (fsynced,
    removed), and the user's quota there (``quota``). Never raises; leaves no file behind (a
    failed write leaves none to remove). A file system that does not answer in ``timeout``
    seconds (a Lustre client blocked on its servers) fails the probe; the look goes on in a
    daemon thread."""
    found: list[Probe] = []
    looking = threading.Thread(target=lambda: found.append(_look(save_dir, node)), daemon=True,
                               name="storage-probe")  # fmt: skip
    looking.start()
    looking.join(timeout)
    if found:
        return found[0]
    return Probe(node, save_dir, None, None, None, f"no answer from {save_dir} in {timeout:.0f} s")


def _look(save_dir: Path, node: str) -> Probe:
    try:
        room = space.of(save_dir)
    except OSError as err:
        return Probe(node, save_dir, None, None, err.errno, f"{type(err).__name__}: {err}")
    limit = quota(room.path)
    try:
        with tempfile.NamedTemporaryFile(dir=room.path, prefix=PROBE_PREFIX) as fh:
            fh.write(b"hpc-train probe")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        return Probe(node, save_dir, room.free_bytes, room.free_inodes, err.errno,
                     f"{type(err).__name__}: {err}", limit)  # fmt: skip
    return Probe(node, save_dir, room.free_bytes, room.free_inodes, quota=limit)


def quota(path: Path) -> str:
    """This user's quota on ``path``'s file system as ``lfs quota -u`` says it (FSx for
    Lustre), else ``QUOTA_UNKNOWN``: no other file system's quota is guessed at."""
    lfs = shutil.which("lfs")
    if lfs is None:
        return QUOTA_UNKNOWN
    try:
        out = subprocess.run([lfs, "quota", "-q", "-u", str(os.getuid()), str(path)],
                             capture_output=True, text=True, timeout=QUOTA_TIMEOUT_S)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"quota unknown (`lfs quota` failed: {err})"
    return lfs_quota(out.stdout) if out.returncode == 0 else (
        f"quota unknown (`lfs quota` exited {out.returncode})")  # fmt: skip


def lfs_quota(text: str) -> str:
    """``lfs quota -q -u`` output (``<fs> <kbytes> <quota> <limit> <grace> <files> ...``) in
    words: the bytes used against the hard limit (0: none set); pure."""
    fields = text.split()
    try:
        used, limit = int(fields[1].rstrip("*")) * 1024, int(fields[3]) * 1024
    except (IndexError, ValueError):
        return f"quota unknown (`lfs quota` said {text.strip()[:80]!r})"
    if limit == 0:
        return f"no quota set ({space.size(used)} used)"
    return f"quota {space.size(used)} used of {space.size(limit)}"


def checkpoint_bytes(events: Sequence[Event], last: Path) -> int | None:
    """The bytes one checkpoint takes: the ledger's last ``checkpoint`` event's, else ``last``'s
    size (``checkpoint_last.pt``); None when neither says."""
    saves = [e for e in events if e.kind == Kind.CHECKPOINT and e.get("bytes")]
    if saves:
        return int(saves[-1].get("bytes"))
    try:
        return last.stat().st_size if last.is_file() else None
    except OSError:
        return None


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
    quota: str = QUOTA_UNKNOWN

    @property
    def what(self) -> str:
        if self.errno in STORAGE_ERRNOS:
            return f"{STORAGE_ERRNOS[self.errno]} ({errno.errorcode[self.errno]})"
        return "short of room for a checkpoint"

    def line(self) -> str:
        """One line: the path, what it did, the free space, the quota (or that it is unknown),
        the space a checkpoint needs, who saw it."""
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
        return f"storage: {self.path} is {self.what}: {free}, {self.quota}{need}; {whose}"


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
    said = [p.quota for p in probes if p.quota != QUOTA_UNKNOWN]
    return Storage(number, save_dir, nodes, node_only, min(free) if free else None, needed,
                   said[0] if said else QUOTA_UNKNOWN)  # fmt: skip
