"""Each node's look at the save dir when its torchrun failed (``probe``: its room, a test write,
the user's quota), run by that node's launcher and sent to task 0 in its exit record; what the
probes and the ranks' reports come to, storage's or not and whose, is weighed on task 0 with the
other failures (``faults.failures.storage_failure``: pure).

None of it is a file written to the failed file system: the probe's result travels in the exit
record (said on stderr when the save dir refuses that too, ``failures.write_exit``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from hpc_core import space
from hpc_train.faults.failures import QUOTA_UNKNOWN, Probe

PROBE_PREFIX = ".hpc-train-probe-"
QUOTA_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 30.0


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
