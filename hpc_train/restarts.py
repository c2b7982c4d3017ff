"""What the launcher does when torchrun exits: the restart policy, pure.

``--max-restarts N`` is the number of restarts a run may have in all, whatever caused them
(preemption, node failure, a crash, the time limit): start number N + 1 is the last one. Slurm
counts them (``SLURM_RESTART_COUNT``), so requeues Slurm performs by itself count too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


def restart_allowed(restart: int, max_restarts: int) -> bool:
    """May the run have restart number ``restart`` (1 = the first restart)?"""
    return restart <= max_restarts


class Action(Enum):
    FINISHED = "finished"  # training reached max-update: the task succeeds
    STOPPED = "stopped"  # saved on notice; Slurm or task 0 requeues (this task succeeds)
    CANCELLED = "cancelled"  # the user cancelled the job: never requeued
    REQUEUE = "requeue"  # task 0 asks Slurm to requeue the job
    FAIL = "fail"  # the task fails: no restarts left, or a peer task decides


@dataclass(frozen=True)
class Decision:
    action: Action
    why: str


def after_exit(
    returncode: int,
    saved_on_notice: bool,
    task: int,
    restart: int,
    max_restarts: int,
    cancelled: bool = False,
) -> Decision:
    """The launcher's move once torchrun has exited on one node.

    ``saved_on_notice``: the workers left a stop marker for this start. ``cancelled``: Slurm says
    the job was cancelled (``scancel``): a cancel is final, whatever the exit looked like. Only
    task 0 requeues, so one job is requeued once however many nodes saw the failure.
    """
    if cancelled:
        return Decision(Action.CANCELLED, "the job was cancelled (scancel): not requeued")
    if returncode == 0 and not saved_on_notice:
        return Decision(Action.FINISHED, "training finished")
    why = "stopped on notice" if returncode == 0 else f"torchrun exited with {returncode}"
    if task != 0:
        if saved_on_notice:  # durable; the requeue that follows may kill torchrun here first
            return Decision(Action.STOPPED, f"{why} after the save on notice: task 0 requeues")
        return Decision(Action.FAIL, f"{why}; task 0 decides on a requeue")
    if not restart_allowed(restart + 1, max_restarts):
        return Decision(Action.FAIL, f"{why}; no restarts left (--max-restarts {max_restarts})")
    return Decision(Action.REQUEUE, f"{why}: requeueing (restart {restart + 1}/{max_restarts})")
