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
    (aside,) = resume.set_aside
    assert aside.file == checkpoints.LAST and reason in aside.why
    assert aside.moved_to.read_bytes() == bad_bytes  # kept, never deleted


def test_fallback_skips_a_bad_interval_checkpoint_too(save_dir):
    (save_dir / checkpoints.LAST).write_bytes(b"")
    newest = RunDir(save_dir).interval_checkpoints()[0]
    newest.write_bytes(b"junk")
    resume = checkpoints.choose_resume(save_dir)
    assert resume.continue_from.name.endswith("_5.pt")
    assert [a.file for a in resume.set_aside] == [checkpoints.LAST, newest.name]
    assert [a.moved_to.read_bytes() for a in resume.set_aside] == [b"", b"junk"]


def test_valid_last_or_empty_dir_needs_no_extra_args(save_dir, tmp_path):
    assert checkpoints.choose_resume(save_dir).fairseq_args() == []
    kept = checkpoints.choose_resume(save_dir)
    assert kept.continue_from is None and kept.at_update == 12 and kept.set_aside == ()
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


def wait_for_first_write(proc, ready, timeout: float) -> None:
    """Until the writer has done one whole write. A writer that exits first fails the test at
    once; one that writes nothing in ``timeout`` seconds is killed, then fails it."""
    deadline = time.monotonic() + timeout
    while not ready.wait(0.05):
        if not proc.is_alive():
            proc.join()
            pytest.fail(f"the writer exited ({proc.exitcode}) before one whole write")
        if time.monotonic() > deadline:
            proc.kill()
            proc.join()
            pytest.fail(f"the writer did no whole write in {timeout:g} s")


def kill_while_writing(
    mode: str, path: Path, rounds: int, target=_write_forever, start_timeout: float = 30.0
) -> list[str | None]:
    """SIGKILL a process that rewrites `path` in a loop, at varying moments; verify each time."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # cheap: torch is already imported here
    verdicts = []
    for i in range(rounds):
        ready = ctx.Event()
        proc = ctx.Process(target=target, args=(mode, str(path), ready))
        proc.start()
        wait_for_first_write(proc, ready, start_timeout)
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


def _exits_at_once(mode: str, path: str, ready) -> None:
    os._exit(3)  # a writer that cannot start (an import or a fork that fails)


def _never_writes(mode: str, path: str, ready) -> None:
    time.sleep(60)  # a writer stuck before its first write


def test_a_writer_that_cannot_start_fails_the_kill_test_at_once(tmp_path):
    """Not ~30 s a round (the suite's 15 min for 30 rounds): the test says why, at once."""
    began = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"exited \(3\) before one whole write"):
        kill_while_writing("atomic", tmp_path / checkpoints.LAST, 30, target=_exits_at_once)
    with pytest.raises(pytest.fail.Exception, match=r"did no whole write in 0\.3 s"):
        kill_while_writing("atomic", tmp_path / checkpoints.LAST, 30, _never_writes, 0.3)
    assert time.monotonic() - began < 10


def test_no_checkpoint_that_verifies_holds_instead_of_a_fresh_start(save_dir):
    """Every checkpoint bad (set aside on the way): the start is held with why, never trained
    from scratch over them; and so again at the next start (only the set-aside files left)."""
    run = RunDir(save_dir)
    written = [run.checkpoint_last, *run.interval_checkpoints()]
    for path in written:
        path.write_bytes(b"junk")
    resume = checkpoints.choose_resume(save_dir)
    assert resume.continue_from is None and resume.at_update == 0
    assert len(resume.set_aside) == len(written) == len(run.set_aside_files())
    assert resume.held.startswith(f"{checkpoints.LAST} ") and "restore a good one" in resume.held
    again = checkpoints.choose_resume(save_dir)
    assert again.set_aside == () and again.held.startswith("no checkpoint left but those set")
    for path in run.set_aside_files():
        path.unlink()  # the user's choice: start from scratch
    assert checkpoints.choose_resume(save_dir).held == ""
