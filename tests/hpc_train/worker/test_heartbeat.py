"""The worker's heartbeat: what it records, what it costs, and the stacks on SIGUSR1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from hpc_core.rundir import heartbeat_file, stacks_file
from hpc_core.wait import FAST, wait_until
from hpc_train.contract import CHECKPOINT, EPOCH, STARTUP, STOPPING, TRAIN, read_beats
from hpc_train.worker.heartbeat import Heartbeat


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_update_records_its_phase_and_the_slowest_recent_update(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    clock = Clock()
    hb = Heartbeat(tmp_path, rank=3, clock=clock)
    hb.completed(1)  # the first update: start-up included, not timed
    (beat,) = read_beats(tmp_path)
    assert (beat.rank, beat.node, beat.pid, beat.update, beat.phase) == (
        3,
        "n7",
        os.getpid(),
        1,
        CHECKPOINT,
    )
    assert beat.slowest_s is None
    clock.now += 50  # a 50 s validation and save
    hb.training()
    assert read_beats(tmp_path)[0].phase == TRAIN
    for seconds in (2.0, 6.0, 3.0):
        clock.now += seconds
        hb.completed(hb.update + 1)
        hb.training()
    (beat,) = read_beats(tmp_path)
    assert beat.update == 4 and beat.slowest_s == 6.0  # the save's 50 s is not an update's time
    hb.training(end_of_epoch=True)
    assert read_beats(tmp_path)[0].phase == EPOCH
    hb.training(stopping=True)  # max-update: the final save and the exit follow
    assert read_beats(tmp_path)[0].phase == STOPPING
    assert read_beats(tmp_path, node="n1") == []


def test_a_heartbeat_is_three_small_renames_per_update_and_never_an_fsync(tmp_path, monkeypatch):
    """What a beat costs, counted instead of timed (a timed test fails on a loaded CI machine):
    per update one rename each for the step, the agreement and the return to training, no
    fsync (a heartbeat is never durable), and no temp file left behind."""
    import hpc_core.rundir as rundir

    calls = {"fsync": 0, "replace": 0}
    real_replace = os.replace

    def fsync(fd: int) -> None:
        calls["fsync"] += 1

    def replace(src, dst) -> None:
        calls["replace"] += 1
        real_replace(src, dst)

    monkeypatch.setattr(rundir.os, "fsync", fsync)
    monkeypatch.setattr(rundir.os, "replace", replace)
    hb = Heartbeat(tmp_path, rank=0)
    for update in range(1, 101):
        hb.stepped(update)
        hb.completed(update)
        hb.training()
    assert calls == {"fsync": 0, "replace": 300}
    assert heartbeat_file(tmp_path, 0).exists()
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("updates", [1, 0])
def test_sigusr1_writes_the_python_stacks_even_while_blocked(tmp_path, updates):
    """A real worker process: it arms the stacks, then blocks in a C call (like a collective),
    after its first update or still in start-up (its ``startup`` beat gives the pid)."""
    code = (
        "import sys, time; from pathlib import Path; from hpc_train.worker.heartbeat import Heartbeat\n"
        "hb = Heartbeat(Path(sys.argv[1]), 0); hb.arm_stacks(Path(sys.argv[1]))\n"
        f"if {updates}: hb.completed(1)\n"
        "def waiting_in_a_collective():\n    time.sleep(60)\n"
        "waiting_in_a_collective()\n"
    )
    phase = CHECKPOINT if updates else STARTUP
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)])
    try:
        # the first beat comes once SIGUSR1 is armed
        beats = wait_until(lambda: [b for b in read_beats(tmp_path) if b.phase == phase] or None,
                           f"the rank's {phase} beat", timeout=20, backoff=FAST)  # fmt: skip
        assert [b.pid for b in beats] == [proc.pid]

        def stacks() -> str | None:  # each SIGUSR1 adds a dump: ask until one is in the call
            os.kill(proc.pid, signal.SIGUSR1)
            text = stacks_file(tmp_path, 0).read_text()
            return text if "waiting_in_a_collective" in text else None

        wait_until(stacks, "a dump of the blocked call's stack", timeout=20, backoff=FAST)
        assert proc.poll() is None  # asking for stacks does not stop the rank
    finally:
        proc.kill()
        proc.wait()


def test_an_update_is_recorded_as_reached_before_the_ranks_agree_on_a_notice(tmp_path, monkeypatch):
    """A rank whose peer stops right after update N's step blocks in the notice agreement with N
    trained (and logged by fairseq): its beat must already say N, or the goodput's ``reached``
    (``contract.start_progress``) is one short of fairseq's log and the recomputed updates too.
    Seen in CI: goodput 0 recomputed, fairseq's log 1. fairseq's step is a fake here; the
    agreement is replaced by a probe that reads the beat the launcher would read then."""
    import fairseq_cli.train as fairseq_train

    from hpc_train.worker import preemption

    class Trainer:
        device, data_parallel_rank, updates = "cpu", 0, 0

        def get_num_updates(self) -> int:
            return self.updates

    seen = []

    def agreement(device, proposal=0):
        (beat,) = read_beats(tmp_path)
        seen.append((beat.update, beat.phase))
        return False, 0

    monkeypatch.setattr(fairseq_train, "validate_and_save", lambda *a: ([None], False))
    monkeypatch.setattr(preemption, "agree", agreement)
    hb = Heartbeat(tmp_path, rank=0)
    preemption.install_save_on_notice(tmp_path / "stop", heartbeat=hb)
    trainer = Trainer()
    for _ in range(3):
        trainer.updates += 1
        fairseq_train.validate_and_save(None, trainer, None, None, None, False)
    assert seen == [(1, TRAIN), (2, TRAIN), (3, TRAIN)]  # the update, still training's phase
    assert read_beats(tmp_path)[0].phase == TRAIN and hb.update == 3


def test_a_step_then_its_agreement_time_the_update_once(tmp_path):
    clock = Clock()
    hb = Heartbeat(tmp_path, rank=0, clock=clock)
    hb.completed(1)
    hb.training()
    clock.now += 4.0
    hb.stepped(2)
    clock.now += 30.0  # a peer slow to agree: not this update's own time
    hb.completed(2)
    assert list(hb.recent) == [4.0] and read_beats(tmp_path)[0].phase == CHECKPOINT


def test_a_read_only_or_full_file_system_never_ends_the_rank(small_fs, capfd):
    """The heartbeat dir on a tmpfs of its own (standing for the save dir's FSx), made
    read-only mid-run, then writable again; then one that is read-only from the start (no stacks
    file: faulthandler writes to stderr) and one full to the last byte. The beats that cannot be
    written are said once on stderr; training (here: the calls) goes on. (A file kept open for
    writing would make the remount fail with EBUSY: FSx needs no remount to go read-only.)"""
    fs = small_fs("2m")
    beats = fs.root / "heartbeats" / "n1"
    hb = Heartbeat(beats, rank=2)
    hb.completed(1)
    fs.read_only()
    for update in range(2, 6):
        hb.completed(update)  # no exception
    err = capfd.readouterr().err
    assert err.count("rank 2's heartbeat not written") == 1 and "Read-only file system" in err
    assert [b.update for b in read_beats(beats)] == [1]
    late = Heartbeat(fs.root / "later", rank=4)  # its dir cannot even be made: said, not raised
    late.arm_stacks(fs.root / "later")
    assert "rank 4's heartbeat not written" in capfd.readouterr().err
    fs.writable()
    hb.completed(6)
    assert [b.update for b in read_beats(beats)] == [6]
    assert "heartbeat written again" in capfd.readouterr().err

    full = small_fs("1m")
    (full.root / "hb").mkdir()
    full.fill(leave=0)
    filled = Heartbeat(full.root / "hb", rank=0)
    filled.completed(1)
    assert "rank 0's heartbeat not written" in capfd.readouterr().err
    assert "No space left on device" in str(filled.write_error)
