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

A storage failure is the save dir's file system refusing a write: ENOSPC (full), EDQUOT (over a
user, group or project quota: FSx for Lustre has all three), EROFS (read-only), EIO (on FSx for
Lustre, what a client the servers evicted sees, on that node only, until it reconnects). It is
never a user error (the code is fine) and not a node's fault unless only that node sees it. Its
evidence, none of it a file that had to be written to the failed file system: the ranks' reports
(the errno found anywhere in the exception's chain and the file it names; a report said on
stderr because it could not be written, ``agent_exit.Tee.failures``, is the same record) and
each node's ``Probe`` of the save dir (``faults.storage.probe``: its free space and inodes and a
test write), compared with the bytes a checkpoint needs. ``storage_failure`` (None: not one):

- a report whose errno is ENOSPC, EDQUOT or EROFS (unless it names a file outside the save dir),
  or EIO naming a file in the save dir; or a probe that cannot write, or finds less room than a
  checkpoint needs: storage. A rank that left no report at all (its report lost with the file
  system) is no crash when its node's probe fails: storage.
- EIO or EROFS seen on some nodes while the others' probes write and find room: those nodes'
  (``Storage.node_only``: a client evicted, not the file system). ENOSPC and EDQUOT are the file
  system's whatever node saw them: its capacity and its quotas are the same from every node.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpc_core import space
from hpc_core.ledger import Event, Kind
from hpc_core.rundir import RunDir, atomic_write
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
    probe: dict[str, Any] | None = None  # its probe of the save dir (``Probe``), if any

    def reports(self) -> list[Failure]:
        """The reports its ranks said on stderr, classified."""
        return [Failure(**fields) for fields in self.said]

    def probed(self) -> Probe | None:
        if self.probe is None:
            return None
        return Probe(**{**self.probe, "path": Path(self.probe["path"])})

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


# --- the save dir's file system: is a failure storage's, and whose (each node's probe of it:
# ``faults.storage.probe``, on that node) ---------------------------------------------------

STORAGE_ERRNOS = {
    errno.ENOSPC: "full",
    errno.EDQUOT: "over its quota",
    errno.EROFS: "read-only",
    errno.EIO: "failing with I/O errors",
}
CAPACITY = frozenset({errno.ENOSPC, errno.EDQUOT})  # the file system's, from every node alike
QUOTA_UNKNOWN = "quota unknown (no `lfs quota` on this node)"


@dataclass(frozen=True)
class Probe:
    """What one node found at the save dir: its room (None: ``statvfs`` failed) and whether a
    small file could be written there (``errno`` None: it could)."""

    node: str
    path: Path
    free_bytes: int | None
    free_inodes: int | None
    errno: int | None = None
    error: str | None = None
    quota: str = QUOTA_UNKNOWN  # what ``lfs quota`` says of this user here (``storage.quota``)

    def fails(self, needed: int | None) -> bool:
        """Did it fail to write, or find less room than ``needed`` bytes?"""
        if self.errno is not None or self.error is not None or self.free_bytes is None:
            return True
        return needed is not None and self.free_bytes < needed


def checkpoint_bytes(events: Sequence[Event], last: Path) -> int | None:
    """The bytes one checkpoint takes: the ledger's last ``checkpoint`` event's, else ``last``'s
    size (``checkpoint_last.pt``); None when neither says."""
    saves = [e for e in events if e.kind == Kind.CHECKPOINT and e.get("bytes")]
    if saves:
        return int(saves[-1].get("bytes"))
    try:
        return last.stat().st_size if last.is_file() else None
    except OSError:
        return None


@dataclass(frozen=True)
class Storage:
    """A storage failure: what the file system did (``errno``), where, the figures, who saw it;
    ``node_only``: only ``nodes`` see it while the others write fine (those nodes' fault)."""

    errno: int | None  # None: no errno survived; a probe found the file system short or failing
    path: Path
    nodes: tuple[str, ...]
    node_only: bool
    free_bytes: int | None
    needed_bytes: int | None
    quota: str = QUOTA_UNKNOWN

    @property
    def what(self) -> str:
        if self.errno in STORAGE_ERRNOS:
            return f"{STORAGE_ERRNOS[self.errno]} ({errno.errorcode[self.errno]})"
        return "short of room for a checkpoint"

    def line(self) -> str:
        """One line: the path, what it did, the free space, the quota (or that it is unknown),
        the space a checkpoint needs, who saw it."""
        free = (
            "free space unknown"
            if self.free_bytes is None
            else f"{space.size(self.free_bytes)} free"
        )
        need = (
            ""
            if self.needed_bytes is None
            else f", a checkpoint needs {space.size(self.needed_bytes)}"
        )
        whose = f"on {', '.join(self.nodes)} only: that node's, not the file system's" if (
            self.node_only) else f"seen on {', '.join(self.nodes) or 'no node'}"  # fmt: skip
        return f"storage: {self.path} is {self.what}: {free}, {self.quota}{need}; {whose}"


def _in(path: str | None, save_dir: Path) -> bool | None:
    """Is ``path`` in ``save_dir`` (None: no path to tell)?"""
    if not path:
        return None
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(save_dir))


def storage_errno(record: FailureRecord, save_dir: Path) -> int | None:
    """The report's errno when it is the save dir's storage failing (see the module docs)."""
    number, inside = record.errno, _in(record.errno_path, save_dir)
    if number not in STORAGE_ERRNOS or inside is False:
        return None
    return number if number != errno.EIO or inside else None


def storage_failure(
    reports: Sequence[FailureRecord],
    probes: Sequence[Probe],
    save_dir: Path,
    needed: int | None = None,
) -> Storage | None:
    """Is this a storage failure, and whose (see the module docstring)? ``needed``: the bytes a
    checkpoint takes (the last one's, or the preset's estimate)."""
    seen = [(r.node or f"rank {r.rank}", n) for r in reports if (n := storage_errno(r, save_dir))]
    failing = [p for p in probes if p.fails(needed)]
    if not seen and not failing:
        return None
    nodes = tuple(dict.fromkeys([node for node, _ in seen] + [p.node for p in failing]))
    fine = [p for p in probes if not p.fails(needed) and p.node not in nodes]
    number = seen[0][1] if seen else next((p.errno for p in failing if p.errno), None)
    node_only = (
        bool(fine)
        and number not in CAPACITY
        and not any(
            p.free_bytes is not None and needed is not None and p.free_bytes < needed
            for p in failing
        )
    )
    free = [p.free_bytes for p in probes if p.free_bytes is not None]
    said = [p.quota for p in probes if p.quota != QUOTA_UNKNOWN]
    return Storage(number, save_dir, nodes, node_only, min(free) if free else None, needed,
                   said[0] if said else QUOTA_UNKNOWN)  # fmt: skip
