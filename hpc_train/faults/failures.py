"""Why a start crashed, and whether trying again can help: each rank's report and each node's
exit record, read by task 0 (``hpc_train.faults.end_evidence``) and weighed here (pure).

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
start counts as a crash, retried. Only its torchrun agent saw it die: each node's launcher
writes the agent's exit status and the rank it names as the root cause (``NodeExit``, from
``faults.agent_exit.Tee``), and a rank or an agent killed by a signal we did not send points to
its node (``NodeExit.killed``). The rank's side (writing the report, a crash injected by ``chaos
JOB crash``) is ``hpc_train.worker.crash``; ``explain`` says what a start's reports come to.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpc_core.rundir import RunDir, atomic_write
from hpc_train.contract import Cause, FailureRecord, StartFiles, write_failure
from hpc_train.faults import signatures, storage

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


CORRUPT_CHECKPOINT = "CorruptCheckpoint"  # hpc_core.integrity's: a checkpoint set aside as loaded


def classify(exc_type: str, message: str) -> Cause:
    """``Cause.INFRASTRUCTURE`` or ``Cause.USER_ERROR`` (see the module docstring); a checkpoint
    that failed verification as the rank loaded it (set aside already): ``Cause.CHECKPOINT``,
    restarted from the newest good one, no blame, never "the same error again"."""
    if exc_type == CORRUPT_CHECKPOINT:
        return Cause.CHECKPOINT
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


def explain(
    now: Sequence[Failure], before: Sequence[Failure]
) -> tuple[tuple[Cause, str] | None, bool]:
    """(class, description) of the exception that ended a round's workers (``now``: its
    reports), if any said, and whether the round just before it (``before``: its reports; this
    start's last round, else the last round of the Slurm start before, ``StartFiles.round_before``)
    died of the same user error at the same update: the same bad input in in-job rounds 0 and 1
    of one start is the same failure again, as it is across a requeue (pure)."""
    cause = first(now)
    if cause is None:
        return None, False
    again = repeated(now, before) is not None
    if all(f.witness for f in now):  # only peers saw a rank go away: the peers' symptom
        return (Cause.CRASH, f"a rank died without a word; its peers saw {cause.describe()}"), False
    return (cause.cause, cause.describe()), again


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


# --- each node's exit record: how its torchrun ended ---------------------------------------------

# signals a rank or an agent receives from its own side: the agent stopping its other ranks, Slurm
# ending the step (a requeue, a cancel), a user's Ctrl-C. Not evidence against the node.
STOPPED_BY_US = frozenset({-signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP})
# a rank that dies of SIGABRT raised it itself (C++'s terminate: gloo or NCCL aborting on a lost
# peer, seen on the local cluster as the surviving node's root cause): not a kill from outside
SELF_ABORT = -signal.SIGABRT


@dataclass(frozen=True)
class NodeExit:
    """How torchrun ended on one node (its launcher writes it, ``write_exit``; task 0 reads them
    all, ``read_exits``): its exit status and the rank it names as the root cause."""

    task: int
    node: str
    returncode: int  # torchrun's (negative: killed by that signal)
    root_rank: int | None = None  # the rank torchrun names as the root cause
    root_exitcode: int | None = None  # its exit status (negative: killed by that signal)
    # its ranks' failure reports said on stderr (``agent_exit.Tee.failures``), as dicts
    said: tuple[dict[str, Any], ...] = ()
    probe: dict[str, Any] | None = None  # its probe of the save dir (``storage.Probe``), if any

    def reports(self) -> list[Failure]:
        """The reports its ranks said on stderr, classified."""
        return [Failure(**fields) for fields in self.said]

    def probed(self) -> storage.Probe | None:
        if self.probe is None:
            return None
        return storage.Probe(**{**self.probe, "path": Path(self.probe["path"])})

    def killed(self) -> str | None:
        """Why this node looks at fault: its agent or its root-cause rank died of a signal it
        did not get from us; None otherwise."""
        if self.returncode < 0 and self.returncode not in STOPPED_BY_US:
            return f"torchrun on {self.node} was killed ({_signal_name(self.returncode)})"
        code = self.root_exitcode
        if code is not None and code < 0 and code not in STOPPED_BY_US and code != SELF_ABORT:
            return f"rank {self.root_rank} on {self.node} was killed ({_signal_name(code)})"
        return None


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def write_exit(files: StartFiles, record: NodeExit) -> None:
    """The exit record, for task 0; one the save dir refuses (full, read-only) is said on stderr
    (task 0 then has its own node's evidence and probe: ``end_evidence.at_exit``)."""
    try:
        atomic_write(files.node_exit(record.task), json.dumps(asdict(record), default=str))
    except OSError as err:
        print(f"hpc-train: exit record not written ({err}): {asdict(record)}", file=sys.stderr)


def read_exit(path_text: str) -> NodeExit | None:
    """One exit record from its file's text; None when it is not one (pure)."""
    try:
        record = NodeExit(**json.loads(path_text))
        return dataclasses.replace(record, said=tuple(record.said))
    except (ValueError, TypeError):
        return None


def read_exits(files: StartFiles, tasks: int) -> dict[int, NodeExit]:
    """The exit records written so far for the start ``files``, by task (each file read once)."""
    return read_exits_of(files, range(tasks))


def read_exits_of(files: StartFiles, tasks: Iterable[int]) -> dict[int, NodeExit]:
    """``read_exits`` for the records of ``tasks`` only."""
    found = {}
    for task in tasks:
        try:
            record = read_exit(files.node_exit(task).read_text())
        except OSError:
            continue
        if record is not None:
            found[task] = record
    return found
