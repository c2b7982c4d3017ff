"""Why a start crashed, and whether trying again can help.

A worker that dies of a Python exception leaves a report (``RunDir.failure_report``): its rank,
the update it had reached, the exception's type and first line, and a class:

    infrastructure   the collective or the machine failed: NCCL / gloo / c10d errors, a peer
                     that went away, CUDA errors, a timeout in a collective. Retrying elsewhere
                     can help: task 0 requeues (with its restart budget).
    user error       anything else raised by the training code: a bug, a bad config, a NaN loss
                     (fairseq's FloatingPointError), an out-of-memory. A retry can only help if
                     it does not happen again: the same error at the same update in two rounds
                     in a row (in-job rounds or starts; the same kind of message, its numbers
                     aside: ``faults.signatures``) stops the run (no restart, the task fails),
                     with the error in the log and the ledger, instead of spending the restart
                     budget on it.

A rank killed by a signal (the OOM killer, a node failure, a hang's kill) leaves no report: its
start counts as a crash, retried. The rank's side (writing the report, a crash injected by
``chaos JOB crash``) is ``hpc_train.worker.crash``; this module is task 0's reading of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpc_core.rundir import RunDir
from hpc_train.contract import Cause, FailureRecord, StartFiles, write_failure
from hpc_train.faults import signatures

# an infrastructure error that only says a *peer* went away: the reporting rank is a witness
PEER_MARKS = (
    "connection reset", "connection refused", "connection closed", "broken pipe", "timed out",
    "timeout", "peer",
)  # fmt: skip
# an error that is a hardware finding about the rank's own machine (the driver's ECC and NVLink
# errors, an Xid, NVML's "GPU is lost"): evidence against the node (``hpc_train.faults.evidence``).
# A CUDA error without one is not (an illegal address is usually the code's: Xid 13/31), nor
# torch's "NVML_SUCCESS == r INTERNAL ASSERT FAILED" (its allocator's, not the GPU's)
HARDWARE_MARKS = ("ecc error", "nvlink error", "xid", "gpu is lost", "fallen off the bus")
INFRASTRUCTURE_MARKS = (
    "nccl", "gloo", "c10d", "distbackenderror", "distnetworkerror", "cuda error",
    "unknown error", *HARDWARE_MARKS, *PEER_MARKS,
)  # fmt: skip


@dataclass(frozen=True)
class Failure(FailureRecord):
    """A rank's report (``contract.FailureRecord``), classified."""

    @property
    def cause(self) -> Cause:
        return classify(self.type, self.message)

    @property
    def witness(self) -> bool:
        """Does this report only say that a peer went away (not this rank's own failure)?"""
        return _mentions(self.type, self.message, PEER_MARKS)

    @property
    def hardware(self) -> bool:
        """Does this report name a hardware finding about its own machine (ECC, NVLink, Xid,
        a GPU lost to NVML)?"""
        return not self.witness and _mentions(self.type, self.message, HARDWARE_MARKS)

    @property
    def signature(self) -> tuple[str, str, int]:
        """What makes two failures "the same error at the same update": the type, the message
        without its volatile parts (``signatures.kind``: numbers, addresses, temporaries)."""
        return self.type, signatures.kind(self.message), self.update

    def describe(self) -> str:
        return f"{self.type}: {self.message} (rank {self.rank}, update {self.update})"


def _mentions(exc_type: str, message: str, marks: tuple[str, ...]) -> bool:
    text = f"{exc_type} {message}".lower()
    return any(m in text for m in marks)


def classify(exc_type: str, message: str) -> Cause:
    """``Cause.INFRASTRUCTURE`` or ``Cause.USER_ERROR`` (see the module docstring)."""
    if _mentions(exc_type, message, INFRASTRUCTURE_MARKS):
        return Cause.INFRASTRUCTURE
    return Cause.USER_ERROR


def first(failures: Sequence[Failure]) -> Failure | None:
    """The failure that explains a start: a user error before infrastructure ones (a rank that
    raised makes its peers fail in the collective after it), the lowest update, then rank."""
    ranked = sorted(failures, key=lambda f: (f.cause != Cause.USER_ERROR, f.update, f.rank))
    return ranked[0] if ranked else None


def repeated(now: Sequence[Failure], before: Sequence[Failure]) -> Failure | None:
    """The user error of this start if the previous start died of the same one; else None."""
    this, last = first(now), first(before)
    if this is None or last is None or this.cause != Cause.USER_ERROR:
        return None
    return this if this.signature == last.signature else None


def write(run: RunDir, job: str, restart: int, failure: FailureRecord) -> None:
    write_failure(run, job, restart, failure)


def read(files: StartFiles) -> list[Failure]:
    """Every whole report of the start ``files``, classified."""
    out = []
    for fields in files.failure_fields():
        try:
            out.append(Failure(**fields))
        except TypeError:
            continue  # not a report of this schema: no evidence
    return out
