"""The launcher's parts one by one, in milliseconds, each without a Launcher: a start's end
read once (``faults.end_evidence``), decided (``recovery.what_follows``: the policy) and carried out
(``recovery.carry_out``: requeue, in-job round, spares, blame), ``rounds`` and ``lifecycle``,
against the fake Slurm of tests/hpc_train/conftest.py (it records requeues, drains, exclusions:
no Slurm here)."""

from __future__ import annotations

import dataclasses
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hpc_core import doorbell, ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train.contract import (
    Cause,
    FailureRecord,
    NodeReport,
    RoundAction,
    RoundVerdict,
    StartDecision,
    StartFiles,
    StopMarker,
    read_verdict,
    write_failure,
    write_node_report,
    write_stop,
    write_verdict,
)
from hpc_train.faults import end_evidence, failures
from hpc_train.faults.end_evidence import Ended, EndEvidence, Ending, Question, SlurmWord
from hpc_train.faults.suspects import Evidence
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Recovery, Training, Watch
from hpc_train.launch import (
    lifecycle,
    recovery,
    release,
    requeue,
    restart_policy,
    rounds,
    signals,
    starts,
)
from hpc_train.launch.context import Here
from hpc_train.launch.rounds import Onward
from hpc_train.launch.starts import Start
from hpc_train.launch.transition import (
    Finish,
    Hold,
    InJobRound,
    Requeue,
    Stop,
    StoppedLine,
    Transition,
)


def here_of(
    tmp_path: Path, start: Start, nodes: tuple[int, int] = (1, 1), **sections: Any
) -> tuple[Here, list[tuple[str, dict]]]:
    """``start`` of a tiny CPU run on ``nodes`` (MIN, MAX), its ``sections`` as given."""
    notes: list[tuple[str, dict]] = []
    sizing = Sizing(nodes_min=nodes[0], nodes_max=nodes[1], gpus_per_node=0)
    job = JobSpec(Training("tiny", Path("/d"), tmp_path), sizing, **sections)
    return Here.of(job, start, lambda kind, **data: notes.append((kind, data))), notes


TWO = Start("41", 0, 2, "n1", 0, ("n1", "n2"))
IN_JOB = Recovery(restart_in_job=True)


def test_here_binds_the_start_key_once_for_every_part(tmp_path):
    here, _ = here_of(tmp_path, dataclasses.replace(TWO, round=2))
    assert (here.files.name, here.files.restart) == ("41.2", 0)
    assert here.files == here.start.files(here.run) == StartFiles(here.run, "41", 0, 2)


def ended(here: Here, returncode: int = 1, saved: bool = False, **seen: Any) -> EndEvidence:
    """torchrun's end on ``here``'s node, its evidence read as the launcher reads it."""
    return end_evidence.at_exit(here.where(), Ended(returncode, saved, **seen), (), 100)


def killed(here: Here, node: str = "n2") -> None:
    """Every node of the round wrote its exit record: ``node``'s torchrun was SIGKILLed, the
    others' failed (its peers lost it)."""
    for task, host in enumerate(here.start.hosts):
        failures.write_exit(here.files, failures.NodeExit(task, host, -9 if host == node else 1))


def blamed_before(here: Here, node: str = "n2") -> None:
    """An earlier job of the run blamed ``node``'s machine: its next blame drains it, whatever
    the evidence (``suspects.drain_verdict``)."""
    ledger.record(here.run.ledger, Kind.BLAMED, "40", 0, node=node, why="crash in job 40")


def decided(here: Here, ev: EndEvidence) -> Transition:
    return recovery.what_follows(ev, here.options)


def test_the_requeue_excludes_the_blamed_node_and_tells_the_others(tmp_path, fake_slurm):
    here, notes = here_of(tmp_path, TWO)
    ev = end_evidence.at_start(Ending.EXITED, here.where())
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        recovery.carry_out(here, Requeue(Cause.CRASH, "requeue did not take effect",
                                         exclude=("n2",)), ev)  # fmt: skip
    assert fake_slurm.requeued == ["41"] and fake_slurm.excluded == [("41", ["n2"])]
    assert read_verdict(here.run, "41", 0).action == RoundAction.REQUEUE
    assert [k for k, _ in notes] == ["requeued"]


def test_a_storage_fault_holds_the_job_and_the_others_wait_for_slurm(tmp_path, fake_slurm):
    """A ``Hold`` carried out: the stop and its cause in the ledger, the round's word a
    requeue (the other launchers and the spares wait for Slurm to end them), the job requeued
    held with the reason (``slurm.hold``), this task failing once Slurm has not ended it."""
    start = dataclasses.replace(TWO, standby=("n3",))
    here, notes = here_of(tmp_path, start)
    why = "torchrun exited with 1 (storage: OSError: [Errno 28] No space left on device); held"
    ev = end_evidence.at_start(Ending.EXITED, here.where())
    with pytest.raises(RuntimeError, match="No space left on device"):
        recovery.carry_out(here, Hold(Cause.STORAGE, why, StoppedLine(Cause.STORAGE, why, 1)), ev)
    assert fake_slurm.held == [("41", f"hpc-train: {why}")] and fake_slurm.requeued == []
    verdict = read_verdict(here.run, "41", 0)
    assert (verdict.action, verdict.standby) == (RoundAction.REQUEUE, ["n3"])
    assert [(k, d.get("cause") or d.get("by")) for k, d in notes] == [
        ("stopped", Cause.STORAGE), ("requeued", "task 0, held: scontrol release 41")
    ]  # fmt: skip


def test_a_requeue_that_could_not_start_stops_the_run_and_requeues_nothing(
    tmp_path, fake_slurm, monkeypatch
):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    fake_slurm.partition = {"n1": "idle", "n2": "idle"}
    here, notes = here_of(tmp_path, TWO, nodes=(2, 2))
    killed(here)
    blamed_before(here)  # n2 drained: left out, one usable node for --nodes 2
    t = decided(here, ev := ended(here))
    assert isinstance(t, Stop) and t.cause == Cause.NO_NODES and "n2" in t.why
    with pytest.raises(RuntimeError, match="cannot start: 1 usable node"):
        recovery.carry_out(here, t, ev)
    assert fake_slurm.requeued == [] and read_verdict(here.run, "41", 0).action == RoundAction.FAIL
    assert [k for k, _ in notes] == ["stopped", "blamed", "requeue_blocked"]


def test_the_nodes_kept_out_are_the_jobs_exclusions_and_the_quarantine(tmp_path, fake_slurm):
    fake_slurm.excluded.append(("41", ["n3"]))
    here, _ = here_of(tmp_path, TWO)
    assert requeue.excluded(here.spec, "41") == {"n3"}


def test_a_clean_exit_finishes_with_no_blame_and_a_crash_is_blamed_on_task_0(
    tmp_path, fake_slurm, monkeypatch
):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    here, _ = here_of(tmp_path, TWO)
    done = decided(here, ended(here, 0))
    assert isinstance(done, Finish) and done.blames == ()
    killed(here)
    blamed_before(here)  # the verdict drains n2: the requeue leaves it out
    t = decided(here, ended(here))
    assert isinstance(t, Requeue) and [b.node for b in t.blames] == ["n2"]
    assert t.blames[0].evidence is Evidence.SIGNAL and t.exclude == ("n2",)
    assert t.stopped is not None and t.stopped.why.startswith("torchrun exited with 1")
    # blamed, but the verdict keeps it (a first signal kill): nothing is left out
    other, _ = here_of(tmp_path / "first", TWO)
    killed(other)
    t = decided(other, ended(other))
    assert isinstance(t, Requeue) and [b.node for b in t.blames] == ["n2"] and t.exclude == ()


def test_a_stuck_agent_after_the_ranks_saved_is_the_notice_not_a_hang(
    tmp_path, fake_slurm, monkeypatch
):
    """The monitor killed torchrun after the ranks saved on notice: the start ends as the
    notice (the kill was ours: exit 0), no hang, nobody blamed."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.setattr(end_evidence, "REPORT_WAIT_S", 0.2)  # no hang reports
    here, _ = here_of(tmp_path, TWO)
    t = decided(here, ended(here, -9, saved=True, stuck="torchrun still there"))
    assert isinstance(t, Requeue) and t.stopped is not None and t.stopped.returncode == 0
    assert t.stopped.cause == "notice" and t.blames == () and t.hang is None
    assert "torchrun was stuck after its ranks finished (torchrun still there): killed" in t.said
    unsaved = decided(here, ended(here, -9, stuck="torchrun still there"))
    assert isinstance(unsaved, Requeue) and unsaved.stopped is not None
    assert "hang: torchrun stuck: torchrun still there" in unsaved.stopped.why
    assert unsaved.stopped.returncode == -9 and unsaved.hang is not None


def crashed(here: Here, files: StartFiles, message: str = "bad batch") -> None:
    """Rank 0 of ``files``' round raised at update 30 (its report), its torchrun exited 1."""
    write_failure(here.run, files.name, files.restart, FailureRecord(0, 30, "ValueError", message))
    failures.write_exit(files, failures.NodeExit(0, "n1", 1))


def crash_report(here: Here) -> tuple[tuple[Cause, str] | None, bool]:
    """What the round's reports say, read as task 0 reads them (``end_evidence.at_exit``):
    the crash, and whether the round before died of the same error."""
    ev = ended(here)
    return failures.explain(ev.failures, ev.before)


def test_the_same_user_error_in_two_in_job_rounds_of_one_start_is_the_same_failure_again(
    tmp_path, fake_slurm, monkeypatch
):
    """A bad input at update 30 ends round 0; round 1 resumes before it and dies of it again:
    the same failure again, compared with the round just before (before, with the same round's
    name in the Slurm start before, none: the run spent every restart on it)."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    one = Start("41", 0, 1, "n1", 0, ("n1",))
    round0, _ = here_of(tmp_path, one)
    crashed(round0, round0.files)
    assert crash_report(round0) == (
        (Cause.USER_ERROR, "ValueError: bad batch (rank 0, update 30)"), False
    )  # fmt: skip
    for n in (1, 2):  # rounds 1 and 2: each the same error again
        here, _ = here_of(tmp_path, dataclasses.replace(one, round=n))
        crashed(here, here.files)
        assert crash_report(here)[1] is True
    other, _ = here_of(tmp_path, dataclasses.replace(one, round=3))
    crashed(other, other.files, "another batch")
    assert crash_report(other)[1] is False


def test_after_a_requeue_a_crash_is_compared_with_the_last_round_of_the_start_before(
    tmp_path, fake_slurm, monkeypatch
):
    """Start 0 went through rounds 0 and 1 (the ledger's ``restarted``), then was requeued;
    start 1's round 0 compares with start 0's round 1, its last, not with its round 0."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    first, _ = here_of(tmp_path, Start("41", 0, 1, "n1", 0, ("n1",)))
    crashed(first, first.files, "first batch")
    last = StartFiles(first.run, "41", 0, round=1)
    ledger.record(first.run.ledger, "restarted", "41", 0, round=1, members=["n1"])
    crashed(first, last)
    again, _ = here_of(tmp_path, Start("41", 0, 1, "n1", 1, ("n1",)))
    assert again.files.round_before(ledger.read(again.run.ledger)) == last
    crashed(again, again.files)
    assert crash_report(again)[1] is True


def test_the_next_round_is_start_next_round_or_the_end_of_a_left_out_task(tmp_path):
    here, _ = here_of(tmp_path, dataclasses.replace(TWO, task=1))
    assert rounds.next_round(here, ["n1"], "crash").result["left_out"] is True
    assert rounds.next_round(here, ["n2", "n3"], "crash") == Onward(
        start=TWO.next_round(["n2", "n3"], "n2"), came_from="in-job restart after crash"
    )


def test_a_launcher_of_an_earlier_start_is_over(fake_slurm):
    def over() -> str:
        word = end_evidence.ask(Question(job=True), SlurmWord(), "41")
        assert word.job is not None
        return restart_policy.start_over(word.job, "41", 0)

    assert over() == ""
    fake_slurm.restarts = 1
    assert "belongs to restart 0" in over()


def in_the_job(here: Here, **more: Any) -> InJobRound:
    """Task 0's transition after n2's torchrun was killed: an in-job round, as these tests
    expect."""
    killed(here)
    t = decided(here, ended(here, **more))
    assert isinstance(t, InJobRound)
    return t


def test_an_in_job_restart_takes_a_spare_for_the_blamed_node(tmp_path, fake_slurm, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    start = dataclasses.replace(TWO, standby=("n3",))
    here, notes = here_of(tmp_path, start, nodes=(1, 2), recovery=IN_JOB)
    blamed_before(here)  # n2 drained: a spare in its place
    t = in_the_job(here)
    nxt = recovery.carry_out(here, t, ended(here))
    assert nxt == Onward(start=start.next_round(["n1", "n3"], "n1"),
                         came_from="in-job restart after crash: torchrun exited with 1")  # fmt: skip
    verdict = read_verdict(here.run, "41", 0)
    assert (verdict.action, verdict.members, verdict.standby) == (
        RoundAction.RESTART_IN_JOB,
        ["n1", "n3"],
        [],
    )
    assert notes[-1][0] == "restarted" and notes[-1][1]["spare_in"] == ["n3"]


def test_the_release_watcher_of_a_left_out_node_ends_with_the_job(
    tmp_path, fake_slurm, monkeypatch
):
    """The restart's watcher waits on the left-out node's task; once the job is no longer
    running it returns without releasing anything (a test's watcher must not outlive it: one
    that polled the next test's fake released a node there, CI stop 33)."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    here, _ = here_of(tmp_path, TWO, nodes=(1, 2), recovery=IN_JOB)
    blamed_before(here)
    recovery.carry_out(here, in_the_job(here), ended(here))
    (watcher,) = [t for t in threading.enumerate() if t.name == release.WATCHER]
    assert watcher.is_alive()  # n2's task has not said it ended
    fake_slurm.state = "COMPLETED"
    watcher.join(timeout=10)
    assert not watcher.is_alive() and fake_slurm.released == []


def test_below_min_the_in_job_restart_is_a_requeue(tmp_path, fake_slurm, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    here, _ = here_of(tmp_path, TWO, nodes=(2, 2), recovery=IN_JOB)
    killed(here)
    blamed_before(here)
    t = decided(here, ev := ended(here))
    assert isinstance(t, Requeue)  # the launcher requeues instead
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        recovery.carry_out(here, t, ev)
    assert fake_slurm.requeued == ["41"] and fake_slurm.excluded == [("41", ["n2"])]


def test_a_node_its_blame_keeps_restarts_in_the_job_and_is_not_released(
    tmp_path, fake_slurm, monkeypatch
):
    """Blamed but not drained (a first signal kill): the in-job restart keeps it, no spare
    comes in for it, nothing goes back to Slurm."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    start = dataclasses.replace(TWO, standby=("n3",))
    here, notes = here_of(tmp_path, start, nodes=(1, 2), recovery=IN_JOB)
    nxt = recovery.carry_out(here, in_the_job(here), ended(here))
    assert nxt.start == start.next_round(["n1", "n2"], "n1", ["n3"])
    verdict = read_verdict(here.run, "41", 0)
    assert (verdict.members, verdict.standby) == (["n1", "n2"], ["n3"])
    assert notes[-1][1]["left_out"] == [] and notes[-1][1]["spare_in"] == []
    assert fake_slurm.released == [] and fake_slurm.drained == []


def test_a_requeue_keeps_a_node_its_blame_keeps(tmp_path, fake_slurm, monkeypatch):
    """Without --restart-in-job a crash is a requeue: it excludes no node the verdict kept."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    here, _ = here_of(tmp_path, TWO)
    killed(here)
    t = decided(here, ev := ended(here))
    assert isinstance(t, Requeue)  # no --restart-in-job: the launcher requeues
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        recovery.carry_out(here, t, ev)
    assert fake_slurm.requeued == ["41"] and fake_slurm.excluded == []


def test_a_spare_joins_the_round_that_takes_it_as_start_next_round_says(tmp_path, fake_slurm):
    run = RunDir(tmp_path)
    spare = Start("41", 2, 3, "n1", 0, ("n1", "n2", "n3"))
    write_verdict(
        run, "41", 0, RoundVerdict(RoundAction.RESTART_IN_JOB, "crash", ["n1", "n2"], ["n3"])
    )
    write_verdict(
        run, "41.1", 0, RoundVerdict(RoundAction.RESTART_IN_JOB, "hang", ["n1", "n3"], [])
    )
    here, _ = here_of(tmp_path, spare)
    onward = rounds.stand_by(here, trains=2)
    start, why = onward.start, onward.came_from
    assert start == dataclasses.replace(spare, round=1).next_round(["n1", "n3"], "n3")
    assert start is not None and start.round == 2 and why == "in-job restart after hang"


def test_one_loop_follows_task_0_for_the_rounds_nodes_and_its_hot_spares(
    tmp_path, fake_slurm, monkeypatch
):
    """``rounds.follow``: n1-n3 train, n4 and n5 stand by. Round 0's word: n2 out, n4 in. n2
    (left out) ends, n3 joins round 1; spare n4 is taken in, spare n5 (not taken in) waits for
    round 1's word and is released by it. A word never comes: the node fails, not the spare."""
    run = RunDir(tmp_path)
    hosts = ("n1", "n2", "n3")
    start = Start("41", 0, 3, "n1", 0, hosts, 0, ("n4", "n5"))
    write_verdict(
        run, "41", 0, RoundVerdict(RoundAction.RESTART_IN_JOB, "crash", ["n1", "n3", "n4"], ["n5"])
    )
    write_verdict(run, "41.1", 0, RoundVerdict(RoundAction.DONE, "max-update reached", [], ["n5"]))
    n2, _ = here_of(tmp_path, dataclasses.replace(start, task=1))
    assert rounds.follow(n2, "crash").result["left_out"] is True
    n3, _ = here_of(tmp_path, dataclasses.replace(start, task=2))
    assert rounds.follow(n3, "crash") == Onward(
        start=start.next_round(["n1", "n3", "n4"], "n3", ["n5"]),
        came_from="in-job restart after crash",
    )
    spare = Start("41", 3, 5, "n1", 0, (*hosts, "n4", "n5"))
    n4, _ = here_of(tmp_path, spare)
    onward = rounds.follow(n4, "hot spare", spare=True)
    taken, why = onward.start, onward.came_from
    assert taken is not None and (taken.task, taken.round, taken.hosts) == (
        2,
        1,
        ("n1", "n3", "n4"),
    )
    assert why == "in-job restart after crash"
    n5, _ = here_of(tmp_path, dataclasses.replace(spare, task=4))
    assert rounds.follow(n5, "hot spare", spare=True).result["spare"] is True
    write_verdict(run, "41", 0, RoundVerdict(RoundAction.FAIL, "no restart left"))
    with pytest.raises(RuntimeError, match="crash; task 0: stop"):
        rounds.follow(n3, "crash")
    with pytest.raises(RuntimeError, match="hot spare: task 0 said stop"):
        rounds.follow(n4, "hot spare", spare=True)
    monkeypatch.setattr(rounds, "VERDICT_WAIT_S", 0.2)
    silent, _ = here_of(tmp_path, dataclasses.replace(start, task=2, restart=1))
    with pytest.raises(RuntimeError, match="crash; task 0 said nothing"):
        rounds.follow(silent, "crash")


def late_by(monkeypatch, module: Any, word_at: float, follow: Any) -> float:
    """How long after ``word_at`` (seconds on a clock of the test's, slept through by the waits
    of ``module`` and nothing else: ``hpc_core.doorbell``, whose ``await_word`` every wait for
    a node's word goes through) ``follow()`` saw a word that was there from then on."""
    now, real = [0.0], module.wait_until

    def on_test_clock(check, what, timeout=None, backoff=None, **_):
        def gated():
            return check() if now[0] >= word_at else None

        def sleep(delay: float) -> None:
            now[0] += delay

        return real(gated, what, timeout, backoff, sleep=sleep, clock=lambda: now[0])

    monkeypatch.setattr(module, "wait_until", on_test_clock)
    follow()
    monkeypatch.setattr(module, "wait_until", real)
    return now[0] - word_at


@pytest.mark.parametrize("word_at", [2.1, 9.1, 30.6])
def test_a_node_sees_task_0s_word_within_a_quarter_second_and_a_spare_within_a_second(
    tmp_path, fake_slurm, monkeypatch, word_at
):
    """However long a node has waited, it acts on task 0's verdict (``rounds.follow``) and on its
    start decision (``starts.decide_start``) at most 0.25 s after it is written, and a hot spare
    on a verdict at most 1 s after: the slowest of N nodes is no later at 64 nodes than at 2.
    With the back-off these waits had (up to 1 s, a spare's up to 5 s), a word written 9.1 s in
    was seen 0.98 s late, a spare's 30.6 s in 2.5 s late."""
    from hpc_train.launch import starts

    run = RunDir(tmp_path)
    start = Start("41", 0, 3, "n1", 0, ("n1", "n2", "n3"), 0, ("n4",))
    write_verdict(
        run, "41", 0, RoundVerdict(RoundAction.RESTART_IN_JOB, "crash", ["n1", "n3", "n4"], [])
    )
    n3, _ = here_of(tmp_path, dataclasses.replace(start, task=2))
    assert late_by(monkeypatch, doorbell, word_at, lambda: rounds.follow(n3, "crash")) <= 0.25
    spare, _ = here_of(tmp_path, Start("41", 3, 4, "n1", 0, ("n1", "n2", "n3", "n4")))
    assert late_by(monkeypatch, doorbell, word_at, lambda: rounds.follow(spare, "s", True)) <= 1.0
    files = start.files(run)
    files.write_decision(StartDecision([], 0, "fresh start", 1, False, 3, 8, 1))
    spec = JobSpec(Training("tiny", tmp_path / "d", tmp_path))
    task1 = dataclasses.replace(start, task=1)
    decide = lambda: starts.decide_start(run, task1, spec, 0, lambda _: None)  # noqa: E731
    assert late_by(monkeypatch, doorbell, word_at, decide) <= 0.25


def test_each_word_rings_the_nodes_that_wait_on_it(tmp_path, monkeypatch):
    """A report rings task 0 only; task 0's decision and its verdict ring every other node and
    the hot spares, never itself (``hpc_core.doorbell``: the waiting nodes look at once)."""
    rung: list[tuple[str, ...]] = []
    monkeypatch.setattr(doorbell, "ring", lambda registry, names, key: rung.append((*names, key)))
    run = RunDir(tmp_path)
    start = Start("41", 0, 2, "n1", 0, ("n1", "n2"), 0, ("n3",))
    spec = JobSpec(Training("tiny", tmp_path / "d", tmp_path))
    files = start.files(run)
    files.write_decision(StartDecision([], 0, "fresh start", 1, False, 2, 8, 1))
    starts.decide_start(run, dataclasses.replace(start, task=1), spec, 0, lambda _: None)
    assert rung == [("n1", "41-0")]  # n2's report: to task 0, of job 41's first start
    rung.clear()
    write_node_report(run, "41", 0, NodeReport(1, "n2", 0))
    starts.decide_start(run, start, spec, 0, lambda _: None)
    assert rung == [("n2", "n3", "41-0")]  # task 0's decision: to the others and the spare
    rung.clear()
    here, _ = here_of(tmp_path, start)
    here.tell(RoundVerdict(RoundAction.DONE, "done", [], ["n3"]))
    assert rung == [("n2", "n3", "41-0")] and read_verdict(run, "41", 0).why == "done"


def test_only_task_0_releases_the_spares(tmp_path):
    start = dataclasses.replace(TWO, standby=("n3",))
    other, _ = here_of(tmp_path, dataclasses.replace(start, task=1))
    ev = end_evidence.at_start(Ending.REACHED, other.where())
    recovery.carry_out(other, Finish("done"), ev)
    assert read_verdict(other.run, "41", 0) is None
    here, _ = here_of(tmp_path, start)
    recovery.carry_out(here, Finish("done"), ev)
    assert read_verdict(here.run, "41", 0).standby == ["n3"]


def blamed(here: Here) -> tuple[Any, bool]:
    """Task 0's blame for the round's end (the one it carries out: requeued): the blame and
    whether its verdict leaves the node out."""
    here.run.round_verdict("41", 0).unlink(missing_ok=True)  # the round weighed afresh each call
    t = decided(here, ev := ended(here))
    with pytest.raises(RuntimeError, match="requeue did not take effect"):
        recovery.carry_out(here, t, ev)
    (found,) = t.blames
    return found, found.leaves


def test_a_crash_is_blamed_on_the_node_whose_agent_was_killed(tmp_path, fake_slurm, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    here, notes = here_of(tmp_path, TWO)
    failures.write_exit(StartFiles(here.run, "41", 0), failures.NodeExit(0, "n1", 1))
    failures.write_exit(StartFiles(here.run, "41", 0), failures.NodeExit(1, "n2", -9))
    found, leave = blamed(here)
    assert found.node == "n2" and found.evidence is Evidence.SIGNAL
    assert fake_slurm.drained == [] and not leave  # a first kill by a signal: kept
    blames = [d for k, d in notes if k == "blamed"]
    assert len(blames) == 1 and blames[0]["drained"] is False
    # the machine's second blame (its first recorded in the ledger, as task 0's note does)
    # drains it, and the verdict leaves it out
    ledger.record(here.run.ledger, "blamed", "41", 0, **blames[0])
    found, leave = blamed(here)
    assert [n for n, _ in fake_slurm.drained] == ["n2"] and leave


def test_a_signal_kill_on_a_node_slurm_then_loses_is_a_lost_node(tmp_path, fake_slurm, monkeypatch):
    """kill-node --stop-slurmd: the node's torchrun is SIGKILLed, then its slurmd dies. No step
    starts there and Slurm marks it not responding: a lost node, drained at the first blame."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    here, notes = here_of(tmp_path, TWO)
    failures.write_exit(StartFiles(here.run, "41", 0), failures.NodeExit(0, "n1", 1))
    failures.write_exit(StartFiles(here.run, "41", 0), failures.NodeExit(1, "n2", -9))
    fake_slurm.gone.add("n2")
    fake_slurm.nodes["n2"] = {"State": "ALLOCATED+NOT_RESPONDING", "Reason": "Not responding"}
    found, leave = blamed(here)
    assert found.evidence is Evidence.LOST and leave
    assert "then Slurm lost it: ALLOCATED+NOT_RESPONDING" in found.why
    assert [n for n, _ in fake_slurm.drained] == ["n2"]
    blames = [d for k, d in notes if k == "blamed"]
    assert blames[0]["evidence"] == str(Evidence.LOST) and blames[0]["drained"] is True


def test_a_failed_probe_alone_never_drains(tmp_path, fake_slurm, monkeypatch):
    """No step starts on the node, but Slurm still counts it as up (a busy controller, the
    job ending): the signal kill stands, not drained (Slurm asked again until its
    SlurmdTimeout, the fake's 0.5 s)."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    here, notes = here_of(tmp_path, TWO)
    failures.write_exit(StartFiles(here.run, "41", 0), failures.NodeExit(0, "n1", 1))
    failures.write_exit(StartFiles(here.run, "41", 0), failures.NodeExit(1, "n2", -9))
    fake_slurm.gone.add("n2")
    found, leave = blamed(here)
    assert found.evidence is Evidence.SIGNAL and not leave
    blames = [d for k, d in notes if k == "blamed"]
    assert fake_slurm.drained == [] and blames[0]["drained"] is False


def test_a_round_asks_for_the_start_before_by_the_jobs_id_never_its_rounds_name(
    tmp_path, fake_slurm
):
    """Why the start before ended (``lifecycle.previous_end`` with no word from a round before:
    ``starts.previous_stop``, and task 0's ``node_blame.unrecorded_end``) is asked with the
    start's files, whose ``job`` is the job's id: round 2 (files ``41.2``) asks about job 41's
    restart 0. Once they took ``(key, restart)`` and got the round's key where the job id was
    meant, right only because every round after the first has its ``came_from``."""
    run = RunDir(tmp_path)
    ledger.record(run.ledger, "started", "41", 0, nodes=["n1", "n2"])
    write_stop(run.stop_marker("41", 0), StopMarker(9, "SIGUSR2"))
    later = dataclasses.replace(TWO, task=1, restart=1, round=2)
    task1, _ = here_of(tmp_path, later)
    assert (task1.files.name, task1.files.job) == ("41.2", "41")
    assert lifecycle.previous_end(task1, None) == "saved on notice (SIGUSR2) at update 9"
    run.stop_marker("41", 0).unlink()  # no word: Slurm ended it (NODE_FAIL), n2 is down
    fake_slurm.nodes["n2"] = {"State": "DOWN+NOT_RESPONDING", "Reason": "Not responding"}
    task0, notes = here_of(tmp_path, dataclasses.replace(later, task=0))
    assert lifecycle.previous_end(task0, None).startswith("node failure (n2 DOWN+NOT_RESPONDING")
    assert [(k, d["node"]) for k, d in notes] == [("blamed", "n2")]
    assert lifecycle.previous_end(task0, "in-job restart after crash") == (
        "in-job restart after crash"
    )


def test_lifecycle_builds_the_ranks_env_from_the_start_key(tmp_path):
    here, _ = here_of(tmp_path, dataclasses.replace(TWO, round=1))
    worker, env = lifecycle.environment(here, use_gpu=False)
    assert worker.start == ("41.1", 0) and worker.stop_marker == here.run.stop_marker("41.1", 0)
    assert env["HPC_TRAIN_STOP_MARKER"] == str(worker.stop_marker)


def test_only_task_0_of_a_narrow_run_watches_for_growth(tmp_path, fake_slurm):
    narrow, _ = here_of(tmp_path, TWO, nodes=(2, 3), recovery=Recovery(grow_after=60))
    task1 = Here.of(narrow.spec, dataclasses.replace(TWO, task=1), narrow.note)
    assert lifecycle.watch_growth(task1, lambda cause: None) is None
    watch = lifecycle.watch_growth(narrow, lambda cause: None)
    assert watch is not None and watch.stop() is None


def test_the_threads_beside_torchrun_start_in_watchers_the_spot_watch_too(tmp_path, monkeypatch):
    """``Watchers.start`` starts every thread beside one torchrun (the spot watch with the
    others) and ``Watchers.stop`` stops each."""
    started: list[str] = []

    class Thread:
        def __init__(self, name: str) -> None:
            started.append(name)
            self.stopped = False

        def stop(self) -> None:
            self.stopped = True

    monkeypatch.setattr(lifecycle, "watch_spot", lambda job_id: Thread(f"spot {job_id}"))
    monkeypatch.setattr(lifecycle, "watch_hangs", lambda here, nproc, pid: None)
    monkeypatch.setattr(lifecycle, "watch_stragglers", lambda here, spent: None)
    monkeypatch.setattr(lifecycle, "watch_growth", lambda here, own_notice: None)
    here, _ = here_of(tmp_path, TWO)
    watchers = lifecycle.Watchers()
    watchers.start(here, 1, 123, 0, signals.OwnNotice())
    assert started == ["spot 41"] and watchers.spot is not None
    assert watchers.stop() == (None, None, None) and watchers.spot.stopped


def test_a_cpu_job_counts_no_gpu_and_its_launcher_never_imports_torch():
    """``--gpus-per-node 0``: the count is 0 without torch (its import is ~1.7 s of CPU at every
    start of every node), checked in a fresh interpreter (this one may hold torch already); a
    GPU job asks torch, which finds no CUDA on this machine: 0 too."""
    import subprocess
    import sys

    probe = (
        "import sys; from hpc_train.launch import lifecycle; "
        "print(lifecycle.visible_gpus(0), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout  # fmt: skip
    assert out.split() == ["0", "False"], out
    assert lifecycle.visible_gpus(8) == 0


def test_task_0_imports_the_checkpoint_readers_while_the_nodes_report_and_its_ranks_train(
    tmp_path, fake_slurm, monkeypatch
):
    """What verifying a checkpoint imports (``checkpoints.warm``: torch and fairseq, 1.7-4 s
    cold) is off the decision's critical path: at a resume task 0 imports before it waits for the
    other nodes' reports (n2 reports here only once the import has begun, so a task 0 that
    imported after the wait would wait in vain), and, where rounds restart in the job, while its
    first start's ranks train, so that the first in-job round finds it done."""
    from hpc_train.launch import launcher, starts
    from hpc_train.worker import checkpoints

    began = threading.Event()
    monkeypatch.setattr(checkpoints, "warm", began.set)
    monkeypatch.setattr(starts, "DECISION_WAIT_S", 5.0)
    monkeypatch.setattr(checkpoints, "choose_resume",
                        lambda _: checkpoints.ResumePoint(None, (), "resume (a test's)", 40))  # fmt: skip
    run = RunDir(tmp_path)
    run.checkpoint_last.write_bytes(b"a checkpoint (never read: choose_resume is the test's)")
    spec = JobSpec(Training("tiny", tmp_path / "d", tmp_path), sizing=Sizing(gpus_per_node=0))

    def n2_reports() -> None:
        if began.wait(5):
            write_node_report(run, "41", 0, NodeReport(1, "n2", 0))

    reporter = threading.Thread(target=n2_reports)
    reporter.start()
    decision = starts.decide_start(run, TWO, spec, 0, lambda _: None)
    reporter.join()
    assert decision.at_update == 40

    class Trains(launcher.Launcher):  # torchrun: a process that exits 0 (training finished)
        def torchrun_command(self, start, nproc, args):
            return [sys.executable, "-c", "pass"]

    began.clear()
    for in_job, warmed in (
        (False, False),
        (True, True),
    ):  # a requeue's next decision: a new launcher's
        began.clear()
        fresh = JobSpec(Training("tiny", Path("/d"), tmp_path / f"fresh-{in_job}"),
                        sizing=Sizing(gpus_per_node=0), watch=Watch(no_watchdog=True),
                        recovery=Recovery(restart_in_job=in_job))  # fmt: skip
        Trains(fresh).run(Start("42", 0, 1, "n1", 0, ("n1",)), gpus=0)
        assert began.is_set() is warmed  # a fresh start: imported while its ranks trained
