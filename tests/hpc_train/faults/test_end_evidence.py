"""Task 0's wait for the exit records after a crash, bounded by what it waits for (issue 46: at
16 real nodes it waited 14 s for nodes still tearing down ranks that died of the lost peer).

The wait's clock is the test's own: ``wait_until`` (as ``hpc_core.doorbell.await_word``, the
wait for another node's word, calls it) is replaced by ``FakeWait``, which moves a
fake clock by the poll's step and writes each node's record at the fake time the test says, so
"how long task 0 waited" is counted, never timed."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from hpc_core import doorbell
from hpc_core.rundir import RunDir
from hpc_train.contract import StartFiles
from hpc_train.faults import end_evidence, failures
from hpc_train.faults.end_evidence import Ended, Question, SlurmWord, Where
from hpc_train.faults.failures import Failure, NodeExit
from hpc_train.faults.suspects import Evidence, crash_suspect

STEP = 0.1  # the fake poll
HOSTS = tuple(f"n{i + 1}" for i in range(8))


class FakeWait:
    """``wait_until`` on a fake clock: each poll ``STEP`` later; ``writes``: (time, record)."""

    def __init__(self, files: StartFiles, writes: list[tuple[float, NodeExit]]) -> None:
        self.now, self.files, self.writes = 0.0, files, sorted(writes, key=lambda w: w[0])

    def clock(self) -> float:
        return self.now

    def _write_due(self) -> None:
        while self.writes and self.writes[0][0] <= self.now:
            write_at(self.files, *self.writes.pop(0))

    def __call__(
        self, check: Callable[[], object], what: str, timeout: float, backoff, **_
    ) -> object:
        start = self.now
        while self.now - start < timeout:
            self.now += STEP
            self._write_due()
            if (found := check()) is not None:
                return found
        raise TimeoutError(what)


def write_at(files: StartFiles, when: float, record: NodeExit) -> None:
    """``record`` written at fake time ``when`` (its file's time too)."""
    failures.write_exit(files, record)
    os.utime(files.node_exit(record.task), (when, when))


def records(killed: dict[int, int]) -> list[NodeExit]:
    """Each node's record: exit 1 after its ranks died of the lost peer, or the kill given."""
    return [NodeExit(t, h, 1, t * 2, killed.get(t, 1)) for t, h in enumerate(HOSTS)]


def awaited(tmp_path, monkeypatch, at: dict[int, float], killed: dict[int, int],
            start: float = 0.0):  # fmt: skip
    """Task 0's wait from fake time ``start``: node t's record written at fake time ``at[t]``
    (by ``start``: before the wait; absent: never); what it read, whether it waited, and when
    it stopped."""
    files = StartFiles(RunDir(tmp_path), "41", 0)
    recs = records(killed)
    for t, when in at.items():
        if when <= start:
            write_at(files, when, recs[t])
    fake = FakeWait(files, [(when, recs[t]) for t, when in at.items() if when > start])
    fake.now = start
    monkeypatch.setattr(doorbell, "wait_until", fake)
    exits, waited = end_evidence._exits_awaited(files, len(HOSTS), fake.clock)
    return exits, waited, fake.now


def test_a_node_killed_by_a_signal_ends_the_wait_soon_after_its_record(tmp_path, monkeypatch):
    """n8's rank SIGKILLed: its record says so at 1 s; the others tear down ranks that died of
    the lost peer, their records at 2 to 14 s. Task 0 stops KILLED_GRACE_S after n8's (not at
    14 s), with n8's record: the blame is the same as with every record."""
    at = {0: 0.0, 7: 1.0, **{t: 2.0 + 2 * t for t in range(1, 7)}}  # n2..n7: 4 s .. 14 s
    exits, waited, stopped = awaited(tmp_path, monkeypatch, at, {7: -9})
    assert waited and stopped == pytest.approx(1.0 + end_evidence.KILLED_GRACE_S, abs=2 * STEP)
    assert stopped < max(at.values())  # before the slowest node's record
    suspect = crash_suspect([], exits, HOSTS, {})
    assert suspect is not None and (suspect.node, suspect.evidence) == ("n8", Evidence.SIGNAL)
    every = tuple(failures.read_exits(StartFiles(RunDir(tmp_path), "41", 0), 8).values())
    assert crash_suspect([], every, HOSTS, {}) == suspect  # once all are in: the same


def test_a_kill_said_long_before_task_0_looks_ends_the_wait_at_its_first_look(
    tmp_path, monkeypatch
):
    """As measured at 16 hollow nodes: the killed node's record 4.8 s before task 0's own
    torchrun ended (the lost peer's cascade), the rest 0-2 s after. The grace counts from the
    kill's record: task 0 decides at its first look, without the others'."""
    at = {7: 1.0, 0: 5.8, **{t: 6.0 + t / 3 for t in range(1, 7)}}
    exits, waited, stopped = awaited(tmp_path, monkeypatch, at, {7: -9}, start=5.8)
    assert not waited and stopped == 5.8 and {e.node for e in exits} == {"n1", "n8"}
    suspect = crash_suspect([], exits, HOSTS, {})
    assert suspect is not None and (suspect.node, suspect.evidence) == ("n8", Evidence.SIGNAL)


def test_a_second_node_killed_within_the_grace_is_seen_and_no_one_node_blamed(
    tmp_path, monkeypatch
):
    at = {0: 0.0, 7: 1.0, 3: 1.0 + end_evidence.KILLED_GRACE_S / 2, 1: 14.0}
    exits, _, _ = awaited(tmp_path, monkeypatch, at, {7: -9, 3: -9})
    assert {e.node for e in exits if e.killed()} == {"n4", "n8"}
    assert crash_suspect([], exits, HOSTS, {}) is None


def test_without_a_kill_every_record_is_awaited_and_a_node_that_never_writes_is_lost(
    tmp_path, monkeypatch
):
    """No record says killed: the wait goes on for every record (a node without one is gone),
    up to EVIDENCE_WAIT_S; each record read once as it came."""
    at = {t: 1.0 + t for t in range(7)}  # n8 never writes
    exits, waited, stopped = awaited(tmp_path, monkeypatch, at, {})
    assert waited and stopped == pytest.approx(end_evidence.EVIDENCE_WAIT_S, abs=2 * STEP)
    assert [e.node for e in exits] == list(HOSTS[:7])
    suspect = crash_suspect([], exits, HOSTS, {})
    assert suspect is not None and (suspect.node, suspect.evidence) == ("n8", Evidence.LOST)


def test_every_record_in_at_the_first_look_is_no_wait(tmp_path, monkeypatch):
    exits, waited, stopped = awaited(tmp_path, monkeypatch, dict.fromkeys(range(8), 0.0), {})
    assert not waited and stopped == 0.0 and len(exits) == 8


def test_a_user_error_report_blames_no_node_so_task_0_does_not_wait(tmp_path, monkeypatch):
    """A rank's own error that is the training code's: no node is blamed whatever the records
    say (``crash_suspect``), so task 0 reads the evidence at once, no record awaited."""

    def no_wait(*args, **kwargs):
        raise AssertionError("task 0 waited for the exit records")

    run = RunDir(tmp_path)
    failures.write(run, "41", 0, Failure(3, 40, "ValueError", "bad batch"))
    monkeypatch.setattr(doorbell, "wait_until", no_wait)  # every wait of the evidence's
    where = Where(StartFiles(run, "41", 0), 0, HOSTS, len(HOSTS), node="n1")
    ev = end_evidence.at_exit(where, Ended(1, False), (), 100)
    assert ev.exits == () and [f.rank for f in ev.failures] == [3]


# --- Slurm's word: a question's parts asked at once (issue 46), against the fake Slurm of
# tests/hpc_train/conftest.py (no Slurm in this tier; the real-Slurm decisions are in
# tests/integration)


def test_the_parts_of_one_question_are_asked_at_once(fake_slurm):
    """Each part of a question (the job, a node, a step probe, SlurmdTimeout, the partition)
    waits here until all five have been asked: asked one after another, the first would wait
    in vain (a broken barrier). A requeue's decision made five calls in a row: 1.45 s of it at
    39 hollow nodes, 0.07 s at 2."""
    together = threading.Barrier(5, timeout=10)
    for name in ("job_state", "node_info", "step_starts", "slurmd_timeout_s", "partition_nodes"):
        answer = getattr(fake_slurm, name)

        def waits(*args, _answer=answer, **kwargs):
            together.wait()
            return _answer(*args, **kwargs)

        setattr(fake_slurm, name, waits)
    fake_slurm.gone.add("n2")
    question = Question(job=True, nodes=("n2",), steps=("n2",), slurmd_timeout=True,
                        partition=True)  # fmt: skip
    word = end_evidence.ask(question, SlurmWord(), "41", clock=lambda: 7.0)
    assert word.job is not None and word.job.state == "RUNNING"
    assert word.nodes["n2"].state == "IDLE" and word.steps["n2"] == (False, 7.0)
    assert word.no_start_since == {"n2": 7.0} and word.slurmd_timeout_s == 0.5
    assert word.partition is not None and word.partition.states == fake_slurm.partition


def test_each_question_is_counted_with_the_seconds_its_answers_took(fake_slurm, monkeypatch):
    """A decision's word keeps how many questions it asked, how long their answers took in all
    and which part was slowest (``recovery.Weighed``, in the launcher's log: where a decision's
    time goes at scale). The fake clock moves as the fake Slurm answers: 0.25 s for the job,
    0.5 s for the node; the parts asked one after another here (at once, the question waits
    for its slowest part only: the test above)."""
    now = [100.0]
    monkeypatch.setattr(end_evidence, "_at_once", lambda calls: {n: c() for n, c in calls.items()})
    for name, late in (("job_state", 0.25), ("node_info", 0.5)):
        real = getattr(fake_slurm, name)

        def answer(*args, _real=real, _late=late, **kwargs):
            now[0] += _late
            return _real(*args, **kwargs)

        setattr(fake_slurm, name, answer)
    clock = lambda: now[0]  # noqa: E731
    word = end_evidence.ask(Question(job=True, nodes=("n2",)), SlurmWord(), "41", clock)
    assert (word.questions, word.waited_s, word.slowest) == (1, 0.75, ("node n2", 0.5))
    again = end_evidence.ask(Question(job=True), word, "41", clock)
    assert (again.questions, again.waited_s, again.slowest) == (2, 1.0, ("node n2", 0.5))


def test_the_partitions_question_reads_the_jobs_exclusions_from_its_one_show_job(fake_slurm):
    """The job's ExcNodeList comes with its state (one ``scontrol show job``, also where the
    partition is asked first: then the job is asked with it), never a second look-up."""
    fake_slurm.excluded.append(("41", ["n3", "n4"]))
    infos: list[str] = []
    fake_slurm.job_info = lambda job_id: infos.append(job_id) or {}
    word = end_evidence.ask(Question(partition=True), SlurmWord(), "41")
    assert word.partition is not None and word.partition.excluded == ("n3", "n4")
    assert word.job is not None and fake_slurm.jobs_asked == ["41"] and infos == []
    again = end_evidence.ask(Question(partition=True), word, "41")
    assert again.partition is not None and again.partition.excluded == ("n3", "n4")
    assert fake_slurm.jobs_asked == ["41"]  # the job's word of this decision, asked once


def test_task_0_alone_reads_every_nodes_heartbeats(tmp_path, monkeypatch):
    """A node other than task 0 weighs its own end (it follows task 0's word): it reads its own
    heartbeats only; task 0 reads every node's (the ranks' nodes, how far the round got).
    Before issue 46 every node read them all: N x N reads at each end of a round."""
    from hpc_train.worker.heartbeat import Heartbeat

    files = StartFiles(RunDir(tmp_path), "41", 0)
    for rank, node in enumerate(("n1", "n2", "n3")):
        monkeypatch.setenv("SLURMD_NODENAME", node)
        Heartbeat(files.heartbeats(node), rank).completed(7)
    read: list[str] = []
    real = end_evidence.read_beats
    monkeypatch.setattr(end_evidence, "read_beats", lambda d: read.append(d.name) or real(d))
    hosts = ("n1", "n2", "n3")

    def beats_read(task: int) -> tuple[set[str], list[str]]:
        read.clear()
        where = Where(files, task, hosts, 3, node=hosts[task])
        ev = end_evidence.at_exit(where, Ended(0, False), (), 7)  # finished: no wait
        return set(ev.beats), list(read)

    assert beats_read(1) == ({"n2"}, ["n2"])
    assert beats_read(0) == (set(hosts), list(hosts))


def test_task_0_adds_nothing_to_a_round_whose_end_was_decided_already(tmp_path, monkeypatch):
    """CI, 2026-11-29 (test_hang's stuck task-0 launcher): task 1 found task 0's launcher stuck,
    the ranks saved on notice, and it requeued the job and wrote the round's verdict; the
    requeue's SIGCONT woke task 0's launcher, whose torchrun had exited, and it recorded the
    round's end a second time (a ``stopped``, a ``requeued``, an ``scontrol requeue``). Task 0
    reads the verdict first: no exit record awaited, and the policy adds nothing."""
    from hpc_core import ledger
    from hpc_train.contract import RoundAction, RoundVerdict
    from hpc_train.launch import restart_policy, transition

    def no_wait(*args, **kwargs):
        raise AssertionError("task 0 waited for the exit records")

    run = RunDir(tmp_path)
    files = StartFiles(run, "41", 0)
    monkeypatch.setattr(doorbell, "wait_until", no_wait)
    opt = restart_policy.EndOptions(100, 3, False, 1, True, "no", None)
    task_0 = Where(files, 0, HOSTS, len(HOSTS), node="n1")
    assert end_evidence.at_exit(task_0, Ended(0, False), (), 100).decided is None  # none yet
    why = "stuck launcher: the launcher on n1 (task 0) is silent for 30 s (last: waiting)"
    files.write_verdict(RoundVerdict(RoundAction.REQUEUE, why))
    ev = end_evidence.at_exit(task_0, Ended(1, False), ("notice",), 100)
    assert ev.decided is not None and ev.decided.why == why and ev.exits == ()
    found = restart_policy.after_end(ev, opt)
    assert isinstance(found, transition.Ignore) and why in found.why
    assert "nothing to add" in found.said[0] and not found.blames
    assert ledger.read(run.ledger) == []  # and nothing written on the way
    follower = end_evidence.at_exit(Where(files, 1, HOSTS, len(HOSTS), node="n2"),
                                    Ended(1, False), (), 100)  # fmt: skip
    assert follower.decided is None  # task 0's word is the others' to follow, as before


def test_task_0s_evidence_says_how_long_reading_it_took_its_wait_for_records_in_it(
    tmp_path, monkeypatch
):
    """Task 0's evidence of a crash keeps the seconds reading it took (``read_s``, said in its
    ``weighed:`` line): here its wait for the other nodes' exit records, 0.2 s of real sleep
    before n2's record comes; a node that waits for nothing reads in far less."""
    import time

    files = StartFiles(RunDir(tmp_path), "41", 0)
    hosts = ("n1", "n2")

    def slow_wait(check, what, timeout, backoff, **_):
        time.sleep(0.2)
        failures.write_exit(files, NodeExit(1, "n2", 1, 2, 1))
        return check()

    monkeypatch.setattr(doorbell, "wait_until", slow_wait)
    task_0 = Where(files, 0, hosts, 2, node="n1")
    ev = end_evidence.at_exit(task_0, Ended(1, False), (), 100)
    assert [e.node for e in ev.exits] == ["n2"] and ev.read_s >= 0.2
    assert 0 < ev.read_cpu_s < 0.1  # its CPU apart: the wait was no work
    follower = end_evidence.at_exit(Where(files, 1, hosts, 2, node="n2"), Ended(1, False), (), 100)
    assert follower.read_s < 0.2


def test_a_decisions_cpu_counts_the_slurm_clients_it_ran():
    """``cpu_s`` (the CPU of a ``weighed:`` line) counts this process's threads and the children
    it waited for, as a decision's Slurm clients are; not the wall clock: a child sleeping half
    a second adds little, one spinning for 0.3 s of CPU adds that."""
    import subprocess
    import sys

    began = end_evidence.cpu_s()
    subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"], check=True)
    slept = end_evidence.cpu_s() - began
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    spun = end_evidence.cpu_s() - began - slept
    assert slept < 0.25 and spun >= 0.3, (slept, spun)
