"""Checkpoint integrity against real fairseq checkpoints (from the `trained_save_dir` run)."""

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from hpc_core.rundir import RunDir, atomic_copy
from hpc_train.worker import checkpoints


@pytest.fixture
def save_dir(trained_save_dir, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained_save_dir, copy)
    return copy


def test_real_checkpoint_loads_with_weights_only_and_allow_list(trained_save_dir):
    state = checkpoints.load(trained_save_dir / checkpoints.LAST)
    assert checkpoints.num_updates(state) == 12
    assert checkpoints.inspect(trained_save_dir / checkpoints.LAST) == (None, 12)


def test_without_the_allow_list_torch_refuses_the_checkpoint(trained_save_dir):
    import torch

    with pytest.raises(Exception, match=r"Unsupported global|weights_only"):
        torch.load(trained_save_dir / checkpoints.LAST, weights_only=True)


def test_interval_checkpoints_newest_first(trained_save_dir):
    names = [p.name for p in RunDir(trained_save_dir).interval_checkpoints()]
    assert [int(n.split("_")[2].split(".")[0]) for n in names] == [10, 5]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "truncated"),
        (lambda p: p.write_bytes(b""), "empty"),
        (lambda p: p.write_bytes(os.urandom(4096)), "truncated or garbage"),
    ],
    ids=["truncated", "zero-byte", "garbage"],
)
def test_bad_last_falls_back_to_newest_valid_interval_and_is_kept_aside(save_dir, damage, reason):
    last = save_dir / checkpoints.LAST
    damage(last)
    bad_bytes = last.read_bytes()
    resume = checkpoints.choose_resume(save_dir)
    assert resume.continue_from == next(iter(RunDir(save_dir).interval_checkpoints()))
    assert resume.fairseq_args() == ["--continue-once", str(resume.continue_from)]
    assert reason in resume.reason
    assert not last.exists()
    assert resume.moved_aside.read_bytes() == bad_bytes  # kept, never deleted


def test_fallback_skips_a_bad_interval_checkpoint_too(save_dir):
    (save_dir / checkpoints.LAST).write_bytes(b"")
    newest = RunDir(save_dir).interval_checkpoints()[0]
    newest.write_bytes(b"junk")
    resume = checkpoints.choose_resume(save_dir)
    assert resume.continue_from.name.endswith("_5.pt")


def test_valid_last_or_empty_dir_needs_no_extra_args(save_dir, tmp_path):
    assert checkpoints.choose_resume(save_dir).fairseq_args() == []
    kept = checkpoints.choose_resume(save_dir)
    assert kept.continue_from is None and kept.at_update == 12 and kept.moved_aside is None
    assert kept.reason == f"resume from {checkpoints.LAST}"
    fresh = checkpoints.choose_resume(tmp_path / "nothing-yet")
    assert fresh.fairseq_args() == [] and "fresh start" in fresh.reason


def test_atomic_copy_links_and_replaces_whole(save_dir):
    src = RunDir(save_dir).interval_checkpoints()[0]
    dst = save_dir / "copy.pt"
    dst.write_bytes(b"old")
    atomic_copy(src, dst)
    assert dst.read_bytes() == src.read_bytes()
    assert not [p for p in save_dir.iterdir() if p.name.endswith(".tmp")]


def _write_forever(mode: str, path: str, ready) -> None:
    import torch

    # A forked child of a process whose OpenMP pool has run (earlier tests) can hang in its
    # first parallel region: this child computes on one thread.
    torch.set_num_threads(1)
    state = {"model": {"w": torch.zeros(512, 512)}, "optimizer_history": [{"num_updates": 0}]}
    n = 0
    while True:
        n += 1
        state["optimizer_history"][0]["num_updates"] = n
        state["model"]["w"] = torch.full((512, 512), float(n))
        if mode == "atomic":
            checkpoints.atomic_save(state, path)
        else:
            torch.save(state, path)
        ready.set()


def kill_while_writing(mode: str, path: Path, rounds: int) -> list[str | None]:
    """SIGKILL a process that rewrites `path` in a loop, at varying moments; verify each time."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # cheap: torch is already imported here
    verdicts = []
    for i in range(rounds):
        ready = ctx.Event()
        proc = ctx.Process(target=_write_forever, args=(mode, str(path), ready))
        proc.start()
        ready.wait(30)  # one whole write done
        time.sleep(0.001 * (i % 10))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        verdicts.append(checkpoints.inspect(path)[0])
    return verdicts


def test_kill_9_during_atomic_writes_always_leaves_a_loadable_checkpoint(tmp_path):
    verdicts = kill_while_writing("atomic", tmp_path / checkpoints.LAST, rounds=30)
    assert verdicts == [None] * 30
    checkpoints.choose_resume(tmp_path)  # a restart clears what a killed write left half-done
    assert [p.name for p in tmp_path.iterdir()] == [checkpoints.LAST]


def test_control_kill_9_during_plain_torch_save_can_corrupt(tmp_path):
    """The same loop with plain torch.save: shows the kill test can catch a torn write."""
    verdicts = kill_while_writing("plain", tmp_path / checkpoints.LAST, rounds=30)
    assert any(v is not None for v in verdicts)
