"""The launcher's signals part: the order of notice and SIGTERM, the wait for the save on
notice (a cancel told from a crash: the policy's, tests/hpc_train/launch/test_end_policy.py and
test_launcher_decisions.py). Real signals are sent to this process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from hpc_train.contract import Cause
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


def test_the_save_wait_ends_on_the_marker_or_the_exit_and_says_which(tmp_path):
    marker = tmp_path / "stop"
    marker.write_text("{}")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        began = time.monotonic()
        assert signals.wait_for_save(marker, 20, signals.workers_exited(sleeper.pid)) is True
        assert time.monotonic() - began < 5
    finally:
        sleeper.kill()
        sleeper.wait()
    exited = signals.workers_exited(sleeper.pid)
    assert signals.wait_for_save(tmp_path / "none", 20, exited) is False  # exited: no save
    alive = signals.workers_exited(os.getpid())
    assert signals.wait_for_save(None, 0.2, alive) is False  # neither: the deadline


def test_the_save_wait_on_the_marker_alone_waits_for_rank_0s_marker(tmp_path):
    """Task 1 acting for a stuck task 0 (``recovery.on_silent``) waits for rank 0's marker only
    (its own ranks' exit says nothing of rank 0's save): the same wait, no workers watched."""
    marker = tmp_path / "stop"
    threading.Timer(0.3, marker.write_text, ["{}"]).start()
    began = time.monotonic()
    assert signals.wait_for_save(marker, 20) is True
    assert 0.2 < time.monotonic() - began < 5
    assert signals.wait_for_save(tmp_path / "none", 0.2) is False  # the deadline
    assert signals.workers_exited(None)() is True  # no torchrun yet: no save can come


def test_task_0s_own_notice_hands_its_cause_over_before_the_signal_goes_out(fake_slurm):
    """``OwnNotice.send`` from a watcher thread: the cause is recorded before the USR2 is sent,
    so the handler that signal runs (``checkpoint()``) finds it; a notice no thread sent is a
    plain notice."""
    own = signals.OwnNotice()
    assert own.cause() == Cause.NOTICE
    seen = []  # what a handler run at the moment the USR2 goes out would read
    sent = fake_slurm.signal
    fake_slurm.signal = lambda job, name="USR2": (seen.append(own.cause()), sent(job, name))
    thread = threading.Thread(target=own.send, args=(Cause.GROW, "41"))
    thread.start()
    thread.join()
    assert seen == [Cause.GROW] and fake_slurm.signals == [("41", "USR2")]
    assert own.cause() == Cause.GROW


@pytest.mark.parametrize("saved_at", [2.1, 9.1, 30.6])
def test_the_save_on_notice_is_seen_within_a_quarter_second_however_long_it_took(
    tmp_path, monkeypatch, saved_at
):
    """``checkpoint()`` requeues at most 0.25 s after rank 0's marker appears, whether the save
    took 2 or 30 s (on a clock of the test's, slept through by the wait). With the back-off it
    had (up to 1 s), a save made 9.1 s in was seen 0.96 s late."""
    marker, now, real = tmp_path / "stop", [0.0], signals.wait_until

    def sleep(delay: float) -> None:
        now[0] += delay
        if now[0] >= saved_at and not marker.exists():
            marker.write_text("{}")

    def on_test_clock(check, what, timeout=None, backoff=None, **_):
        return real(check, what, timeout, backoff, sleep=sleep, clock=lambda: now[0])

    monkeypatch.setattr(signals, "wait_until", on_test_clock)
    assert signals.wait_for_save(marker, 600) is True
    assert now[0] - saved_at <= 0.25
