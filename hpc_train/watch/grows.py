"""When a run on fewer than its ``--nodes MAX`` may grow, pure: the nodes it could add, and
whether they have been free long enough.

A run started on what was free (``--nodes MIN-MAX``) grows back when nodes of its partition sit
idle (not drained, down or excluded, and not its own) for the settle window (``--grow-after``):
task 0's ``grow_monitor`` then asks Slurm whether a job of that many nodes would start now
(``sbatch --test-only``) and only then saves on notice and requeues, so a running allocation is
never traded for a guess. At most one grow per settle window, none in the last minutes before
the time limit.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from hpc_core.slurm import node_usable

END_MARGIN_S = 300.0  # no grow this close to the time limit: the save and restart would not pay


def idle_candidates(
    states: Mapping[str, str], mine: Collection[str], excluded: Collection[str]
) -> list[str]:
    """Idle nodes of the partition (``slurm.partition_nodes``) the run may take: usable, not
    its own, not excluded or quarantined. ``idle~`` (a powered-down cloud node) counts."""
    return sorted(
        n
        for n, s in states.items()
        if s.lower().startswith("idle") and node_usable(s) and n not in mine and n not in excluded
    )


@dataclass
class Settle:
    """How long candidates have been idle, across polls (the monitor keeps one)."""

    settle_s: float
    since: float | None = None

    def ready(self, candidates: Collection[str], now: float) -> bool:
        """Have candidates been idle without a break for the settle window?"""
        if not candidates:
            self.since = None
            return False
        self.since = self.since if self.since is not None else now
        return now - self.since >= self.settle_s


def grow_target(current: int, nodes_max: int, candidates: Collection[str]) -> int:
    """The width to grow to: as many free nodes as fit under MAX."""
    return min(nodes_max, current + len(candidates))


def time_to_grow(end_time: float | None, now: float) -> bool:
    """Not in the last ``END_MARGIN_S`` before the time limit (None: no limit known)."""
    return end_time is None or end_time - now > END_MARGIN_S
