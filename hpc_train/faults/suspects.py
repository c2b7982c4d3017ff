"""The node a stop points to, what the blame rests on, and whether that drains it (pure).

Every blame names a ``Suspect``: the node, why, what the blame rests on (``Evidence``), and the
rank where one is known. ``hpc_train.faults.end_evidence`` reads a stop's evidence once; the
policy (``hpc_train.launch.restart_policy``) asks the picks below and decides the blame; the
watchers only report (a hang's node reports, ``watch.hang_monitor``; a straggler,
``watch.straggler_monitor``); the executor (``hpc_train.launch.recovery``) records and drains.

- a hang (``hang_suspect``), among the ranks of all nodes: a node that sent no report, else a
  rank that gave no Python stack when asked (SIGSTOPped, or stuck outside the interpreter),
  else the rank whose heartbeat is oldest (fewest updates, then earliest);
- a crash (``crash_suspect``): a rank whose own error is the machine's, else the one node whose
  torchrun (or the rank it names as the root cause) was killed by a signal we did not send,
  else the one node whose launcher wrote no exit record. None when it is the training code's.

Whether a blame drains (``drain_verdict``): a drained node is out of the run, and on
ParallelCluster clustermgtd terminates it and asks EC2 for another, which for p3dn, p4d and p5
may not come (InsufficientInstanceCapacity). So a node is drained at once only on evidence about
the node itself (``ABOUT_THE_NODE``: a hardware finding, a failed health check, a lost node, a
hang with no Python stack, a measured straggler). Anything else (a rank or torchrun killed by a
signal we did not send, a rank's own error that is no hardware finding, a hang in which every
rank gave its stack) restarts first, on the node, and drains it at its second blame of the same
machine within the quarantine's window, whatever the first one's evidence (``earlier``; a
name's new machine starts at none). A machine blamed twice within ``WINDOW_S`` is quarantined
(``quarantined``; the list in the save dir and what it keeps out: ``faults.quarantine``). The
table, with where each piece of evidence comes from: docs/faults.md, "Bad nodes".

A blame counts against the machine, not the name: each records the node's machine
(``hpc_core.slurm.machine``: its NodeAddr, which ParallelCluster sets to the instance's IP).
Where the cluster replaces drained nodes, two blames of two machines under one name are two
bad days, not one bad machine, and the name's new machine is not held.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from hpc_core import ledger
from hpc_core.ledger import Kind
from hpc_train.contract import Cause
from hpc_train.faults.failures import Failure, NodeExit

WINDOW_S = 24 * 3600.0  # a node blamed twice within a day is not a coincidence
TIMES = 2


class Evidence(StrEnum):
    """What a blame rests on."""

    HARDWARE = "a hardware finding"
    HEALTH_CHECK = "a failed health check"
    LOST = "a lost node"
    HANG_NO_STACK = "a hang with no Python stack"
    STRAGGLER = "a measured straggler"
    SIGNAL = "a kill by a signal"
    OWN_ERROR = "a rank's own error, no hardware finding"
    HANG_WITH_STACKS = "a hang, every rank in Python"
    STORAGE = "a storage error only this node sees"  # the others write: its client (faults.storage)


# evidence about the node itself: drained at once
ABOUT_THE_NODE = frozenset({
    Evidence.HARDWARE, Evidence.HEALTH_CHECK, Evidence.LOST, Evidence.HANG_NO_STACK,
    Evidence.STRAGGLER, Evidence.STORAGE,
})  # fmt: skip


@dataclass(frozen=True)
class DrainVerdict:
    """Drain the node (and keep it out of the restart and the requeue), or restart on it."""

    drain: bool
    why: str


def drain_verdict(evidence: Evidence, earlier: int) -> DrainVerdict:
    """Drain or not, for a blame on ``evidence`` of a machine blamed ``earlier`` times before
    within the quarantine's window (``earlier``)."""
    if evidence in ABOUT_THE_NODE:
        return DrainVerdict(True, f"drained: {evidence} is evidence about the node itself")
    window = f"{WINDOW_S / 3600:.0f} h"
    if earlier > 0:
        return DrainVerdict(
            True, f"drained: {evidence}, and this machine was blamed {earlier}x before in {window}"
        )
    return DrainVerdict(
        False,
        f"not drained: {evidence} is no evidence about the node itself and this machine's first "
        f"blame in {window}: the run restarts on it; a second blame drains it",
    )


def of_hang(stack: bool) -> Evidence:
    """The evidence of a hang's suspect: did its rank give a Python ``stack`` when asked (none
    when its node's launcher sent no report; ``hang_suspect``)?"""
    return Evidence.HANG_WITH_STACKS if stack else Evidence.HANG_NO_STACK


# --- a machine's earlier blames: the ledger's ``blamed`` events ---------------------------------


@dataclass(frozen=True)
class Entry:
    node: str
    reasons: tuple[str, ...]  # why it was blamed, oldest first
    since: float  # the blame that quarantined it (time.time())
    machine: str = ""  # the node's machine then (hpc_core.slurm.machine); "": not known


def machine_of(event: ledger.Event) -> str:
    """The machine a ``blamed`` event recorded ("": not known, a blame of an older version or
    one Slurm could not say the machine of: it counts with the name's other unknown ones)."""
    return str(event.get("machine") or "")


def _blames(events: Sequence[ledger.Event]) -> dict[tuple[str, str], list[ledger.Event]]:
    """The ``blamed`` events by (node, machine), in the ledger's order."""
    blames: dict[tuple[str, str], list[ledger.Event]] = {}
    for event in events:
        if event.kind == Kind.BLAMED and event.get("node"):
            blames.setdefault((event.get("node"), machine_of(event)), []).append(event)
    return blames


def earlier(
    events: Sequence[ledger.Event], node: str, machine: str, now: float, window_s: float = WINDOW_S
) -> int:
    """How often ``node`` on ``machine`` was blamed within ``window_s`` before ``now``: counted
    as ``quarantined`` counts (a name's other machine is another; "" with the name's other unknown
    ones), so the blame that finds one earlier is the one that quarantines it."""
    found = _blames(events).get((node, machine), [])
    return sum(1 for e in found if now - window_s <= e.time <= now)


def quarantined(events: Sequence[ledger.Event], window_s: float = WINDOW_S) -> list[Entry]:
    """The quarantined machines: blamed ``TIMES`` times within ``window_s``."""
    blames = _blames(events)
    out = []
    for (node, machine), found in blames.items():
        for i in range(TIMES - 1, len(found)):
            if found[i].time - found[i - TIMES + 1].time <= window_s:
                reasons = tuple(str(e.get("why", "")) for e in found)
                out.append(Entry(node, reasons, found[i].time, machine))
                break
    return sorted(out, key=lambda e: (e.node, e.since))


def holds(entries: Sequence[Entry], node: str, machine: str | None) -> bool:
    """Is ``node`` on ``machine`` (None: not known) quarantined by ``entries``? An entry of an
    unknown machine holds the name; a machine not known now is held."""
    return any(
        e.node == node and (not e.machine or machine is None or e.machine == machine)
        for e in entries
    )


# --- who a stop points to ------------------------------------------------------------------------


class Suspect(NamedTuple):
    """The node a stop is blamed on, why, what the blame rests on, and its rank if known."""

    node: str
    why: str
    evidence: Evidence
    rank: int | None = None


@dataclass(frozen=True)
class RankReport:
    """What a node's launcher saw of one of its ranks when the hang was declared (its hang
    report: ``watch.hang_monitor`` writes it, ``faults.end_evidence`` reads it)."""

    rank: int
    node: str
    update: int
    time: float
    stack: bool  # it wrote its Python stacks when asked


def hang_suspect(
    ranks: Sequence[RankReport], reported: Sequence[str], nodes: Sequence[str]
) -> Suspect | None:
    """The node to blame for a hang (see the module docstring); None when nothing is known.

    ``reported``: the nodes whose launcher sent a report; ``nodes``: every node known to run
    ranks (from the heartbeats).
    """
    silent = [n for n in nodes if n not in reported]
    if silent:
        why = f"node {silent[0]} sent no report (its launcher is gone)"
        return Suspect(silent[0], why, of_hang(stack=False))
    oldest = sorted(ranks, key=lambda r: (r.update, r.time, r.rank))
    for r in oldest:
        if not r.stack:
            why = (
                f"rank {r.rank} on {r.node} gave no Python stack (stopped, or stuck outside Python)"
            )
            return Suspect(r.node, why, of_hang(stack=False), r.rank)
    if oldest:
        r = oldest[0]
        why = f"rank {r.rank} on {r.node} has the oldest heartbeat"
        return Suspect(r.node, why, of_hang(stack=True), r.rank)
    return None


def code_at_fault(failures: Sequence[Failure]) -> bool:
    """Does a report say the training code failed (a user error, a storage fault: not the
    infrastructure)? Then no node is to blame for the crash, whatever else the evidence says."""
    return any(f.cause != Cause.INFRASTRUCTURE for f in failures)


def crash_suspect(
    failures: Sequence[Failure],
    exits: Sequence[NodeExit],
    hosts: Sequence[str],
    rank_nodes: Mapping[int, str],
) -> Suspect | None:
    """The node to blame for a crash, why, and on what evidence; None when it is the training
    code's (a user error is no node's fault) or no one node stands out.

    In order: a rank whose own error is the machine's (a hardware finding: ECC, NVLink, Xid,
    NVML; else a CUDA or NCCL error, not a lost peer; ``rank_nodes`` from the heartbeats says
    where it ran); the one node whose torchrun, or the rank its torchrun names as the root cause,
    was killed by a signal we did not send (the OOM killer, ``kill -9``); the one node whose
    launcher wrote no exit record (it is gone: lost).
    """
    if code_at_fault(failures):
        return None
    own = sorted((f for f in failures if not f.witness), key=lambda f: (f.update, f.rank))
    for f in own:
        if f.rank in rank_nodes:
            found = Evidence.HARDWARE if f.hardware else Evidence.OWN_ERROR
            return Suspect(rank_nodes[f.rank], f"rank {f.rank} failed: {f.describe()}", found)
    killed = [(e.node, why) for e in exits if (why := e.killed()) is not None]
    if len(killed) == 1:
        return Suspect(*killed[0], Evidence.SIGNAL)
    silent = [h for h in hosts if h not in {e.node for e in exits}]
    if not killed and len(silent) == 1:
        why = "its launcher wrote no exit record (the node or its task is gone)"
        return Suspect(silent[0], why, Evidence.LOST)
    return None


@dataclass(frozen=True)
class Blame:
    """A node blamed, as the policy decided it (``launch.restart_policy``): why (the ledger's),
    what it rests on, the verdict on that (drain, or restart on it), the node's machine then
    (Slurm's word: the blame counts against it), the cause of the stop it is blamed for, and the
    rank where the stop named one (``ranked``: a crash's or a hang's suspect, rank or None)."""

    node: str
    why: str
    evidence: Evidence
    verdict: DrainVerdict
    machine: str
    cause: Cause
    rank: int | None = None
    ranked: bool = False

    @property
    def leaves(self) -> bool:
        """Its verdict leaves the node out of what follows (the restart, the requeued job)."""
        return self.verdict.drain

    def event(self, job: str, restart: int, when: float) -> ledger.Event:
        """This blame as the ledger's ``blamed`` event it becomes (what the quarantine counts)."""
        return ledger.Event(Kind.BLAMED, when, job, restart,
                            {"node": self.node, "why": self.why, "machine": self.machine})  # fmt: skip
