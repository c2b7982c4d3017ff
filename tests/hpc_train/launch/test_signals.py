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

from hpc_core import doorbell
from hpc_train.contract import Cause, LauncherBell, StopMarker, write_stop
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
    marker, now, real = tmp_path / "stop", [0.0], doorbell.wait_until

    def sleep(delay: float) -> None:
        now[0] += delay
        if now[0] >= saved_at and not marker.exists():
            marker.write_text("{}")

    def on_test_clock(check, what, timeout=None, backoff=None, **_):
        return real(check, what, timeout, backoff, sleep=sleep, clock=lambda: now[0])

    monkeypatch.setattr(doorbell, "wait_until", on_test_clock)  # await_word's: unrung here
    assert signals.wait_for_save(marker, 600) is True
    assert now[0] - saved_at <= 0.25


def test_the_save_on_notice_rung_by_rank_0_is_seen_at_once(tmp_path, monkeypatch):
    """Rank 0 rings task 0's bell as it writes the marker (``contract.write_stop``): the wait
    ends at the ring, here with its looks a minute apart (a real UDP bell on loopback; without
    the ring the test's 20 s deadline ends it: False)."""
    from hpc_core.wait import Backoff

    marker, looked, real = tmp_path / "stop", threading.Event(), doorbell.wait_until
    bell = doorbell.open_here(tmp_path / "bells", "localhost", "41-0")
    assert bell is not None

    def a_minute_apart(check, what, timeout=None, backoff=None, **more):
        def first_look_said():
            found = check()
            looked.set()
            return found

        return real(first_look_said, what, timeout, Backoff(60.0, 1.0, 60.0), **more)

    def rank_0() -> None:
        looked.wait(20)
        ringing = LauncherBell(tmp_path / "bells", "localhost", "41-0")
        write_stop(marker, StopMarker(7, "SIGUSR2"), ringing)

    monkeypatch.setattr(doorbell, "wait_until", a_minute_apart)
    thread = threading.Thread(target=rank_0)
    thread.start()
    try:
        assert signals.wait_for_save(marker, 20) is True and bell.rung >= 1
    finally:
        thread.join()
        doorbell.close_here()
