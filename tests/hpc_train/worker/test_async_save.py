"""Async checkpoint saves (``hpc_train.worker.async_save``): real fairseq runs, real files, real kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from hpc_core import ledger
from hpc_core.rundir import RunDir, atomic_copy
from hpc_train import contract
from hpc_train.worker import async_save, checkpoints

# --- against real fairseq: the same tiny training, sync and async ------------------------------


@pytest.mark.parametrize("precision", [(), ("--bf16",)], ids=["fp32", "bf16"])
def test_every_async_checkpoint_equals_a_sync_save_of_the_same_update(
    corpus, tiny_run, tmp_path, monkeypatch, precision, same_training_state
):
    """12 updates, interval saves at 5 and 10, checkpoint_last.pt at 12: the async run's files
    hold the same tensors as the sync run's, tensor by tensor (bf16: the model saved as fp32,
    converted in the snapshot); its ledger records each save once it is durable, with the
    file's bytes and the snapshot and write seconds."""
    sync_dir, async_dir = tmp_path / "sync", tmp_path / "async"
    flags = ("--save-interval-updates", "5", *precision)
    monkeypatch.setenv(contract.SYNC_SAVE, "1")
    tiny_run(corpus, sync_dir, 12, *flags)
    monkeypatch.setenv(contract.SYNC_SAVE, "0")
    monkeypatch.setenv(contract.START, "7:0")  # as the launcher would: rank 0 writes the ledger
    tiny_run(corpus, async_dir, 12, *flags)

    assert "writing in the background" in (async_dir / "train.log").read_text()
    assert "writing in the background" not in (sync_dir / "train.log").read_text()
    names = sorted(p.name for p in sync_dir.glob("checkpoint*.pt"))
    assert names == ["checkpoint_1_10.pt", "checkpoint_1_5.pt", "checkpoint_best.pt",
                     "checkpoint_last.pt"]  # fmt: skip
    assert sorted(p.name for p in async_dir.glob("checkpoint*.pt")) == names
    assert RunDir(async_dir).partial_writes() == []
    for name in names:
        same_training_state(sync_dir / name, async_dir / name)

    saves = [e for e in ledger.read(RunDir(async_dir).ledger) if e.kind == "checkpoint"]
    assert [e.get("update") for e in saves] == [5, 10, 12]
    assert saves[-1].get("bytes") == (async_dir / "checkpoint_last.pt").stat().st_size
    assert all(e.get("write_s") > 0 and e.get("snapshot_s") >= 0 for e in saves)


# --- the snapshot, the writer thread, failures --------------------------------------------------


class GatedWrite:
    """The real atomic write, held until ``release`` (to act while a save is in flight)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()

    def __call__(self, state, path: str) -> None:
        self.started.set()
        assert self.gate.wait(30)
        checkpoints.atomic_save(state, path)


def test_snapshot_is_a_copy_training_may_change_the_model_meanwhile(tmp_path):
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 64)).sum().backward()
    opt.step()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    exp_avg = opt.state_dict()["state"][0]["exp_avg"].clone()
    write = GatedWrite()
    saver = async_save.AsyncSaver(write)
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "tied": [model.weight] * 2}
    path = tmp_path / "checkpoint_last.pt"
    saver.save(state, str(path), {"train_iterator": {"epoch": 1}})
    assert saver.writing(path) and saver.pending_in(tmp_path) == [path.name]
    # the next updates change parameters and optimizer state in place
    with torch.no_grad():
        model.weight.add_(1.0)
    model(torch.ones(2, 64)).sum().backward()
    opt.step()
    write.gate.set()
    saver.flush()
    assert not saver.writing(path)
    saved = torch.load(path, weights_only=True)
    assert all(torch.equal(saved["model"][k], v) for k, v in expected.items())
    assert torch.equal(saved["opt"]["state"][0]["exp_avg"], exp_avg)
    assert saved["extra_state"] == {"train_iterator": {"epoch": 1}}
    tied = saved["tied"]  # one storage in, one storage out (as torch.save keeps it)
    assert tied[0].untyped_storage().data_ptr() == tied[1].untyped_storage().data_ptr()
    assert saver.last is not None and saver.last.bytes == path.stat().st_size


@pytest.mark.parametrize("pool", [None, async_save.HostPool()])
def test_half_precision_is_saved_as_fp32_like_fairseqs_move_to_cpu(pool):
    """Many same-sized bf16 tensors (a bf16 model): each converted copy holds its own values,
    though the allocator hands the same address to one freed temporary after another."""
    state = {f"w{i}": torch.full((64, 64), float(i), dtype=torch.bfloat16) for i in range(8)}
    snap = async_save.snapshot(state, pool)
    assert all(v.dtype == torch.float32 for v in snap.values())
    assert [v[0, 0].item() for v in snap.values()] == [float(i) for i in range(8)]


def test_one_save_in_flight_and_copies_wait_behind_the_write(tmp_path):
    write = GatedWrite()
    saver = async_save.AsyncSaver(write)
    first = tmp_path / "checkpoint_1_5.pt"
    saver.save({"n": torch.tensor(5)}, str(first))
    copied = tmp_path / "checkpoint_last.pt"
    saver.after_writes(lambda: atomic_copy(first, copied), "copy")
    assert write.started.wait(30) and not first.exists() and not copied.exists()
    other = str(tmp_path / "checkpoint_1_10.pt")
    second = threading.Thread(target=saver.save, args=({"n": torch.tensor(10)}, other))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting for the first save to be durable
    write.gate.set()
    second.join(30)
    saver.flush()
    assert torch.load(copied, weights_only=True)["n"] == 5


def test_a_failed_background_write_fails_the_next_save_loudly(tmp_path, caplog):
    def broken(state, path: str) -> None:
        raise OSError(28, "No space left on device")

    saver = async_save.AsyncSaver(broken)
    path = tmp_path / "checkpoint_1_5.pt"
    saver.save({"n": torch.tensor(1)}, str(path))  # returns: the write happens later
    copied = tmp_path / "checkpoint_last.pt"
    saver.after_writes(lambda: copied.write_text("x"), "copy")
    with pytest.raises(async_save.CheckpointWriteError, match="No space left"):
        saver.save({"n": torch.tensor(2)}, str(path))
    with pytest.raises(async_save.CheckpointWriteError):
        saver.flush()
    assert not copied.exists()  # what was queued behind the failed write was skipped
    assert "background checkpoint write failed" in caplog.text


def test_sync_save_is_asked_for_through_the_environment():
    assert contract.WorkerEnv.from_env({contract.SYNC_SAVE: "1"}).sync_save
    assert not contract.WorkerEnv.from_env({contract.SYNC_SAVE: "0"}).sync_save
    assert not contract.WorkerEnv.from_env({}).sync_save


# --- kill -9 during a background write ---------------------------------------------------------

KILLED_WRITER = """
import sys, time
from pathlib import Path

import torch
from hpc_core import rundir
from hpc_train.worker import async_save
from hpc_train.worker import checkpoints

path = sys.argv[1]
old = {"model": {"w": torch.zeros(256, 256)}, "optimizer_history": [{"num_updates": 5}]}
checkpoints.atomic_save(old, path)


class Slow:
    def __init__(self, fh):
        self.fh = fh

    def write(self, data):
        view = memoryview(data).cast("B")
        for i in range(0, len(view), 1 << 16):
            self.fh.write(view[i : i + (1 << 16)])
            time.sleep(0.02)
        return len(view)

    def flush(self):
        self.fh.flush()


def slow_save(state, target):
    with rundir.atomic_writer(target) as fh:
        torch.save(state, Slow(fh))


new = {"model": {"w": torch.ones(2048, 2048)}, "optimizer_history": [{"num_updates": 10}]}
saver = async_save.AsyncSaver(slow_save)
saver.save(new, path)
run = rundir.RunDir(Path(path).parent)
while not any(p.stat().st_size > (1 << 20) for p in run.partial_writes()):
    time.sleep(0.01)
print("writing", flush=True)
saver.flush()
print("done", flush=True)
"""


def test_kill_9_during_a_background_write_leaves_the_previous_checkpoint(tmp_path):
    """A worker killed (SIGKILL) while its writer thread is half-way through a 16 MB
    checkpoint (slowed down so the kill lands mid-write)."""
    last = tmp_path / checkpoints.LAST
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_WRITER), str(last)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    run = RunDir(tmp_path)
    assert run.partial_writes()  # the half-written temporary is there ...
    assert run.interval_checkpoints() == []  # ... and never taken for a checkpoint
    assert checkpoints.inspect(last) == (None, 5)  # the previous checkpoint, whole
    resume = checkpoints.choose_resume(tmp_path)
    assert resume.continue_from is None and resume.at_update == 5
    assert [p.name for p in tmp_path.iterdir()] == [checkpoints.LAST]  # temporary removed
