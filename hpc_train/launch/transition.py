"""What follows a start's end: one typed value, a ``Transition``.

The policy (``launch.restart_policy.after_end``, pure) weighs a start's evidence
(``faults.end_evidence.EndEvidence``) and answers with one of the cases below; the executor
(``launch.recovery.carry_out``) applies it, the same way on every end path. Every case carries
the blames the policy decided (``faults.suspects.Blame``: recorded and drained through the one
``Blamer``), a hang's named suspect (``HangVerdict``) and the lines to log (``said``).

- ``Finish``: training reached max-update (the ledger's ``finished``; the hot spares leave);
- ``Stop``: the run ends here with a cause: a failure (``fails``: no restart left, the same
  error again, no progress, no nodes for a requeue) or not (a cancel, a task's save on notice);
- ``Hold``: the job is requeued held in Slurm with the reason (``scontrol release`` resumes it),
  never restarted into the same failure (a storage fault: ENOSPC, EDQUOT, EROFS, EIO);
- ``Requeue``: through Slurm, leaving out by name the nodes ``exclude`` names;
- ``InJobRound``: train again in the allocation on ``members``, the hot spares in ``spare_in``;
- ``Follow``: another task (task 0) decides: wait for its word (``contract.RoundVerdict``);
- ``AskSlurm``: the decision waits on Slurm's word: ask ``question`` after ``after_s``, then
  decide again (``recovery.what_follows`` loops);
- ``Ignore``: this launcher's start is no longer the job's: nothing to do;
- ``Proceed``: (the start before's end, weighed at the next start) the start goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from hpc_train.contract import Cause
from hpc_train.faults.end_evidence import Question
from hpc_train.faults.suspects import Blame, Suspect


@dataclass(frozen=True)
class StoppedLine:
    """The ledger's ``stopped`` line for a start's bad or early end (task 0 writes it): its
    cause, why, and what is known (``None``: the field is not written)."""

    cause: Cause
    why: str
    returncode: int | None = None
    error: str | None = None
    saved: bool | None = None
    progress: Mapping[str, float | int] = field(default_factory=dict)  # reached, last_progress

    def data(self) -> dict[str, Any]:
        """The line's fields (``Kind.STOPPED``'s)."""
        known = {"returncode": self.returncode, "error": self.error, "saved": self.saved}
        extra = {k: v for k, v in known.items() if v is not None}
        return {"cause": self.cause, "why": self.why, **extra, **self.progress}


@dataclass(frozen=True)
class HangVerdict:
    """Task 0 named a hang's suspect (None: no node could be named), recorded in the
    incident's ``suspect.json``."""

    incident: Path
    suspect: Suspect | None


@dataclass(frozen=True, kw_only=True)
class Said:
    """What every case carries: the blames decided, a hang's suspect, the lines to log."""

    blames: tuple[Blame, ...] = ()
    hang: HangVerdict | None = None
    said: tuple[str, ...] = ()


@dataclass(frozen=True)
class Finish(Said):
    """Training reached max-update: this task ends well, the hot spares leave."""

    why: str
    progress: Mapping[str, float | int] = field(default_factory=dict)


@dataclass(frozen=True)
class Stop(Said):
    """The run ends here in this allocation, for ``cause``: the task fails (``fails``: it
    raises ``why``) or ends well (``result``: what it adds to its result for submitit)."""

    cause: Cause
    why: str
    fails: bool
    stopped: StoppedLine | None = None  # the ledger's line (task 0)
    blocked: str = ""  # a requeue that could not start: what the ledger's requeue_blocked says
    result: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Hold(Said):
    """Requeue the job held (``scontrol requeuehold``, its comment the reason): it waits for
    ``scontrol release``, instead of restarting into the same failure."""

    cause: Cause
    why: str
    stopped: StoppedLine


class RequeueBy(StrEnum):
    """Who requeues."""

    SCONTROL = "scontrol"  # this task: ``scontrol requeue``, the nodes excluded once pending
    SUBMITIT = "submitit"  # submitit's ``checkpoint()``: this task records it, submitit requeues
    OWN_NOTICE = "own notice"  # task 0 sends itself the notice: the save, then submitit


@dataclass(frozen=True)
class Requeue(Said):
    """Requeue the job through Slurm for ``cause``, leaving out by name the nodes in
    ``exclude``; ``why``: what this task says if Slurm does not end it."""

    cause: Cause
    why: str
    stopped: StoppedLine | None = None
    exclude: tuple[str, ...] = ()
    waiting: str = ""  # the requeued job cannot start yet: the cluster replaces nodes
    by: RequeueBy = RequeueBy.SCONTROL
    save_first: bool = False  # task 1 for a stuck task 0 while training: the save on notice


@dataclass(frozen=True)
class InJobRound(Said):
    """Train again in this allocation on ``members`` (``left_out``: given back to Slurm once
    their task ends; ``spare_in``: the hot spares taken in, ``standby``: those left)."""

    why: str  # the round's verdict and the ledger's ``restarted``: "<cause>: <what ended it>"
    stopped: StoppedLine
    members: tuple[str, ...]
    standby: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()
    spare_in: tuple[str, ...] = ()


@dataclass(frozen=True)
class Follow(Said):
    """Task 0 decides this round's end: wait for its word and follow it."""

    why: str


@dataclass(frozen=True)
class AskSlurm(Said):
    """The decision waits on Slurm's word: ask ``question`` after ``after_s``, decide again."""

    question: Question
    after_s: float = 0.0


@dataclass(frozen=True)
class Ignore(Said):
    """Nothing to do: this launcher's start is no longer the job's (``why``)."""

    why: str


@dataclass(frozen=True)
class Proceed(Said):
    """The start goes on (its blames of the start before recorded); ``why``: how the start
    before ended, as the log and the ledger's ``started`` say it."""

    why: str


Transition = Finish | Stop | Hold | Requeue | InJobRound | Follow | AskSlurm | Ignore | Proceed
