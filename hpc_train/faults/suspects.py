"""The node a stop points to (pure): the one ``Suspect`` type, and who it is after a hang or a crash.

Every blame names a ``Suspect``: the node, why, what the blame rests on (``faults.evidence``),
and the rank where one is known. ``hpc_train.faults.node_blame`` reads the evidence of a stop,
asks the pick below, and blames the suspect; the watchers only report (a hang's node reports,
``watch.hang_monitor``; a straggler, ``watch.straggler_monitor``).

- a hang (``hang_suspect``), among the ranks of all nodes: a node that sent no report, else a
  rank that gave no Python stack when asked (SIGSTOPped, or stuck outside the interpreter),
  else the rank whose heartbeat is oldest (fewest updates, then earliest);
- a crash (``crash_suspect``): a rank whose own error is the machine's, else the one node whose
  torchrun (or the rank it names as the root cause) was killed by a signal we did not send,
  else the one node whose launcher wrote no exit record. None when it is the training code's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from hpc_train.contract import Cause
from hpc_train.faults.agent_exit import NodeExit
from hpc_train.faults.evidence import Evidence, of_hang
from hpc_train.faults.failures import Failure


class Suspect(NamedTuple):
    """The node a stop is blamed on, why, what the blame rests on, and its rank if known."""

    node: str
    why: str
    evidence: Evidence
    rank: int | None = None


@dataclass(frozen=True)
class RankReport:
    """What a node's launcher saw of one of its ranks when the hang was declared (its hang
    report: ``watch.hang_monitor`` writes it, ``node_blame.hang_suspect`` reads it)."""

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
    if any(f.cause != Cause.INFRASTRUCTURE for f in failures):
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
