"""The policy as a table, submitit-style: every cause of a start's end (``contract.Cause``) in
every recovery mode (a requeue; ``--restart-in-job``; ``--spares 1``), what follows
(``restart_policy.after_end``). Pure: the evidence is given whole (``hpc_train.testing.end_cases``:
the files as ``faults.end_evidence`` reads them, Slurm's word as ``end_evidence.ask`` would
give it), and the whole table runs with no file opened and no process started (an audit hook
checks it). Its time is ``make bench-decision``'s to measure (a speed target is a benchmark's).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator

import pytest

from hpc_train.contract import Cause
from hpc_train.faults.suspects import Evidence
from hpc_train.launch import restart_policy
from hpc_train.launch.transition import (
    AskSlurm,
    Finish,
    Follow,
    Hold,
    InJobRound,
    Requeue,
    RequeueBy,
    Stop,
    Transition,
)
from hpc_train.testing import MODES, end_case, end_cases, on_task, questions

# what follows each cause, in each mode: a requeue, an in-job round, hot spares
TABLE: dict[Cause, tuple[type, type, type]] = {
    Cause.FINISHED: (Finish, Finish, Finish),
    Cause.NOTICE: (Requeue, InJobRound, InJobRound),  # task 0's own save on notice, restarted
    Cause.CRASH: (Requeue, InJobRound, InJobRound),
    Cause.INFRASTRUCTURE: (Requeue, InJobRound, InJobRound),
    Cause.USER_ERROR: (Requeue, InJobRound, InJobRound),
    Cause.HANG: (Requeue, InJobRound, InJobRound),
    Cause.STRAGGLER: (Requeue, InJobRound, InJobRound),
    Cause.BAD_NODE: (Requeue, Requeue, Requeue),  # a refused start: the allocation is wrong
    Cause.NO_PROGRESS: (Stop, Stop, Stop),
    Cause.NO_NODES: (Stop, Stop, InJobRound),  # a spare in n2's place: no requeue needed
    Cause.CANCELLED: (Stop, Stop, Stop),
    Cause.GROW: (Requeue, Requeue, Requeue),  # submitit's, after the save on notice
    Cause.STORAGE: (Hold, Hold, Hold),
    Cause.CHECKPOINT: (Requeue, InJobRound, InJobRound),  # from the newest good one, no blame
}
# the causes whose end points to n2 and blames it (its machine's second blame: drained)
BLAMED = {Cause.CRASH, Cause.NO_NODES, Cause.INFRASTRUCTURE, Cause.HANG, Cause.STRAGGLER,
          Cause.BAD_NODE}  # fmt: skip
EVIDENCE = {Cause.CRASH: Evidence.SIGNAL, Cause.NO_NODES: Evidence.SIGNAL,
            Cause.INFRASTRUCTURE: Evidence.OWN_ERROR, Cause.HANG: Evidence.HANG_NO_STACK,
            Cause.STRAGGLER: Evidence.STRAGGLER, Cause.BAD_NODE: Evidence.HEALTH_CHECK}  # fmt: skip


@pytest.fixture
def no_io() -> Iterator[list[str]]:
    """Every file opened and process started while it is active (a hook on Python's audit
    events: ``open`` for ``open()`` and ``os.open``, ``subprocess.Popen``)."""
    seen: list[str] = []
    active = [True]

    def hook(event: str, args: tuple[object, ...]) -> None:
        if active[0] and event in ("open", "subprocess.Popen", "os.system"):
            seen.append(f"{event}: {args[0]}")

    sys.addaudithook(hook)  # an audit hook cannot be removed: it goes quiet after the test
    yield seen
    active[0] = False


def stopped_cause(t: Transition) -> Cause | None:
    """The cause the ledger's ``stopped`` line (or the stop) says."""
    line = getattr(t, "stopped", None)
    return line.cause if line is not None else getattr(t, "cause", None)


def test_the_table_covers_every_cause_in_every_mode(tmp_path, no_io):
    cases = end_cases(tmp_path)
    assert {(c.cause, c.mode) for c in cases} == {(c, m) for c in Cause for m in MODES}
    assert set(TABLE) == set(Cause)
    got = {(c.cause, c.mode): restart_policy.after_end(c.evidence, c.options) for c in cases}
    assert no_io == []  # pure: nothing read, nothing asked
    wrong = {key: type(t).__name__ for key, t in got.items()
             if not isinstance(t, TABLE[key[0]][MODES.index(key[1])])}  # fmt: skip
    assert wrong == {}
    for (cause, mode), t in got.items():
        assert not isinstance(t, AskSlurm)
        expected = cause if cause not in (Cause.FINISHED, Cause.NO_NODES) else None
        if expected is not None:  # every stop says its cause, as the ledger will
            assert stopped_cause(t) == expected, (cause, mode, t)


@pytest.mark.parametrize("cause", sorted(BLAMED))
def test_whom_each_end_blames_and_what_it_leaves_out_in_each_mode(tmp_path, cause):
    """The node an end points to is blamed in every mode, on its evidence; drained (its
    machine's second blame), it is left out: excluded from the requeue, out of the in-job
    round (which goes on narrower, or with the hot spare in its place)."""
    for mode in MODES:
        case = end_case(tmp_path, cause, mode)
        t = restart_policy.after_end(case.evidence, case.options)
        ((blame),) = t.blames
        assert (blame.node, blame.evidence, blame.leaves) == ("n2", EVIDENCE[cause], True)
        assert blame.cause == (Cause.CRASH if cause == Cause.NO_NODES else cause)
        if isinstance(t, Requeue):
            assert t.exclude == ("n2",)
        if isinstance(t, InJobRound):
            spares = mode == "spares"
            assert t.left_out == ("n2",) and t.members == (("n1", "n3") if spares else ("n1",))
            assert t.spare_in == (("n3",) if spares else ())


@pytest.mark.parametrize("cause", [Cause.USER_ERROR, Cause.NOTICE, Cause.FINISHED])
def test_an_end_no_node_caused_blames_none_and_restarts_on_every_node(tmp_path, cause):
    for mode in MODES:
        case = end_case(tmp_path, cause, mode)
        t = restart_policy.after_end(case.evidence, case.options)
        assert t.blames == ()
        if isinstance(t, InJobRound):
            assert t.members == ("n1", "n2") and t.left_out == () and t.spare_in == ()


def test_the_ends_that_restart_say_which_restart_and_how(tmp_path):
    """The ledger's stopped line says what follows, truthfully: "requeue 1/20" or "in-job
    round 1/20"; a cancel and a saved grow say nothing of a restart."""
    for mode, said in (("requeue", "requeue 1/20"), ("in-job", "in-job round 1/20")):
        case = end_case(tmp_path, Cause.CRASH, mode)
        t = restart_policy.after_end(case.evidence, case.options)
        assert isinstance(t, Requeue | InJobRound) and t.stopped is not None
        assert t.stopped.why.endswith(f": {said}")
    grow = end_case(tmp_path, Cause.GROW, "in-job")
    t = restart_policy.after_end(grow.evidence, grow.options)
    assert isinstance(t, Requeue) and t.by is RequeueBy.SUBMITIT and t.stopped is not None
    assert (t.stopped.why, t.stopped.saved) == ("saved on notice", True)
    cancel = end_case(tmp_path, Cause.CANCELLED, "spares")
    t = restart_policy.after_end(cancel.evidence, cancel.options)
    assert isinstance(t, Stop) and not t.fails and t.blames == ()


def test_a_storage_fault_holds_the_job_and_blames_no_node(tmp_path):
    """No restart into the same full or read-only file system: the job is held with the
    reason, whatever the mode and the restarts left; no node is at fault for it."""
    for mode in MODES:
        case = end_case(tmp_path, Cause.STORAGE, mode)
        t = restart_policy.after_end(case.evidence, case.options)
        assert isinstance(t, Hold) and t.blames == () and t.stopped.cause == Cause.STORAGE
        assert t.why == t.stopped.why == t.said[-1]  # one line: the log's, the ledger's
        assert t.why.startswith(
            f"storage: {tmp_path} is full (ENOSPC): 4 kB free, quota "
            "unknown (no `lfs quota` on this node), a checkpoint needs "
            "4.2 MB; seen on n1, n2; job 41 held: fix the storage, then "
            "`scontrol release 41` resumes it"
        ), t.why


def test_the_other_tasks_follow_task_0_in_a_round_and_fail_without_one(tmp_path):
    """Task 1 meets the same crash: in a round it follows task 0's word; without in-job rounds
    its task fails, the requeue task 0's; it blames nobody either way."""
    for mode, kind in (("requeue", Stop), ("in-job", Follow), ("spares", Follow)):
        case = on_task(end_case(tmp_path, Cause.CRASH, mode), 1)
        t = restart_policy.after_end(case.evidence, case.options)
        assert isinstance(t, kind) and t.blames == ()
        assert "task 0 decides" in (t.why if isinstance(t, Follow | Stop) else "")


def test_a_decision_that_needs_slurms_word_asks_for_it_then_decides(tmp_path):
    """Without Slurm's word the policy asks for what its decision needs, each question with all
    it can name by then (issue 46: one wait for them, answered at once, not one call after
    another): the job's state (a cancel?) with the node the evidence points to (lost? its
    machine), after a kill by a signal whether a step still starts there, and, where a restart
    can only be a requeue, the partition the requeue must start in. Given the answers, it
    decides; a finish asks nothing."""

    def kinds(cause: Cause, mode: str = "requeue") -> list[str]:
        return ["+".join([*(["job"] if q.job else []), *q.nodes, *(["step"] if q.steps else []),
                          *(["partition"] if q.partition else [])])
                for q in questions(end_case(tmp_path, cause, mode))]  # fmt: skip

    assert kinds(Cause.HANG) == ["job+n2+partition"]  # no stack from n2: no probe
    assert kinds(Cause.CRASH) == ["job+n2+step+partition"]  # n2's rank killed by a signal
    assert kinds(Cause.CRASH, "in-job") == ["job+n2+step"]  # no requeue: no partition
    assert kinds(Cause.FINISHED) == [] and kinds(Cause.NO_PROGRESS) == []


def test_a_requeue_asks_the_partition_again_where_a_later_ask_left_its_word_stale(tmp_path):
    """The partition's word comes with the decision's first question (``_weighing``); a wait
    for Slurm's word on a node may follow it by seconds or minutes, and what the partition
    says then is what the requeue needs: asked again where a later ask came more than
    ``PARTITION_FRESH_S`` after it, or after it failed; never again where it is the last ask's
    (an error then is said, and the requeue goes ahead)."""
    case = end_case(tmp_path, Cause.CRASH, "requeue")
    word, fresh = case.evidence.slurm, restart_policy.PARTITION_FRESH_S
    assert word.partition is not None

    def decided(at: float, last: float, error: str = "") -> object:
        part = dataclasses.replace(word.partition, time=at, error=error)
        slurm = dataclasses.replace(word, partition=part, last_s=last)
        return restart_policy.after_end(dataclasses.replace(case.evidence, slurm=slurm),
                                        case.options)  # fmt: skip

    assert isinstance(decided(100.0, 100.0 + fresh / 2), Requeue)
    stale = decided(100.0, 100.0 + fresh + 1)
    assert isinstance(stale, AskSlurm) and stale.question.partition
    failed = decided(100.0, 101.0, "Unable to contact slurm controller")
    assert isinstance(failed, AskSlurm) and failed.question.partition
    said = decided(101.0, 101.0, "Unable to contact slurm controller")
    assert isinstance(said, Requeue) and any("cannot tell" in line for line in said.said)


def test_the_same_evidence_gives_the_same_transition(tmp_path):
    """Pure: decided twice, each case answers the same."""
    for case in end_cases(tmp_path):
        once = restart_policy.after_end(case.evidence, case.options)
        assert once == restart_policy.after_end(case.evidence, case.options)


def test_only_task_0_asks_for_the_jobs_state_whatever_the_end(tmp_path):
    """One shared answer to "was the job cancelled?" (issue 46: one `scontrol show job` per
    node): task 0 asks it for a crash or a hang, no other task ever does, in any mode."""
    for cause in (Cause.CRASH, Cause.HANG, Cause.INFRASTRUCTURE, Cause.USER_ERROR):
        for mode in MODES:
            case = end_case(tmp_path, cause, mode)
            assert any(q.job for q in questions(case)), (cause, mode)
            assert not any(q.job for q in questions(on_task(case, 1))), (cause, mode)
