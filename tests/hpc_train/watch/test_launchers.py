"""Launchers watched like the ranks (``hpc_train.watch.launchers``): the pure verdict, the pulse
with a clock the test moves, and what the launcher does about a stuck one, against the fake
Slurm (tests/hpc_train/conftest.py; the real-Slurm test is in tests/integration/test_hang.py)."""

from __future__ import annotations

import json
from pathlib import Path

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_core.wait import Backoff, wait_until
from hpc_train.contract import (
    ENDED,
    WAITING,
    LauncherBeat,
    StartFiles,
    StopMarker,
    read_launcher_beat,
    write_launcher_beat,
    write_stop,
)
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Training
from hpc_train.launch import launcher as launcher_module
from hpc_train.watch import launchers


def beat(task: int, t: float, phase: str = WAITING) -> LauncherBeat:
    return LauncherBeat(task, f"n{task + 1}", 100 + task, t, phase)


def test_task_0_watches_every_other_launcher_and_task_1_watches_task_0():
    assert launchers.watched(0, 4) == [1, 2, 3]
    assert launchers.watched(1, 4) == [0] and launchers.watched(2, 4) == []
    assert launchers.watched(0, 1) == []  # alone: nobody to watch, nobody watching
    assert launchers.allowance_s(10) == 30 and launchers.allowance_s(300) == 300


def test_a_launcher_is_silent_past_the_allowance_unless_its_part_is_over():
    beats = {1: beat(1, 110), 2: beat(2, 60), 3: beat(3, 10, ENDED), 4: None}
    found = launchers.silent(beats, ["n1", "n2", "n3", "n4", "n5"], 50, now=131, allowance=30)
    assert [(s.task, s.node, s.seconds, s.phase) for s in found] == [
        (2, "n3", 71, WAITING),
        (4, "n5", 81, "no beat yet"),  # counted from the start
    ]
    assert "the launcher on n3 (task 2) is silent for 71 s" in found[0].describe()


def test_the_pulse_beats_its_phase_and_reports_a_silent_launcher_once(tmp_path):
    run, now, said = RunDir(tmp_path), [1000.0], []
    pulse = launchers.Pulse(StartFiles(run, "41", 0), 0, ["n1", "n2", "n3"], 30, said.append,
                            clock=lambda: now[0])  # fmt: skip
    pulse.beat(WAITING)
    mine = read_launcher_beat(run, "41", 0, 0)
    assert mine is not None and (mine.phase, mine.time) == (WAITING, 1000.0)
    write_launcher_beat(run, "41", 0, beat(1, 1000))
    write_launcher_beat(run, "41", 0, beat(2, 1000, ENDED))
    now[0] = 1020.0
    assert pulse.check() is None and said == []
    now[0] = 1031.0
    first = pulse.check()
    assert first is not None and first.task == 1 and said == [first]
    now[0] = 1100.0
    assert pulse.check() is first and len(said) == 1  # once
    quiet = launchers.Pulse(StartFiles(run, "41", 0), 0, ["n1", "n2"], 30, said.append, watch=False)
    assert quiet.watching == [] and quiet.check() is None


def test_the_pulse_thread_beats_until_stopped_and_then_says_its_part_is_over(tmp_path):
    run = RunDir(tmp_path)
    pulse = launchers.Pulse(
        StartFiles(run, "41", 0), 1, ["n1", "n2"], 30, lambda s: None, interval=0.01
    )
    pulse.start()
    pulse.beat(WAITING)
    assert pulse.stop() is None
    last = read_launcher_beat(run, "41", 0, 1)
    assert last is not None and last.phase == ENDED


def test_a_pulse_whose_callback_fails_says_so_and_beats_on(tmp_path):
    """5d2ca00's CI run: task 1's requeue of a stuck task 0 raised on the pulse's thread, and the
    thread ended. A pulse thread that ends stops beating: the launcher watching this one would
    take it for stuck and blame its node. The callback's error is said; the beats go on."""
    run = RunDir(tmp_path)
    said: list[str] = []

    def fails(silence: launchers.Silence) -> None:
        raise RuntimeError("`scancel --signal=USR2 41` failed: exit -12")

    pulse = launchers.Pulse(StartFiles(run, "41", 0), 1, ["n1", "n2"], 0.05, fails,
                            interval=0.01, log=said.append)  # fmt: skip
    pulse.start()
    wait_until(lambda: pulse.failed, "the callback's failure", 10, Backoff(0.01, 1.0, 0.01))
    assert "exit -12" in pulse.failed and pulse.said is not None and pulse.said.task == 0
    (line,) = said
    assert "acting on it failed" in line and "beats on" in line and "Traceback" in line
    first = read_launcher_beat(run, "41", 0, 1)
    wait_until(lambda: read_launcher_beat(run, "41", 0, 1).time > first.time,
               "a beat after the failure", 10, Backoff(0.01, 1.0, 0.01))  # fmt: skip
    assert pulse._thread.is_alive() and pulse.stop() is pulse.said


def spec_in(tmp_path: Path) -> JobSpec:
    return JobSpec(
        Training("tiny", Path("/d"), tmp_path),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=0),
    )


def test_task_0_blames_a_stuck_launchers_node_and_saves_on_notice(tmp_path, fake_slurm):
    """While training: the node drained and blamed, USR2 to the job (the ranks are alive: they
    save), and the notice is task 0's own (its requeue is submitit's, as for any notice)."""
    launcher = launcher_module.Launcher(spec_in(tmp_path))
    start = launcher_module.Start("41", 0, 2, "n1", 0, ("n1", "n2"))
    launcher._begin(start)
    said = []  # the notice's cause as checkpoint() would read it, when the USR2 goes out
    sent = fake_slurm.signal
    fake_slurm.signal = lambda job, name="USR2": (
        said.append(launcher._own_notice.cause()),
        sent(job, name),
    )
    launcher._on_silent(start, launchers.Silence(1, "n2", 40, WAITING))
    assert [n for n, _ in fake_slurm.drained] == ["n2"]
    assert fake_slurm.signals == [("41", "USR2")] and fake_slurm.requeued == []
    assert said == ["hang"]  # claimed before the signal: its handler may run at once
    (blamed,) = [e for e in ledger.read(RunDir(tmp_path).ledger) if e.kind == "blamed"]
    assert blamed.get("node") == "n2" and "stuck launcher" in blamed.get("why")


def test_a_launcher_left_over_from_an_earlier_start_acts_no_more(tmp_path, fake_slurm):
    """A node's slurmd died (a lost node) and left its launcher running: the job was requeued
    (Slurm's restart count moved on), so the silence it sees is the old start's end. It
    blames, drains and signals nothing (in the soak it drained task 0's node and sent the next
    start a notice)."""
    launcher = launcher_module.Launcher(spec_in(tmp_path))
    start = launcher_module.Start("41", 1, 2, "n1", 0, ("n1", "n2"))
    launcher._begin(start)
    fake_slurm.restarts = 1
    launcher._on_silent(start, launchers.Silence(0, "n1", 40, "ending"))
    assert fake_slurm.drained == [] and fake_slurm.signals == [] and fake_slurm.requeued == []
    assert not [e for e in ledger.read(RunDir(tmp_path).ledger) if e.kind == "blamed"]
    fake_slurm.restarts, fake_slurm.state = 0, "COMPLETING"  # the job is ending: the same
    launcher._on_silent(start, launchers.Silence(0, "n1", 40, "ending"))
    assert fake_slurm.drained == [] and fake_slurm.signals == []


def test_task_1_acts_for_a_stuck_task_0_waits_for_the_save_and_requeues(tmp_path, fake_slurm):
    run = RunDir(tmp_path)
    write_stop(run.stop_marker("41", 0), StopMarker(77, "SIGUSR2"))  # the ranks saved
    launcher = launcher_module.Launcher(spec_in(tmp_path))
    start = launcher_module.Start("41", 1, 2, "n1", 0, ("n1", "n2"))
    launcher._begin(start)
    launcher._on_silent(start, launchers.Silence(0, "n1", 40, WAITING))
    assert fake_slurm.signals == [("41", "USR2")] and fake_slurm.requeued == ["41"]
    assert fake_slurm.excluded == [("41", ["n1"])] and [n for n, _ in fake_slurm.drained] == ["n1"]
    events = {e.kind: e for e in ledger.read(run.ledger)}  # task 1 writes them, as a deputy
    assert events["stopped"].get("cause") == "hang" and events["stopped"].get("saved") is True
    assert events["requeued"].get("by") == "task 1"
    verdict = json.loads(run.round_verdict("41", 0).read_text())
    assert verdict["action"] == "requeue"


def test_after_training_a_stuck_launcher_is_requeued_without_a_save(tmp_path, fake_slurm):
    """Training is over (task 0 awaits the others' end): no notice, the requeue at once; the
    next start finds max-update reached and ends the run."""
    launcher = launcher_module.Launcher(spec_in(tmp_path))
    start = launcher_module.Start("41", 0, 2, "n1", 0, ("n1", "n2"))
    launcher._begin(start)
    launcher._training_over = True
    launcher._on_silent(start, launchers.Silence(1, "n2", 40, "ending"))
    assert fake_slurm.signals == [] and fake_slurm.requeued == ["41"]


def test_a_stuck_task_0_woken_by_the_requeue_adds_nothing_to_the_ledger(tmp_path, fake_slurm):
    """Slurm's requeue sends SIGCONT before SIGTERM: the stuck task 0 wakes and its pending
    notice reaches submitit's checkpoint(); task 1 has requeued already (its verdict says so):
    no second stop, no second requeue in the ledger."""
    from hpc_train.contract import RoundAction, RoundVerdict, write_verdict

    run = RunDir(tmp_path)
    launcher = launcher_module.Launcher(spec_in(tmp_path))
    launcher._begin(launcher_module.Start("41", 0, 2, "n1", 0, ("n1", "n2")))
    write_verdict(run, "41", 0, RoundVerdict(RoundAction.REQUEUE, "stuck launcher: ..."))
    assert launcher.checkpoint() is not None
    assert ledger.read(run.ledger) == []


def test_task_0_reads_each_beat_about_once_an_allowance_and_still_finds_a_stuck_one_in_time(
    tmp_path,
):
    """Issue 46: task 0's pulse read every other launcher's beat every poll (39 reads each 5 s
    at 39 nodes, the O(N) share of its file operations). A beat read proves life up to its
    time, so one is read again only once it could pass the allowance by the next poll: here at
    most a sixth of the reads, and the launcher stopped at 1262 is found at the same poll as
    by reading every beat each poll (the reference: ``launchers.silent`` over all beats)."""
    run, nodes, allowance, interval = RunDir(tmp_path), 40, 30.0, 5.0
    hosts = [f"n{i + 1}" for i in range(nodes)]
    now, said = [1000.0], []
    pulse = launchers.Pulse(StartFiles(run, "41", 0), 0, hosts, allowance, said.append,
                            interval=interval, clock=lambda: now[0])  # fmt: skip
    stuck, polls, reference = 7, 0, None
    while not said and now[0] < 1500:
        for task in range(1, nodes):
            if task != stuck or now[0] <= 1262:
                write_launcher_beat(run, "41", 0, beat(task, now[0]))
        everyone = {t: read_launcher_beat(run, "41", 0, t) for t in range(1, nodes)}
        if reference is None and launchers.silent(everyone, hosts, 1000.0, now[0], allowance):
            reference = now[0]
        pulse.check()
        polls += 1
        now[0] += interval
    assert said and said[0].task == stuck and reference is not None
    assert now[0] - interval == reference  # found at the poll reading every beat finds it
    assert said[0].seconds > allowance
    assert pulse.reads <= (nodes - 1) * polls / 5  # was (nodes - 1) * polls


def test_an_ended_launcher_is_read_no_more(tmp_path):
    run, now = RunDir(tmp_path), [1000.0]
    pulse = launchers.Pulse(StartFiles(run, "41", 0), 0, ["n1", "n2"], 30, lambda s: None,
                            clock=lambda: now[0])  # fmt: skip
    write_launcher_beat(run, "41", 0, beat(1, 1000, ENDED))
    pulse.check()
    now[0] = 2000.0
    assert pulse.check() is None and pulse.reads == 1
