"""The launcher's signals part: the order of notice and SIGTERM, a cancel told from a crash,
the wait for the save on notice. A fake Slurm (tests/hpc_train/conftest.py) answers the job's
state; real signals are sent to this process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from hpc_core import slurm
from hpc_train.launch import signals


def test_recording_notes_signals_in_order_writes_the_pending_notice_and_puts_handlers_back(
    tmp_path,
):
    received: list[str] = []
    pending = tmp_path / "notice-pending"
    before = signal.getsignal(signal.SIGUSR2)
    with signals.recording(received, pending):
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)
    assert received == ["notice", "SIGTERM"]
    assert json.loads(pending.read_text())["signal"] == "SIGUSR2"
    assert signal.getsignal(signal.SIGUSR2) is before


def test_a_sigterm_first_is_a_cancel_a_notice_first_asks_slurm(fake_slurm):
    assert signals.cancelled(["SIGTERM"], "41") is True
    assert signals.cancelled(["notice", "SIGTERM"], "41") is False  # RUNNING
    fake_slurm.state = "CANCELLED"
    assert signals.cancelled(["notice", "SIGTERM"], "41") is True


def test_a_slurm_that_cannot_answer_makes_it_a_crash(monkeypatch, fake_slurm):
    def broken(job_id: str) -> slurm.JobState:
        raise slurm.SlurmError("scontrol: timeout")

    monkeypatch.setattr(fake_slurm, "job_state", broken)
    assert signals.cancelled([], "41") is False


def test_the_save_wait_ends_on_the_marker_or_the_exit_and_says_which(tmp_path):
    marker = tmp_path / "stop"
    marker.write_text("{}")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        began = time.monotonic()
        assert signals.wait_for_save(marker, sleeper.pid, 20) is True
        assert time.monotonic() - began < 5
    finally:
        sleeper.kill()
        sleeper.wait()
    assert signals.wait_for_save(tmp_path / "none", sleeper.pid, 20) is False  # exited: no save
    assert signals.wait_for_save(None, os.getpid(), 0.2) is False  # neither: the deadline
