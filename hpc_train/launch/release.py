"""Task 0, after an in-job restart: release the nodes it left out to Slurm (a watcher thread).

A node left out of an in-job restart (blamed: drained, unless ``--no-drain``) would stay in the
job's allocation, idle and billed, until the job ends: on ParallelCluster clustermgtd replaces
only a drained node that holds no job, so its replacement would come only after the job's next
requeue, and that requeue would start without it. Once the node's task has ended (its
launcher's last beat for the round says ``ENDED``), task 0 shrinks the job without it
(``hpc_core.slurm.release``): the drained node holds no job, is replaced, and the next start of
the job finds it. A task still running when the node is released would be killed, and the
step's ``srun`` would exit 137 at the end (the job FAILED after training finished): so a node
whose task never says it ended is not released, and the batch host never is.

A node lost whole (NODE_FAIL) needs none of this: the job runs ``--no-kill``, and Slurm has
already taken the node out of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hpc_core import slurm
from hpc_core.ledger import Kind
from hpc_core.wait import Backoff, wait_until
from hpc_train.contract import ENDED, StartFiles
from hpc_train.watch.watcher import Watcher

ENDED_WAIT_S = 120.0  # for a left-out launcher's last beat: it only has to read task 0's word
EXIT_GRACE_S = 10.0  # from that beat to its process's exit (submitit writes its result)
POLL = Backoff(1.0, 1.5, 5.0)
WATCHER = "release-left-out"  # the watcher thread's name (``Release``)


def task_ended(files: StartFiles, task: int) -> bool:
    beat = files.launcher_beat(task)
    return beat is not None and beat.phase == ENDED


def gone(files: StartFiles, task: int, node: str) -> bool:
    """Has the left-out node's task ended (or Slurm taken the node out of the job already)?"""
    return task_ended(files, task) or not in_job(files.job, node, files.restart)


def in_job(job_id: str, node: str, restart: int) -> bool:
    """Is ``node`` still in the job's running start number ``restart`` (Slurm's Restarts; a
    later start of the job is another allocation)? True when Slurm cannot say: wait on."""
    try:
        info = slurm.job_info(job_id)
        if info is None or info.get("JobState") != "RUNNING":
            return False
        if info.get("Restarts", "0") != str(restart):
            return False
        return node in slurm.hostnames(info.get("NodeList", ""))
    except slurm.SlurmError:
        return True


@dataclass(frozen=True)
class LeftOut:
    """The nodes an in-job restart left out: ``nodes`` (each one's task in the round
    ``files`` -> node; the job is ``files.job``)."""

    files: StartFiles
    nodes: Mapping[int, str]


def release_when_ended(
    left: LeftOut, log: Callable[[str], None], note: Callable[..., Any],
    sleep: Callable[[float], None] = time.sleep, stopping: Callable[[], bool] = lambda: False,
) -> None:  # fmt: skip
    """Release each node left out from the job once its task has ended; say each release (log,
    ledger ``released``) and each node kept. ``sleep`` and ``stopping``: the watcher's
    (``Release``), whose ``stop()`` ends the waits."""
    for task, node in left.nodes.items():
        if stopping():
            return
        _release_once_ended(left, task, node, log, note, sleep, stopping)


def _release_once_ended(
    left: LeftOut, task: int, node: str, log: Callable[[str], None], note: Callable[..., Any],
    sleep: Callable[[float], None], stopping: Callable[[], bool],
) -> None:  # fmt: skip
    files, job_id = left.files, left.files.job

    def ended_or_stopping() -> bool:
        return stopping() or gone(files, task, node)

    try:
        ended = wait_until(ended_or_stopping, f"the end of {node}'s task", ENDED_WAIT_S, POLL,
                           sleep=sleep)  # fmt: skip
    except TimeoutError:
        ended = False
    if stopping():
        return
    if not ended:
        log(f"{node} left out, not released: its task did not end in {ENDED_WAIT_S:.0f} s")
        return
    sleep(EXIT_GRACE_S)
    if stopping() or not in_job(job_id, node, files.restart):
        return  # Slurm took it out, or the job was requeued meanwhile: not this start's
    try:
        released = slurm.release(job_id, node)
    except slurm.SlurmError as err:
        log(f"{node} left out, not released: {err}")
        return
    if released:
        log(f"released {node} from job {job_id}: its replacement can serve the next start")
        note(Kind.RELEASED, node=node)
    else:
        log(f"{node} left out, not released: it runs the job's batch script")


class Release(Watcher[None]):
    """Task 0's thread that gives the left-out nodes back (the restart does not wait for it):
    one look, ``release_when_ended``, whose waits are the watcher's naps (``stop()`` ends them)."""

    first_wait = False  # the look starts at once

    def __init__(self, left: LeftOut, log: Callable[[str], None], note: Callable[..., Any]) -> None:
        super().__init__(WATCHER, POLL.most)
        self.left, self.log, self.note = left, log, note

    def tick(self) -> bool:
        release_when_ended(self.left, self.log, self.note, self.nap, lambda: self.stopping)
        return True

    def result(self) -> None:
        return None


def start(left: LeftOut, log: Callable[[str], None], note: Callable[..., Any]) -> Release | None:
    """A ``Release`` watcher for the nodes ``left`` out, started; None when there are none."""
    if not left.nodes:
        return None
    return Release(left, log, note).start()
