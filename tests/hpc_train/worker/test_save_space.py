"""Each save checks for room first (``checkpoints.room_for``): on a save dir that cannot take the
checkpoint it fails at once with a storage error (ENOSPC) naming the path, the free space, the
bytes needed and the files set aside there; nothing half-written, the last good checkpoint
whole. The save dir is a tmpfs of its own (``small_fs``), standing for FSx for Lustre, filled
with a real ballast file."""

from __future__ import annotations

import errno

import pytest
import torch

from hpc_core import integrity, space
from hpc_core.rundir import RunDir
from hpc_train.worker import async_save, checkpoints


def state(n: int, floats: int = 100_000) -> dict:
    return {
        "model": {"w": torch.full((floats,), float(n))},
        "optimizer_history": [{"num_updates": n}],
    }


def test_the_estimate_is_the_tensors_bytes_once_each_plus_the_pickles_room():
    w = torch.zeros(1000)
    assert checkpoints.state_bytes({"a": w, "b": [w, w[:10]], "c": (torch.zeros(5),)}) == (
        4000 + 20 + checkpoints.OVERHEAD_BYTES
    )


def test_a_save_that_cannot_fit_is_refused_whole_before_a_byte_is_written(small_fs):
    fs = small_fs("16m")
    run = RunDir(fs.root)
    checkpoints.atomic_save(state(5), run.checkpoint_last)  # 0.4 MB (+ 4 MiB for the pickle): fits
    aside = fs.root / "checkpoint_1_3.pt.bad-20261128T120000-9"
    aside.write_bytes(b"x" * 300_000)
    fs.fill(leave=5_000_000)
    with pytest.raises(space.NoSpace) as refused:
        checkpoints.atomic_save(state(10, floats=400_000), run.checkpoint_last)  # 1.6 MB + 4 MiB
    err = refused.value
    assert err.errno == errno.ENOSPC and err.filename == str(run.checkpoint_last)
    assert str(fs.root) in str(err) and "needed" in str(err) and "MB free" in str(err)
    assert "checkpoint_1_3.pt.bad-20261128T120000-9 (300 kB)" in str(err)
    assert run.partial_writes() == []  # nothing half-written
    assert integrity.verify(run.checkpoint_last).ok  # the last good one, whole
    assert (
        torch.load(run.checkpoint_last, weights_only=True)["optimizer_history"][0]["num_updates"]
        == 5
    )


def test_the_background_writer_fails_the_next_save_with_the_storage_error_chained(small_fs):
    fs = small_fs("2m")
    fs.fill(leave=200_000)
    saver = async_save.AsyncSaver()
    saver.save(state(1), str(fs.root / "checkpoint_1_1.pt"))
    with pytest.raises(async_save.CheckpointWriteError, match=r"no space for checkpoint_1_1\.pt"):
        saver.flush()
    try:
        saver.flush()
    except async_save.CheckpointWriteError as err:
        assert isinstance(err.__cause__, OSError) and err.__cause__.errno == errno.ENOSPC
    assert not (fs.root / "checkpoint_1_1.pt").exists() and RunDir(fs.root).partial_writes() == []
