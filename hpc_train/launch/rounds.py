"""In-job rounds: a node's way on (``Onward``), task 0's word followed, the hot spares.

With ``--restart-in-job`` (or ``--spares K``) a bad end need not be a requeue: task 0's policy
(``restart_policy.after_end``) may restart training in the allocation on the healthy nodes,
topped up from the hot spares (the last K nodes of the allocation, ``starts.allocation_start``)
to the same width, so the recipe's batch stays N (``restart_policy.refill``); the executor
(``recovery``) writes the round's verdict (``contract.RoundVerdict``), gives the nodes left out
back to Slurm once their task has ended (``launch.release``, a thread) and records
``restarted``; each node then goes on with ``next_round``.

Every other launcher of the round, and each hot spare, waits for task 0's word and follows it
(``follow``: one loop). A node of the round joins the next round, or ends its task if the round
left it out; a spare the round did not take in waits for the next round's word, until a round
takes it in or task 0 releases it as the run ends here (its verdict: ``DONE``, or ``FAIL``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpc_core import doorbell
from hpc_core.wait import Backoff
from hpc_train.contract import IN_JOB_RESTART, RoundAction, RoundVerdict
from hpc_train.launch import requeue
from hpc_train.launch.context import Here, log
from hpc_train.launch.starts import Start

# a hot spare reads task 0's word (one open a poll) at most a second late: a round that takes it
# in waits for its report (at up to 5 s, the spare's poll was most of a hang round's relaunch)
SPARE_POLL = Backoff(0.25, 1.5, 1.0)
VERDICT_WAIT_S = 240.0  # for task 0's word after a bad end (its evidence waits come first)


@dataclass(frozen=True)
class Onward:
    """This node after one start: its task's result for submitit (``result``: the task ends),
    or its next start in the allocation (``start``) and why (``came_from``); neither: the
    start goes on (``came_from``: how the start before ended, weighed at its beginning)."""

    result: dict[str, Any] | None = None
    start: Start | None = None
    came_from: str = ""

    @classmethod
    def ends(cls, result: dict[str, Any]) -> Onward:
        return cls(result=result)


def next_round(
    here: Here, members: Sequence[str], why: str, standby: Sequence[str] = (),
    start: Start | None = None,
) -> Onward:  # fmt: skip
    """This node's part in an in-job restart on ``members`` (from ``start``, its round now:
    ``here.start`` unless a spare waited rounds): its next start, or (left out, blamed) the end
    of its task, a success: the run goes on without it."""
    start = start or here.start
    me = start.hosts[start.task]
    if me not in members:
        log(f"left out of the in-job restart ({why}): this task ends")
        return Onward.ends(here.done(left_out=True))
    return Onward(start=start.next_round(members, me, standby),
                  came_from=f"{IN_JOB_RESTART} after {why}")  # fmt: skip


def stand_by(here: Here, trains: int) -> Onward:
    """A hot spare (``--spares``; ``trains``: the nodes that train): idle, following task 0's
    word round after round until a round takes it in (its next start, as a member) or the run
    ends in this allocation (its result)."""
    log(f"hot spare: standing by ({trains} node(s) train)")
    return follow(here, "hot spare", spare=True)


def follow(here: Here, why: str, spare: bool = False) -> Onward:
    """Wait for task 0's word on this round and follow it: a node of the round after its bad end
    (``why``) joins the next round or, left out, ends; a hot spare (``spare``) joins the round
    that takes it in, waits on for the next round's word while one does not, and ends when task
    0 releases it. A requeue's word waits for Slurm to end this task."""
    me, waiting = here.start.hosts[here.start.task], here.start
    while True:
        verdict = _word(here, waiting, why, spare)
        if verdict.action == RoundAction.RESTART_IN_JOB and spare and me not in verdict.members:
            waiting = dataclasses.replace(waiting, round=waiting.round + 1)  # not taken in
            continue
        if verdict.action == RoundAction.RESTART_IN_JOB:
            if spare:
                log(f"hot spare taken in for round {waiting.round + 1}: {verdict.why}")
            return next_round(here, verdict.members, verdict.why, verdict.standby, waiting)
        if verdict.action == RoundAction.DONE and spare:
            log(f"hot spare released: {verdict.why}")
            return Onward.ends(here.done(spare=True))
        if verdict.action == RoundAction.DONE:  # the run ended well here (a cancel task 0 saw)
            log(f"{why}; task 0: {verdict.why}: this task ends")
            return Onward.ends(here.done())
        if verdict.action == RoundAction.REQUEUE:
            requeue.await_end()  # task 0's requeue ends this task
        said = f"{verdict.action} ({verdict.why})"
        raise RuntimeError(f"hot spare: task 0 said {said}" if spare else f"{why}; task 0: {said}")


def _word(here: Here, waiting: Start, why: str, spare: bool) -> RoundVerdict:
    """Task 0's verdict on the round ``waiting``: a spare waits as long as it takes, a node of
    the round ``VERDICT_WAIT_S`` at most (then it fails: task 0 is gone)."""
    files = waiting.files(here.run)
    if spare:
        return doorbell.await_word(files.verdict, f"round {waiting.round}'s end", None, SPARE_POLL)
    try:
        return doorbell.await_word(files.verdict, "task 0's verdict", VERDICT_WAIT_S)
    except TimeoutError:
        raise RuntimeError(f"{why}; task 0 said nothing in {VERDICT_WAIT_S:.0f} s") from None
