"""Why a start crashed, and whether trying again can help.

A worker that dies of a Python exception leaves a report (``RunDir.failure_report``): its rank,
the update it had reached, the exception's type and first line, and a class:

    infrastructure   the collective or the machine failed: NCCL / gloo / c10d errors, a peer
                     that went away, CUDA errors, a timeout in a collective. Retrying elsewhere
                     can help: task 0 requeues (with its restart budget).
    user error       anything else raised by the training code: a bug, a bad config, a NaN loss
                     (fairseq's FloatingPointError), an out-of-memory. A retry can only help if
                     it does not happen again: the same error at the same update in two starts
                     in a row stops the run (no requeue, the task fails), with the error in the
                     log and the ledger, instead of spending the restart budget on it.

A rank killed by a signal (the OOM killer, a node failure, a hang's kill) leaves no report: its
start counts as a crash, retried. Also here: ``chaos JOB crash --at-update N`` (a crash injected
on purpose, a user error, through a file the workers look for at every update).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hpc_core.rundir import RunDir, atomic_write
from hpc_train.worker import ledger_hooks

# an infrastructure error that only says a *peer* went away: the reporting rank is a witness
PEER_MARKS = (
    "connection reset", "connection refused", "connection closed", "broken pipe", "timed out",
    "timeout", "peer",
)  # fmt: skip
INFRASTRUCTURE_MARKS = (
    "nccl", "gloo", "c10d", "distbackenderror", "distnetworkerror", "cuda error", "ecc error",
    "unknown error", *PEER_MARKS,
)  # fmt: skip
USER_ERROR = "user error"
INFRASTRUCTURE = "infrastructure"


@dataclass(frozen=True)
class Failure:
    rank: int
    update: int  # the last update this rank had reached when it raised
    type: str
    message: str  # the exception's first line

    @property
    def cause(self) -> str:
        return classify(self.type, self.message)

    @property
    def witness(self) -> bool:
        """Does this report only say that a peer went away (not this rank's own failure)?"""
        return _mentions(self.type, self.message, PEER_MARKS)

    @property
    def signature(self) -> tuple[str, str, int]:
        """What makes two failures "the same error at the same update"."""
        return self.type, self.message, self.update

    def describe(self) -> str:
        return f"{self.type}: {self.message} (rank {self.rank}, update {self.update})"


def _mentions(exc_type: str, message: str, marks: tuple[str, ...]) -> bool:
    text = f"{exc_type} {message}".lower()
    return any(m in text for m in marks)


def classify(exc_type: str, message: str) -> str:
    return INFRASTRUCTURE if _mentions(exc_type, message, INFRASTRUCTURE_MARKS) else USER_ERROR


def first(failures: Sequence[Failure]) -> Failure | None:
    """The failure that explains a start: a user error before infrastructure ones (a rank that
    raised makes its peers fail in the collective after it), the lowest update, then rank."""
    ranked = sorted(failures, key=lambda f: (f.cause != USER_ERROR, f.update, f.rank))
    return ranked[0] if ranked else None


def repeated(now: Sequence[Failure], before: Sequence[Failure]) -> Failure | None:
    """The user error of this start if the previous start died of the same one; else None."""
    this, last = first(now), first(before)
    if this is None or last is None or this.cause != USER_ERROR:
        return None
    return this if this.signature == last.signature else None


def write(run: RunDir, job: str, restart: int, failure: Failure) -> None:
    atomic_write(run.failure_report(job, restart, failure.rank), json.dumps(asdict(failure)))


def read(run: RunDir, job: str, restart: int) -> list[Failure]:
    out = []
    for path in run.failure_reports(job, restart):
        try:
            out.append(Failure(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # a report cut short is no evidence
    return out


def from_exception(err: BaseException, rank: int, update: int) -> Failure:
    lines = str(err).strip().splitlines()
    return Failure(rank, update, type(err).__name__, lines[0][:300] if lines else "")


def report_crash(run: RunDir, env: Mapping[str, str], err: BaseException, update: int) -> None:
    """The worker's last act before an exception ends it (outside a launcher: nothing)."""
    start = ledger_hooks.start_of(env)
    if start is None or isinstance(err, KeyboardInterrupt | SystemExit):
        return
    rank = int(env.get("RANK", "0"))
    with contextlib.suppress(OSError):  # the exception itself still reaches the log
        write(run, *start, from_exception(err, rank, update))


class InjectedCrash(RuntimeError):
    """``chaos JOB crash``: raised on purpose by a worker (a user error by class)."""


def inject(run: RunDir, update: int, rank: int) -> None:
    """Ask every run of this save dir to raise in ``rank`` when it reaches ``update``."""
    atomic_write(run.chaos_crash, json.dumps({"update": update, "rank": rank}))


def crash_if_asked(run: RunDir, update: int, rank: int) -> None:
    """Called at every update: one stat() unless a crash was injected (then one read)."""
    path = run.chaos_crash
    if not path.exists():
        return
    try:
        asked: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if asked.get("update") == update and asked.get("rank", 0) == rank:
        raise InjectedCrash(f"chaos: crash injected at update {update} on rank {rank}")


def install(run: RunDir, env: Mapping[str, str], progress: dict[str, int]) -> None:
    """Track the update this rank reached (``progress["update"]``, for its crash report) and
    raise an injected crash when asked, from fairseq's per-update step."""
    import fairseq_cli.train as fairseq_train

    step = fairseq_train.validate_and_save
    rank = int(env.get("RANK", "0"))

    def validate_and_save(cfg: Any, trainer: Any, *args: Any, **kwargs: Any) -> Any:
        progress["update"] = trainer.get_num_updates()
        crash_if_asked(run, progress["update"], rank)
        return step(cfg, trainer, *args, **kwargs)

    fairseq_train.validate_and_save = validate_and_save
