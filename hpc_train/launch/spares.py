"""Spares and release: the in-job restart's nodes, the hot spares, the nodes given back.

With ``--restart-in-job`` task 0 restarts training in the allocation after a bad end instead
of requeueing (``restart_in_job``): the healthy nodes, topped up from the hot spares
(``--spares K``: the last K nodes of the allocation, ``starts.allocation_start``) to the same
width, so the recipe's batch stays N (``starts.refill``). It writes the round's verdict
(``contract.RoundVerdict``) that every other launcher follows (``recovery.follow_verdict``), and
each node it left out goes back to Slurm once its task has ended (``launch.release``, a thread).
A hot spare waits for that verdict round after round (``stand_by``) until a round takes it in
or task 0 releases it as the run ends here (``release_spares``).
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Any

from hpc_core.wait import Backoff, wait_until
from hpc_train.contract import (
    DONE,
    IN_JOB_RESTART,
    REQUEUE,
    RESTART_IN_JOB,
    RoundVerdict,
)
from hpc_train.job.spec import JobSpec
from hpc_train.launch import release, requeue
from hpc_train.launch.context import Here, log
from hpc_train.launch.recovery import Next, Recovery, next_round
from hpc_train.launch.starts import Start, refill

SPARE_POLL = Backoff(1.0, 1.5, 5.0)  # a hot spare reads task 0's word: seconds matter, not ms


def release_spares(here: Here, action: str, why: str) -> None:
    """Task 0, as the run ends in this allocation: the hot spares standing by end too."""
    start = here.start
    if start.task == 0 and start.standby:
        here.files.write_verdict(RoundVerdict(action, why, [], list(start.standby)))


def restart_in_job(here: Here, rec: Recovery) -> Next:
    """Task 0 after a bad end: restart training in the allocation without the node its blame's
    verdict leaves out (``Recovery.leave_out``: a hot spare in its place; a node blamed but not
    drained, a first signal kill, trains on), or requeue when fewer than ``--nodes`` MIN would
    be left (the requeue excludes only the nodes left out)."""
    start, spec = here.start, here.spec
    left_out = list(rec.leave_out)
    healthy = [h for h in start.hosts if h not in left_out]
    members, standby = refill(healthy, start.standby, start.num_nodes)  # a spare for each
    if not spec.in_job_restarts or len(members) < spec.nodes_min:
        requeue.requeue(here, left_out)
    why = f"{rec.outcome.cause}: {rec.detail}"
    here.files.write_verdict(RoundVerdict(RESTART_IN_JOB, why, members, standby))
    # each node left out goes back to Slurm once its task has ended (a watcher thread)
    tasks = {start.hosts.index(n): n for n in left_out}
    release.start(release.LeftOut(here.files, tasks), log, here.note)
    spare_in = members[len(healthy) :]
    here.note("restarted", why=why, members=members, left_out=left_out, round=start.round + 1,
              **({"spare_in": spare_in, "spares": standby} if start.standby else {}))  # fmt: skip
    log(f"in-job restart on {', '.join(members)} (without {', '.join(left_out) or 'none'}"
        + (f"; hot spare {', '.join(spare_in)} in" if spare_in else "") + ")")  # fmt: skip
    return next_round(here, members, why, standby)


def stand_by(spec: JobSpec, spare: Start, trains: int) -> Next:
    """A hot spare (``--spares``; ``trains``: the nodes that train): idle, reading task 0's word
    after each round, until a round takes it in (its next start, as a member) or the run ends in
    this allocation (its result)."""
    me = spare.hosts[spare.task]
    log(f"hot spare: standing by ({trains} node(s) train)")
    waiting = spare
    while True:
        verdict = wait_until(waiting.files(spec.run_dir).verdict,
                             f"round {waiting.round}'s end", None, SPARE_POLL)  # fmt: skip
        if verdict.action == RESTART_IN_JOB and me in verdict.members:
            log(f"hot spare taken in for round {waiting.round + 1}: {verdict.why}")
            start = waiting.next_round(verdict.members, me, verdict.standby)
            return start, f"{IN_JOB_RESTART} after {verdict.why}"
        if verdict.action == RESTART_IN_JOB:
            waiting = dataclasses.replace(waiting, round=waiting.round + 1)
            continue
        if verdict.action == DONE:
            log(f"hot spare released: {verdict.why}")
            return spare_done(spare)
        if verdict.action == REQUEUE:
            requeue.await_end()  # task 0's requeue ends this task
        raise RuntimeError(f"hot spare: task 0 said {verdict.action} ({verdict.why})")


def spare_done(spare: Start) -> dict[str, Any]:
    """A released spare's result for submitit."""
    return {"node": socket.gethostname(), "restarts": spare.restart, "spare": True}
