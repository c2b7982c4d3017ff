"""In-job rounds: the next round in the allocation, task 0's word followed, the hot spares.

With ``--restart-in-job`` (or ``--spares K``) a bad end need not be a requeue: task 0 may restart
training in the allocation on the healthy nodes, topped up from the hot spares (the last K nodes
of the allocation, ``starts.allocation_start``) to the same width, so the recipe's batch stays N
(``starts.refill``). The launcher chooses (``Launcher._after``): ``choose_round`` gives the next round,
or None for a requeue (no in-job restarts, or fewer than ``--nodes`` MIN nodes left), and
``restart`` starts it: the round's verdict (``contract.RoundVerdict``), the nodes left out given
back to Slurm once their task has ended (``launch.release``, a thread), ``restarted`` in the
ledger.

Every other launcher of the round, and each hot spare, waits for task 0's word and follows it
(``follow``: one loop). A node of the round joins the next round, or ends its task if the round
left it out; a spare the round did not take in waits for the next round's word, until a round
takes it in or task 0 releases it as the run ends here (``release_spares``: ``DONE``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpc_core.ledger import Kind
from hpc_core.wait import FAST, Backoff, wait_until
from hpc_train.contract import IN_JOB_RESTART, RoundAction, RoundVerdict
from hpc_train.launch import release, requeue
from hpc_train.launch.context import Here, log
from hpc_train.launch.recovery import Aftermath
from hpc_train.launch.starts import Start, refill

SPARE_POLL = Backoff(1.0, 1.5, 5.0)  # a hot spare reads task 0's word: seconds matter, not ms
VERDICT_WAIT_S = 240.0  # for task 0's word after a bad end (its evidence waits come first)
Next = dict[str, Any] | tuple[Start, str]  # this node's result, or its next start and why


@dataclass(frozen=True)
class Round:
    """The next round task 0 chose in the allocation: who trains (``members``), who stands by,
    who is left out, and the spares taken in for them."""

    members: list[str]
    standby: list[str]
    left_out: list[str]
    spare_in: list[str]


def choose_round(here: Here, rec: Aftermath) -> Round | None:
    """Task 0 after a bad end: the next round in the allocation, without the nodes its blame's
    verdict leaves out (``Aftermath.leave_out``: a hot spare in each one's place; a node blamed
    but not drained, a first signal kill, trains on); None for a requeue instead: without
    in-job restarts, or when fewer than ``--nodes`` MIN nodes would be left."""
    start, spec = here.start, here.spec
    left_out = list(rec.leave_out)
    healthy = [h for h in start.hosts if h not in left_out]
    members, standby = refill(healthy, start.standby, start.num_nodes)  # a spare for each
    if not spec.recovery.in_job_restarts or len(members) < spec.sizing.nodes_min:
        return None
    return Round(members, standby, left_out, members[len(healthy) :])


def restart(here: Here, rec: Aftermath, nxt: Round) -> Next:
    """Task 0 restarts training in the allocation on ``nxt``: the round's verdict for every
    other launcher, each node left out released once its task has ended (a watcher thread),
    ``restarted`` in the ledger; this node's next start (or its end, if left out itself)."""
    start = here.start
    why = f"{rec.outcome.cause}: {rec.detail}"
    here.files.write_verdict(
        RoundVerdict(RoundAction.RESTART_IN_JOB, why, nxt.members, nxt.standby)
    )
    tasks = {start.hosts.index(n): n for n in nxt.left_out}
    release.start(release.LeftOut(here.files, tasks), log, here.note)
    spares = {"spare_in": nxt.spare_in, "spares": nxt.standby} if start.standby else {}
    here.note(Kind.RESTARTED, why=why, members=nxt.members, left_out=nxt.left_out,
              round=start.round + 1, **spares)  # fmt: skip
    log(f"in-job restart on {', '.join(nxt.members)} (without {', '.join(nxt.left_out) or 'none'}"
        + (f"; hot spare {', '.join(nxt.spare_in)} in" if nxt.spare_in else "") + ")")  # fmt: skip
    return next_round(here, nxt.members, why, nxt.standby)


def next_round(
    here: Here, members: Sequence[str], why: str, standby: Sequence[str] = (),
    start: Start | None = None,
) -> Next:  # fmt: skip
    """This node's part in an in-job restart on ``members`` (from ``start``, its round now:
    ``here.start`` unless a spare waited rounds): its next start, or (left out, blamed) the end
    of its task, a success: the run goes on without it."""
    start = start or here.start
    me = start.hosts[start.task]
    if me not in members:
        log(f"left out of the in-job restart ({why}): this task ends")
        return here.done(left_out=True)
    return start.next_round(members, me, standby), f"{IN_JOB_RESTART} after {why}"


def release_spares(here: Here, action: RoundAction, why: str) -> None:
    """Task 0, as the run ends in this allocation: the hot spares standing by end too."""
    start = here.start
    if start.task == 0 and start.standby:
        here.files.write_verdict(RoundVerdict(action, why, [], list(start.standby)))


def stand_by(here: Here, trains: int) -> Next:
    """A hot spare (``--spares``; ``trains``: the nodes that train): idle, following task 0's
    word round after round until a round takes it in (its next start, as a member) or the run
    ends in this allocation (its result)."""
    log(f"hot spare: standing by ({trains} node(s) train)")
    return follow(here, "hot spare", spare=True)


def follow(here: Here, why: str, spare: bool = False) -> Next:
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
            return here.done(spare=True)
        if verdict.action == RoundAction.REQUEUE:
            requeue.await_end()  # task 0's requeue ends this task
        said = f"{verdict.action} ({verdict.why})"
        raise RuntimeError(f"hot spare: task 0 said {said}" if spare else f"{why}; task 0: {said}")


def _word(here: Here, waiting: Start, why: str, spare: bool) -> RoundVerdict:
    """Task 0's verdict on the round ``waiting``: a spare waits as long as it takes, a node of
    the round ``VERDICT_WAIT_S`` at most (then it fails: task 0 is gone)."""
    files = waiting.files(here.run)
    if spare:
        return wait_until(files.verdict, f"round {waiting.round}'s end", None, SPARE_POLL)
    try:
        return wait_until(files.verdict, "task 0's verdict", VERDICT_WAIT_S, FAST)
    except TimeoutError:
        raise RuntimeError(f"{why}; task 0 said nothing in {VERDICT_WAIT_S:.0f} s") from None
