"""Is it a storage failure, and whose (``faults.failures.storage_failure``): the classifier on
rank reports and probes (pure, table-tested), and the probe (``faults.storage``) on real file
systems of their own (a tmpfs per test, ``small_fs``, standing for the save dir's FSx for Lustre:
filled with a real ballast file, or made read-only). What an evicted Lustre client sees (EIO on
one node) cannot be made here: those rows are written as the reports and probes it would give."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from hpc_core import rundir
from hpc_train.contract import FailureRecord
from hpc_train.faults import failures, storage
from hpc_train.faults.failures import Probe
from hpc_train.worker import crash

SAVE = Path("/lustre/runs/x")
GB = 10**9


def rec(node: str, number: int | None = None, path: str | None = None) -> FailureRecord:
    return FailureRecord(0, 50, "CheckpointWriteError", "a background checkpoint write failed",
                         number, path, node=node)  # fmt: skip


def fine(node: str, free: int = 100 * GB) -> Probe:
    return Probe(node, SAVE, free, 10**6)


def failing(node: str, number: int, free: int | None = 100 * GB) -> Probe:
    return Probe(node, SAVE, free, 10**6, number, f"OSError: [Errno {number}]")


IN_SAVE = str(SAVE / "checkpoint_1_50.pt")


@pytest.mark.parametrize(
    ("reports", "probes", "expect"),
    [
        # a full file system: the errno in the report, the probe short of room for a checkpoint
        ([rec("n1", errno.ENOSPC, IN_SAVE)], [fine("n1", 2 * GB), fine("n2", 2 * GB)],
         (errno.ENOSPC, ("n1", "n2"), False)),
        # the errno lost in the chain, the report too (written to the failed file system): the
        # probes fail on every node -- storage, not a node's crash
        ([], [failing("n1", errno.EROFS), failing("n2", errno.EROFS)],
         (errno.EROFS, ("n1", "n2"), False)),
        # over a quota: the probes' few bytes fit and the file system has room; still storage,
        # and the file system's (a quota is the same from every node)
        ([rec("n1", errno.EDQUOT)], [fine("n1"), fine("n2")], (errno.EDQUOT, ("n1",), False)),
        # EIO on one node, the others write: that node's (a client evicted)
        ([rec("n2", errno.EIO, IN_SAVE)], [fine("n1"), failing("n2", errno.EIO)],
         (errno.EIO, ("n2",), True)),
        # read-only on one node only: that node's
        ([], [fine("n1"), failing("n2", errno.EROFS), fine("n3")], (errno.EROFS, ("n2",), True)),
        # no errno anywhere, but less room than a checkpoint needs (needed: 4.47 GB)
        ([rec("n1")], [fine("n1", GB), fine("n2", GB)], (None, ("n1", "n2"), False)),
    ],
)  # fmt: skip
def test_storage_and_whose(reports, probes, expect):
    found = failures.storage_failure(reports, probes, SAVE, needed=int(4.47 * GB))
    assert found is not None
    assert (found.errno, found.nodes, found.node_only) == expect


@pytest.mark.parametrize(
    ("reports", "probes"),
    [
        ([rec("n1")], [fine("n1"), fine("n2")]),  # a bug: no errno, the save dir fine
        ([rec("n1", errno.ENOSPC, "/tmp/fairseq/cache.bin")], [fine("n1")]),  # another disk
        ([rec("n1", errno.EIO)], [fine("n1"), fine("n2")]),  # EIO, not known to be the save dir's
        ([rec("n1", errno.EACCES, IN_SAVE)], [fine("n1")]),  # no storage errno
        ([], []),
    ],
)
def test_not_storage(reports, probes):
    assert failures.storage_failure(reports, probes, SAVE, needed=int(4.47 * GB)) is None


def test_the_line_names_the_path_what_it_did_the_room_and_the_need():
    full = failures.storage_failure([rec("n1", errno.ENOSPC, IN_SAVE)], [fine("n1", int(1.2 * GB))],
                            SAVE, needed=int(4.47 * GB))  # fmt: skip
    assert full.line() == (
        "storage: /lustre/runs/x is full (ENOSPC): 1.20 GB free, quota unknown (no `lfs quota` "
        "on this node), a checkpoint needs 4.47 GB; seen on n1"
    )
    evicted = failures.storage_failure([], [fine("n1"), failing("n2", errno.EIO)], SAVE)
    assert evicted.line().endswith("on n2 only: that node's, not the file system's")
    assert "failing with I/O errors (EIO)" in evicted.line()


def test_the_probe_writes_and_leaves_nothing(small_fs):
    fs = small_fs("4m")
    found = storage.probe(fs.root, "n1")
    assert found.errno is None and not found.fails(needed=1_000_000)
    assert found.fails(needed=8_000_000)  # room for no checkpoint of 8 MB
    assert list(fs.root.iterdir()) == []


def test_the_probe_of_a_read_only_and_of_a_full_file_system(small_fs):
    ro = small_fs("2m")
    ro.read_only()
    assert storage.probe(ro.root, "n1").errno == errno.EROFS
    full = small_fs("1m")
    full.fill(leave=0)
    found = storage.probe(full.root, "n1")
    assert found.errno == errno.ENOSPC or found.free_bytes == 0
    assert found.fails(needed=None)


def test_a_real_full_disk_failure_is_storage_from_the_report_and_the_probe(small_fs):
    """torch.save onto a full tmpfs: the report's errno from the chain, the probe of the same
    file system after the failed write's temporary is gone: storage, with the figures."""
    fs = small_fs("2m")
    try:
        with rundir.atomic_writer(fs.root / "checkpoint_1_50.pt") as fh:
            torch.save({"w": torch.zeros(1 << 20)}, fh)
    except RuntimeError as err:
        record = crash.from_exception(err, rank=0, update=50)
    found = failures.storage_failure([record], [storage.probe(fs.root, record.node)], fs.root,
                             needed=4 * 2**20)  # fmt: skip
    assert found is not None and found.errno == errno.ENOSPC and not found.node_only
    assert found.line().startswith(f"storage: {fs.root} is full (ENOSPC): ")
    assert "a checkpoint needs 4.2 MB" in found.line()
