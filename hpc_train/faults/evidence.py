"""What a blame rests on, and whether it drains the node (pure).

A drained node is out of the run, and on ParallelCluster clustermgtd terminates it and asks EC2
for another, which for p3dn, p4d and p5 may not come (InsufficientInstanceCapacity). So a node is
drained at once only on evidence about the node itself (``ABOUT_THE_NODE``: a hardware finding, a
failed health check, a lost node, a hang with no Python stack, a measured straggler). Anything
else (a rank or torchrun killed by a signal we did not send, a rank's own error that is no
hardware finding, a hang in which every rank gave its stack) restarts first, on the node, and
drains it at its second blame of the same machine within the quarantine's window, whatever the
first one's evidence (``quarantine.earlier``; a name's new machine starts at none). The table,
with where each piece of evidence comes from: docs/faults.md, "Bad nodes".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hpc_train.faults.quarantine import WINDOW_S


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


# evidence about the node itself: drained at once
ABOUT_THE_NODE = frozenset({
    Evidence.HARDWARE, Evidence.HEALTH_CHECK, Evidence.LOST, Evidence.HANG_NO_STACK,
    Evidence.STRAGGLER,
})  # fmt: skip


@dataclass(frozen=True)
class DrainVerdict:
    """Drain the node (and keep it out of the restart and the requeue), or restart on it."""

    drain: bool
    why: str


def drain_verdict(evidence: Evidence, earlier: int) -> DrainVerdict:
    """Drain or not, for a blame on ``evidence`` of a machine blamed ``earlier`` times before
    within the quarantine's window (``quarantine.earlier``)."""
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
    when its node's launcher sent no report; ``suspects.hang_suspect``)?"""
    return Evidence.HANG_WITH_STACKS if stack else Evidence.HANG_NO_STACK
