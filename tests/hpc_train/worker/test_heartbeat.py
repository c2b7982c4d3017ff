"""The worker's heartbeat: what it records, what it costs, and the stacks on SIGUSR1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hpc_core.rundir import heartbeat_file, stacks_file
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


def test_a_heartbeat_costs_well_under_a_millisecond(tmp_path):
    hb = Heartbeat(tmp_path, rank=0)
    started = time.perf_counter()
    for update in range(1, 501):
        hb.completed(update)
        hb.training()
    per_update = (time.perf_counter() - started) / 500
    assert per_update < 0.005, per_update  # two small renames, no fsync
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
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)])
    try:
        deadline = time.monotonic() + 20
        while not read_beats(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        (beat,) = read_beats(tmp_path)
        assert (beat.pid, beat.phase) == (proc.pid, CHECKPOINT if updates else STARTUP)
        os.kill(beat.pid, signal.SIGUSR1)
        time.sleep(0.5)
        text = stacks_file(tmp_path, 0).read_text()
        assert "waiting_in_a_collective" in text
        assert proc.poll() is None  # asking for stacks does not stop the rank
    finally:
        proc.kill()
        proc.wait()
