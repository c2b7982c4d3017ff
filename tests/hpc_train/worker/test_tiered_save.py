"""Tiered saves (``--local-save-dir``, ``hpc_train.worker.local_tier``): periodic saves land on a
node-local dir first and are copied to the save dir in the background; resume reads the save dir;
a save on notice skips the local dir; an unusable local dir falls back to direct saves.

Here the "local disk" and the "save dir" are two directories of one tmp file system: the copy is
still a real copy (``copy_durable`` never links, asserted by inode)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from hpc_core import integrity, ledger
from hpc_core.rundir import RunDir
from hpc_train import contract, submit
from hpc_train.job import options
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Saves, SpecError, Training, validate
from hpc_train.launch import launcher
from hpc_train.worker import async_save, checkpoints, local_tier

# --- the option, the layout, the launcher ------------------------------------------------------


def parse(*argv: str) -> JobSpec:
    args = submit.build_parser().parse_args(["--data", "d", "--save-dir", "s", *argv])
    return options.spec_from_options(args)


def test_the_option_takes_an_absolute_path_only_and_needs_async_saves(tmp_path):
    assert parse("--preset", "tiny").saves.local_dir is None
    spec = parse("--preset", "tiny", "--local-save-dir", "/scratch/hpc-train")
    assert spec.saves.local_dir == Path("/scratch/hpc-train")
    with pytest.raises(SpecError, match="--local-save-dir scratch: must be an absolute path"):
        parse("--preset", "tiny", "--local-save-dir", "scratch")
    both = parse("--preset", "tiny", "--local-save-dir", "/scratch", "--sync-save")
    with pytest.raises(SpecError, match="--local-save-dir needs async saves"):
        validate(both, check_paths=False)
    assert "--local-save-dir DIR" in submit.build_parser().format_help()


def test_each_run_has_its_own_dir_on_the_local_disk(tmp_path):
    local = Path("/scratch/hpc-train")
    a, b = RunDir(tmp_path / "x" / "run"), RunDir(tmp_path / "y" / "run")
    assert a.local_tier(local).parent == local and a.local_tier(local).name.startswith("run-")
    assert a.local_tier(local) != b.local_tier(local)  # same name, other save dir
    assert a.local_tier(local) == RunDir(tmp_path / "x" / "run").local_tier(local)  # stable


class EnvTorchrun(launcher.Launcher):
    """torchrun replaced by ``python -c`` (a fake: only the environment the launcher passes is
    under test) that writes the local tier it was given to a file."""

    def torchrun_command(self, start: launcher.Start, nproc: int, args: list[str]) -> list[str]:
        out = self.spec.training.save_dir / "env.txt"
        name = contract.LOCAL_SAVE_DIR
        body = f"import os; open({str(out)!r}, 'w').write(os.environ.get({name!r}, ''))"
        return [sys.executable, "-c", body]


@pytest.mark.parametrize("local", [None, Path("/scratch/hpc-train")])
def test_the_launcher_passes_the_runs_local_dir_to_the_workers(tmp_path, fake_slurm, local):
    spec = JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(gpus_per_node=0),
        saves=Saves(local_dir=local),
    )
    EnvTorchrun(spec).run(launcher.Start("41", 0, 1, "n1", 0), gpus=0)
    expected = "" if local is None else str(RunDir(tmp_path).local_tier(local))
    assert (tmp_path / "env.txt").read_text() == expected


# --- the writer with a local tier (torch, no fairseq) ------------------------------------------


def state(n: int) -> dict:
    return {"model": {"w": torch.full((128, 128), float(n))}, "n": n}


def test_a_periodic_save_is_written_locally_then_copied_and_old_local_files_pruned(tmp_path):
    local, shared = tmp_path / "local", tmp_path / "shared"
    shared.mkdir()
    saver = async_save.AsyncSaver(local_dir=local)
    saver.save(state(5), str(shared / "checkpoint_1_5.pt"))
    saver.flush()
    first = saver.last
    assert first is not None and first.copy_s is not None and first.copy_s >= 0
    assert first.bytes == (shared / "checkpoint_1_5.pt").stat().st_size
    assert (local / "checkpoint_1_5.pt").read_bytes() == (shared / "checkpoint_1_5.pt").read_bytes()
    # a copy, not a link: the save dir owns its own inode
    assert (local / "checkpoint_1_5.pt").stat().st_ino != (
        shared / "checkpoint_1_5.pt"
    ).stat().st_ino
    saver.save(state(10), str(shared / "checkpoint_1_10.pt"))
    saver.flush()
    assert [p.name for p in RunDir(local).checkpoint_files()] == ["checkpoint_1_10.pt"]
    assert sorted(p.name for p in shared.iterdir()) == ["checkpoint_1_10.pt", "checkpoint_1_5.pt"]
    assert torch.load(shared / "checkpoint_1_10.pt", weights_only=True)["n"] == 10


def test_durable_means_in_the_save_dir_not_only_on_local_disk(tmp_path):
    """A record queued behind the save (``when_durable``) runs once the save dir's copy is
    there; while the local write is held, neither exists."""
    local, shared = tmp_path / "local", tmp_path / "shared"
    gate, started = threading.Event(), threading.Event()

    def held_write(snap, path: str) -> None:
        started.set()
        assert gate.wait(30)
        checkpoints.atomic_save(snap, path)

    saver = async_save.AsyncSaver(held_write, local_dir=local)
    target = shared / "checkpoint_last.pt"
    saver.save(state(3), str(target))
    seen: list[bool] = []
    saver.after_writes(lambda: seen.append(target.exists()), "record", critical=False)
    assert started.wait(30) and not target.exists() and seen == []
    gate.set()
    saver.flush()
    assert seen == [True] and (local / target.name).exists()


def test_a_direct_save_skips_the_local_dir(tmp_path):
    local, shared = tmp_path / "local", tmp_path / "shared"
    saver = async_save.AsyncSaver(local_dir=local)
    saver.save(state(7), str(shared / "checkpoint_last.pt"), direct=True)
    saver.flush()
    assert (shared / "checkpoint_last.pt").exists() and not (local / "checkpoint_last.pt").exists()
    assert saver.last is not None and saver.last.copy_s is None


def test_an_unusable_local_dir_at_start_up_means_direct_saves_with_one_line(tmp_path, caplog):
    (tmp_path / "a-file").write_text("not a dir")
    broken = tmp_path / "a-file" / "tier"
    assert local_tier.usable(broken) is None
    lines = [r for r in caplog.records if "unusable" in r.getMessage()]
    assert len(lines) == 1 and str(broken) in lines[0].getMessage()
    assert local_tier.usable(None) is None
    made = tmp_path / "made" / "tier"  # missing: made
    assert local_tier.usable(made) == made


def test_a_full_local_disk_falls_back_to_the_save_dir_and_loses_no_save(tmp_path, caplog):
    """ENOSPC is faked for the local dir (a full disk cannot be made here); the save dir's
    write is the real one."""
    local, shared = tmp_path / "local", tmp_path / "shared"

    def full_local_disk(snap, path: str) -> None:
        if Path(path).parent == local:
            raise OSError(errno.ENOSPC, "No space left on device")
        checkpoints.atomic_save(snap, path)

    saver = async_save.AsyncSaver(full_local_disk, local_dir=local)
    for n in (5, 10):
        saver.save(state(n), str(shared / f"checkpoint_1_{n}.pt"))
        saver.flush()
        assert torch.load(shared / f"checkpoint_1_{n}.pt", weights_only=True)["n"] == n
    assert saver.local_dir is None and saver.last is not None and saver.last.copy_s is None
    lines = [r for r in caplog.records if "unusable" in r.getMessage()]
    assert len(lines) == 1 and "No space left" in lines[0].getMessage()


def test_a_copy_that_does_not_verify_never_takes_its_name_and_the_save_is_not_lost(
    tmp_path, caplog
):
    """A bit flips in the local file after it was written (a real bit, flipped in the real file,
    standing for a failing local NVMe or a bad copy): the copy to the save dir fails its
    verification (the digest recorded as the local file was written), is never renamed into
    place, the local file is set aside, and the snapshot, held until then, is written to the
    save dir directly, whole; later saves skip the tier."""
    local, shared = tmp_path / "local", tmp_path / "shared"
    shared.mkdir()

    def write_then_rot(snap, path: str) -> None:
        checkpoints.atomic_save(snap, path)
        if Path(path).parent == local:
            with open(path, "r+b") as fh:
                fh.seek(os.path.getsize(path) // 2)
                byte = fh.read(1)[0]
                fh.seek(-1, os.SEEK_CUR)
                fh.write(bytes([byte ^ 0x10]))

    saver = async_save.AsyncSaver(write_then_rot, local_dir=local)
    target = shared / "checkpoint_1_5.pt"
    saver.save(state(5), str(target))
    saver.flush()
    assert integrity.verify(target).ok and integrity.recorded(target) is not None
    assert torch.load(target, weights_only=True)["n"] == 5
    assert saver.local_dir is None and saver.last.copy_s is None  # written directly
    (kept,) = RunDir(local).set_aside_files()
    assert not integrity.verify(kept).ok  # the rotten local file, kept for a look
    assert not RunDir(shared).partial_writes() and not RunDir(shared).set_aside_files()
    lines = [r.getMessage() for r in caplog.records if "failed verification" in r.getMessage()]
    assert len(lines) == 1 and "set aside" in lines[0] and "directly" in lines[0]


# --- against real fairseq ----------------------------------------------------------------------


def test_tiered_checkpoints_equal_sync_saves_and_resume_reads_the_save_dir(
    corpus, tiny_run, tmp_path, monkeypatch, same_training_state
):
    """12 updates, saves at 5, 10 and 12, sync and tiered: every file in the save dir holds
    the sync run's tensors; the local dir holds the newest file only, byte for byte the same;
    the ledger has each save's copy seconds. Then the local file is made garbage and the run
    continues to 14: the resume read the save dir."""
    sync_dir, tiered_dir, local = tmp_path / "sync", tmp_path / "tiered", tmp_path / "local"
    flags = ("--save-interval-updates", "5")
    monkeypatch.setenv(contract.SYNC_SAVE, "1")
    tiny_run(corpus, sync_dir, 12, *flags)
    monkeypatch.setenv(contract.SYNC_SAVE, "0")
    monkeypatch.setenv(contract.LOCAL_SAVE_DIR, str(local))
    monkeypatch.setenv(contract.START, "7:0")
    tiny_run(corpus, tiered_dir, 12, *flags)

    log = (tiered_dir / "train.log").read_text()
    assert "tiered saves" in log and f"copied it to {tiered_dir}" in log
    names = sorted(p.name for p in sync_dir.glob("checkpoint*.pt"))
    assert sorted(p.name for p in tiered_dir.glob("checkpoint*.pt")) == names
    for name in names:
        same_training_state(sync_dir / name, tiered_dir / name)
    kept = RunDir(local).checkpoint_files()
    assert len(kept) == 1 and checkpoints.inspect(kept[0]) == (None, 12)
    assert kept[0].read_bytes() == (tiered_dir / kept[0].name).read_bytes()
    assert RunDir(tiered_dir).partial_writes() == [] and RunDir(local).partial_writes() == []
    saves = [e for e in ledger.read(RunDir(tiered_dir).ledger) if e.kind == "checkpoint"]
    assert [e.get("update") for e in saves] == [5, 10, 12]
    assert all(e.get("copy_s") > 0 and e.get("write_s") > 0 for e in saves)

    kept[0].write_bytes(b"garbage on the local disk")
    assert checkpoints.choose_resume(tiered_dir).at_update == 12
    tiny_run(corpus, tiered_dir, 14, *flags)
    assert checkpoints.inspect(tiered_dir / checkpoints.LAST) == (None, 14)


def test_a_save_on_notice_goes_straight_to_the_save_dir(corpus, tmp_path):
    """SIGUSR2 to a real tiered worker after its first periodic save reached the local dir:
    the notice's checkpoint_last.pt is in the save dir, and no file on the local disk holds
    that update."""
    from hpc_train.job.command_lines import fairseq_args

    save, local = tmp_path / "run", tmp_path / "local"
    spec = JobSpec(
        Training("tiny", corpus, save, max_update=5000),
        sizing=Sizing(gpus_per_node=0),
        saves=Saves(keep_checkpoints=5),
    )
    args, _ = fairseq_args(spec, world_size=1, gpu=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", contract.LOCAL_SAVE_DIR: str(local)}
    env.pop(contract.SYNC_SAVE, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpc_train.worker.train", *args, "--save-interval-updates", "5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 240
        while not RunDir(local).checkpoint_files():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGUSR2)
        assert proc.wait(120) == 0
    finally:
        proc.kill()
    marker = contract.read_stop(RunDir(save), "local", 0)
    assert marker is not None and marker.update >= 5
    assert checkpoints.inspect(save / checkpoints.LAST) == (None, marker.update)
    local_updates = [checkpoints.inspect(p)[1] for p in RunDir(local).checkpoint_files()]
    assert local_updates and max(local_updates) < marker.update
    assert "notice (SIGUSR2)" in (save / "train.log").read_text()
