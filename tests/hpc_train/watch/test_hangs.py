"""The watchdog's decisions on synthetic heartbeats: pure, milliseconds."""

from __future__ import annotations

import os

import pytest

from hpc_train.contract import CHECKPOINT, EPOCH, STARTUP, STOPPING, TRAIN, Beat
from hpc_train.job.limits import HangLimits as Limits
from hpc_train.watch import hangs

LIMITS = Limits(factor=10, floor_s=30, save_s=120, startup_s=300)


def beat(rank=0, update=5, at=1000.0, phase=TRAIN, slowest=1.0, node="n1") -> Beat:
    return Beat(rank, node, 100 + rank, update, at, phase, slowest)


def test_the_defaults_are_the_documented_ones():
    assert Limits() == Limits(factor=10.0, floor_s=300.0, save_s=900.0, startup_s=900.0)
    assert "factor 10, floor 300 s, save 900 s" in " ".join((hangs.__doc__ or "").split())


def test_training_allowance_is_k_times_the_slowest_recent_update_or_the_floor():
    assert hangs.allowance(beat(slowest=1.0), LIMITS) == 30  # the floor
    assert hangs.allowance(beat(slowest=7.5), LIMITS) == 75  # 10 x 7.5 s
    assert hangs.allowance(beat(slowest=None), LIMITS) == 30  # nothing timed yet


@pytest.mark.parametrize("phase", [CHECKPOINT, EPOCH, STOPPING])
def test_validation_saves_epoch_changes_and_the_exit_get_the_longer_allowance(phase):
    assert hangs.allowance(beat(phase=phase), LIMITS) == 120
    assert hangs.allowance(beat(phase=phase, slowest=20), LIMITS) == 200  # 10 x 20 s wins
    assert hangs.allowance(None, LIMITS) == 300  # before the first update: start-up


def test_no_progress_past_the_allowance_is_a_hang_naming_the_rank():
    beats = [beat(0, update=41, at=1000.0), beat(1, update=40, at=995.0)]
    assert hangs.assess(beats, 2, started=900.0, now=1020.0, limits=LIMITS) is None
    hang = hangs.assess(beats, 2, started=900.0, now=1031.0, limits=LIMITS)
    assert hang is not None and hang.rank == 1 and hang.allowance_s == 30
    assert "rank 1 on n1: no update for 36 s after update 40" in hang.why


def test_no_false_positive_across_a_slow_validation_and_save():
    """A save taking 100 s (> the 30 s training allowance) is not a hang; 121 s is."""
    saving = [beat(0, update=50, at=1000.0, phase=CHECKPOINT)]
    assert hangs.assess(saving, 1, 0.0, now=1100.0, limits=LIMITS) is None
    assert hangs.assess(saving, 1, 0.0, now=1121.0, limits=LIMITS) is not None
    epoch_end = [beat(0, update=64, at=1000.0, phase=EPOCH)]
    assert hangs.assess(epoch_end, 1, 0.0, now=1110.0, limits=LIMITS) is None


def test_start_up_has_its_own_allowance_counted_from_torchruns_start():
    assert hangs.assess([], 2, started=1000.0, now=1299.0, limits=LIMITS) is None
    hang = hangs.assess([], 2, started=1000.0, now=1301.0, limits=LIMITS)
    assert hang is not None and hang.rank is None and "2 rank(s) completed no update" in hang.why
    # one rank trains, the other is still starting: fine until start-up runs out
    one = [beat(0, at=1290.0)]
    assert hangs.assess(one, 2, started=1000.0, now=1299.0, limits=LIMITS) is None
    assert hangs.assess(one, 2, started=1000.0, now=1301.0, limits=LIMITS) is not None


def test_a_rank_hung_in_start_up_is_named_by_its_first_beat():
    """The rank's ``startup`` beat (written once its stacks can be asked for) gets the start-up
    allowance from its own time, and names the rank (its pid: the watchdog can ask for stacks)."""
    starting = [beat(0, update=0, at=1000.0, phase=STARTUP, slowest=None), beat(1, at=1290.0)]
    assert hangs.allowance(starting[0], LIMITS) == 300
    assert hangs.assess(starting, 2, started=990.0, now=1280.0, limits=LIMITS) is None
    hang = hangs.assess(starting, 2, started=990.0, now=1301.0, limits=LIMITS)
    assert hang is not None and hang.rank == 0 and hang.allowance_s == 300
    assert (
        hang.why == "rank 0 on n1: no update for 301 s after it started (start-up; allowed 300 s)"
    )


def test_a_slow_but_steady_run_never_hangs():
    """Updates of 5 s each (allowance 50 s): polled every second for 10 minutes, no hang."""
    for now in range(1000, 1600):
        last = 1000 + 5 * ((now - 1000) // 5)
        beats = [beat(0, update=(now - 1000) // 5, at=float(last), slowest=5.0)]
        assert hangs.assess(beats, 1, 900.0, float(now), LIMITS) is None


def test_a_stopped_rank_is_not_waited_for_its_stacks(tmp_path, monkeypatch):
    """Real processes: rank 0 writes its stacks on the signal (faulthandler, as a rank does),
    rank 1 is SIGSTOPped. ``dump_stacks`` copies rank 0's and returns without waiting out the
    stack allowance for rank 1, which cannot answer while stopped."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from hpc_core.wait import process_state
    from hpc_train.contract import STACKS_SIGNAL
    from hpc_train.watch import hang_monitor

    code = (
        "import faulthandler, signal, sys, time\n"
        "f = open(sys.argv[1], 'a')\n"
        f"faulthandler.register({int(STACKS_SIGNAL)}, file=f, all_threads=True, chain=False)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    files = [str(hang_monitor.stacks_file(tmp_path, r)) for r in (0, 1)]
    procs = [subprocess.Popen([sys.executable, "-c", code, f], stdout=subprocess.PIPE, text=True)
             for f in files]  # fmt: skip
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        os.kill(procs[1].pid, signal.SIGSTOP)
        while process_state(procs[1].pid) != "T":
            time.sleep(0.01)
        monkeypatch.setattr(hang_monitor, "STACK_WAIT_S", 60.0)
        beats = [Beat(r, "n1", p.pid, 7, time.time()) for r, p in enumerate(procs)]
        began = time.monotonic()
        gave = hang_monitor.dump_stacks(beats, tmp_path, tmp_path / "incident")
        assert time.monotonic() - began < 30  # not the 60 s allowance
        assert gave == {0: True, 1: False}
        stacks = hang_monitor.incident_stacks(tmp_path / "incident", 0).read_text()
        assert "most recent call first" in stacks
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_stack_written_line_by_line_is_copied_whole(tmp_path):
    """A real process answers the stacks signal as faulthandler does, a line at a time, here
    with 0.3 s between its header and its frame (a rank descheduled mid-dump on a loaded
    machine): ``dump_stacks`` copies the whole dump, not the header alone (seen in CI)."""
    import subprocess
    import sys
    import time

    from hpc_train.contract import STACKS_SIGNAL
    from hpc_train.watch import hang_monitor

    code = (
        "import signal, sys, time\n"
        "f = open(sys.argv[1], 'a')\n"
        "def dump(signum, frame):\n"
        "    f.write('Thread 0x1 (most recent call first):\\n'); f.flush()\n"
        "    time.sleep(0.3)\n"
        "    f.write('  File \"train.py\", line 7 in step\\n\\n'); f.flush()\n"
        f"signal.signal({int(STACKS_SIGNAL)}, dump)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    path = hang_monitor.stacks_file(tmp_path, 0)
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        beats = [Beat(0, "n1", proc.pid, 7, time.time())]
        gave = hang_monitor.dump_stacks(beats, tmp_path, tmp_path / "incident")
        assert gave == {0: True}
        copied = hang_monitor.incident_stacks(tmp_path / "incident", 0).read_text()
        assert 'File "train.py", line 7 in step' in copied, copied
    finally:
        proc.kill()
        proc.wait()


def test_a_hang_declared_elsewhere_is_seen_at_the_next_short_look_not_the_next_heartbeat_poll(
    tmp_path, monkeypatch
):
    """The monitor thread ticks every ``DECLARED_POLL_S`` (0.25 s) and reads this node's
    heartbeats only every ``POLL_S`` (2 s): another node's declaration stops this node within a
    quarter second, not within a heartbeat poll (the last of 16 nodes came 2 s late). Its
    ticks run on a clock of the test's; its response to the hang is recorded, not run."""
    from hpc_core.rundir import RunDir
    from hpc_train.contract import StartFiles
    from hpc_train.watch import hang_monitor

    files = StartFiles(RunDir(tmp_path), "41", 0)
    reads: list[float] = []
    now = [100.0]
    monkeypatch.setattr(hang_monitor, "read_beats", lambda d: reads.append(now[0]) or [])
    monitor = hang_monitor.Monitor(files, "n2", 1, 2, LIMITS, os.getpid(), lambda: False, print)
    monitor.clock = lambda: now[0]
    acted: list[str] = []
    monkeypatch.setattr(monitor, "respond", acted.append)
    monkeypatch.setattr(monitor, "stop_ranks", lambda: acted.append("stopped"))
    assert monitor.interval == hang_monitor.DECLARED_POLL_S < hang_monitor.POLL_S

    ticks = [monitor.tick() for now[0] in (100.0, 100.25, 100.5, 101.75, 102.0, 102.25)]
    assert ticks == [None] * 6 and acted == []
    assert reads == [100.0, 102.0]  # the heartbeats at the 2 s pace only
    hang_monitor.declare(files.incident, "n1", "rank 0 on n1 gave no heartbeat")
    now[0] = 102.5
    assert monitor.tick() is True  # the next quarter second, no heartbeat read
    assert reads == [100.0, 102.0]
    assert acted == ["rank 0 on n1 gave no heartbeat", "stopped"]
    assert monitor.result() == "rank 0 on n1 gave no heartbeat"


# --- the doorbell (issue 46): a real UDP bell on loopback (``hpc_core.doorbell``; the node is
# ``localhost``, resolved here as a Slurm node name is on a cluster). The monitor's looks are a
# minute apart: a test passes only if a ring woke it, and fails by its timeout, never a clock.


@pytest.fixture
def slow_monitor(tmp_path, monkeypatch):
    """A monitor of n2 (2 nodes, 1 rank) that looks once a minute, napping on this process's
    bell; its response to a hang recorded, not run (``acted``)."""
    from hpc_core import doorbell
    from hpc_core.rundir import RunDir
    from hpc_train.contract import StartFiles
    from hpc_train.watch import hang_monitor

    assert doorbell.open_here(tmp_path / "bells", "localhost", "41-0") is not None
    monkeypatch.setattr(hang_monitor, "DECLARED_POLL_S", 60.0)
    monkeypatch.setattr(hang_monitor, "POLL_S", 60.0)
    monkeypatch.setattr(hang_monitor, "read_beats", lambda d: [])
    files = StartFiles(RunDir(tmp_path), "41", 0)
    monitor = hang_monitor.Monitor(files, "n2", 1, 2, LIMITS, os.getpid(), lambda: False, print)
    monitor.acted = []
    monkeypatch.setattr(monitor, "respond", monitor.acted.append)
    monkeypatch.setattr(monitor, "stop_ranks", lambda: monitor.acted.append("stopped"))
    yield monitor
    monitor.stop()
    doorbell.close_here()


def test_a_hang_declared_elsewhere_and_rung_is_acted_on_at_once(tmp_path, slow_monitor):
    from hpc_core import doorbell
    from hpc_core.wait import wait_until
    from hpc_train.watch import hang_monitor

    slow_monitor.start()
    hang_monitor.declare(slow_monitor.incident, "n1", "rank 0 on n1 gave no heartbeat")
    assert doorbell.ring(tmp_path / "bells", ["localhost"], "41-0") == 1
    wait_until(lambda: slow_monitor.acted or None, "the monitor's response", 20.0)
    assert slow_monitor.acted == ["rank 0 on n1 gave no heartbeat", "stopped"]


def test_a_monitor_napping_on_the_bell_stops_at_once(slow_monitor):
    """``stop()`` rings the bell it naps on (no ring: the join would wait its 45 s)."""
    slow_monitor.start()
    slow_monitor.stop()
    slow_monitor.join(10.0)
    assert not slow_monitor.is_alive() and slow_monitor.acted == []


def test_the_declaration_and_the_last_report_ring_the_round(tmp_path, monkeypatch):
    """The node that declares rings the others (they nap until their next look); so does the
    node whose report completes the set (every node waits for all before it stops its
    ranks); an earlier report rings no one."""
    from hpc_core.rundir import RunDir, incident_report
    from hpc_train.contract import StartFiles
    from hpc_train.watch import hang_monitor

    files = StartFiles(RunDir(tmp_path), "41", 0)
    rung: list[str] = []

    def monitor(node: str) -> hang_monitor.Monitor:
        return hang_monitor.Monitor(files, node, 1, 2, LIMITS, os.getpid(), lambda: False,
                                    print, ring=lambda: rung.append(node))  # fmt: skip

    found = hangs.Hang(1, 31.0, 30.0, "rank 1 on n2: no update for 30 s")
    monkeypatch.setattr(hang_monitor.hangs, "assess", lambda *a, **k: found)
    monkeypatch.setattr(hang_monitor, "read_beats", lambda d: [])
    assert monitor("n2")._check() == found.why and rung == ["n2"]
    monkeypatch.setattr(hang_monitor.end_evidence, "REPORT_WAIT_S", 0.0)
    monitor("n1").respond(found.why)  # the first report of two
    assert rung == ["n2"] and incident_report(files.incident, "n1").exists()
    monitor("n2").respond(found.why)  # the second: every node's in
    assert rung == ["n2", "n2"]


def test_the_wait_for_torchruns_exit_ends_when_the_launcher_stops_the_monitor(
    tmp_path, monkeypatch
):
    """After a hang the monitor thread ends torchrun and polls for its exit; the launcher, once
    torchrun has exited, stops the monitor and joins it. The join must not wait for the
    monitor's next poll: up to a second apart once teardown took seconds (at 39 hollow nodes,
    up to a second of every node's end). Here the polls are a minute apart and torchrun (a
    process that ignores SIGTERM) "exits" when the test says: the thread ends at ``stop()``."""
    import subprocess
    import sys
    import threading

    from hpc_core.rundir import RunDir
    from hpc_core.wait import Backoff
    from hpc_train.contract import StartFiles
    from hpc_train.watch import hang_monitor

    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
         "; print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
        monkeypatch.setattr(hang_monitor, "FAST", Backoff(60.0, 1.0, 60.0))
        monkeypatch.setattr(hang_monitor, "read_beats", lambda d: [])
        gone, looked = threading.Event(), threading.Event()

        def exited() -> bool:
            looked.set()
            return gone.is_set()

        files = StartFiles(RunDir(tmp_path), "41", 0)
        monitor = hang_monitor.Monitor(files, "n1", 1, 2, LIMITS, stubborn.pid, exited, print)
        waiting = threading.Thread(target=monitor.stop_ranks)
        waiting.start()
        assert looked.wait(10.0)  # its first look: then a minute to the next
        gone.set()  # torchrun has exited: the launcher stops its watchers
        monitor.stop()
        waiting.join(10.0)
        assert not waiting.is_alive()
    finally:
        stubborn.kill()
        stubborn.wait()


def test_a_dump_is_settled_half_a_second_after_it_last_grew_not_at_the_next_half_second():
    """``_settle``'s condition on a clock of the test's, looks 0.1 s apart: a dump that grew
    0.2 s after the first look is complete at 0.7 s. Looks 0.5 s apart (before) saw it still
    growing at 0.5 s and settled at 1.0 s: at 16 and 39 hollow nodes one such dump was the
    hang's 0.4 s more than at 2."""
    from hpc_train.watch import hang_monitor

    tenths = [0]  # the clock, in tenths of a second: exact arithmetic
    sizes = {0: [10], 1: [10], 2: [25]}  # the dump grew between the 2nd and the 3rd look
    quiet = hang_monitor.Quiet(lambda: sizes.get(tenths[0], [25]), 5, lambda: tenths[0])
    settled_at = None
    for tick in range(20):
        tenths[0] = tick
        if quiet():
            settled_at = tick
            break
    assert settled_at == 7
    assert hang_monitor.SETTLE_LOOK_S <= hang_monitor.SETTLE_S / 4
