"""One geometry per start, decided by task 0 from what every node reports. Pure.

At each (re)start every node's launcher reports the GPUs it can use (a CUDA that fails to
initialise counts 0). Task 0 decides the ranks per node for everyone: ``--gpus-per-node``,
capped by what the best node has; a node with fewer is refused by name (the start fails, task 0
blames that node, drains it unless ``--no-drain``, requeues and excludes it) instead of every
node silently computing its own world. So is a node whose GPU check before training failed
(``--node-check``: ``NodeReport.health``), on that evidence. No GPU anywhere is the CPU fallback (one gloo rank per
node), as on the local cluster.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from hpc_train.contract import NodeReport


@dataclass(frozen=True)
class Geometry:
    nodes: int
    ranks_per_node: int
    use_gpu: bool
    refused: str = ""  # why this start cannot run (a node has fewer GPUs than decided)
    bad_nodes: tuple[str, ...] = ()


def from_reports(
    gpus_per_node: int, reports: Sequence[NodeReport], quarantined: Collection[str] = ()
) -> Geometry:
    """The world every node of this start uses (see the module docstring); a start on a
    ``quarantined`` node (``hpc_train.faults.quarantine``) is refused first."""
    nodes = len(reports)
    held = [r.node for r in sorted(reports, key=lambda r: r.task) if r.node in quarantined]
    if held:
        why = f"node(s) {', '.join(held)} quarantined (blamed twice within a day)"
        return Geometry(nodes, 1, False, why, tuple(held))
    failed = [r for r in sorted(reports, key=lambda r: r.task) if r.health]
    if failed:
        why = "; ".join(f"{r.node}: {r.health}" for r in failed)
        return Geometry(nodes, 1, False, why, tuple(r.node for r in failed))
    best = max((r.gpus for r in reports), default=0)
    if gpus_per_node <= 0 or best == 0:
        return Geometry(nodes, 1, False)
    ranks = min(gpus_per_node, best)
    short = sorted((r for r in reports if r.gpus < ranks), key=lambda r: r.task)
    if not short:
        return Geometry(nodes, ranks, True)
    names = ", ".join(f"{r.node} ({r.gpus})" for r in short)
    why = f"node(s) {names} see fewer GPUs than the {ranks} per node this start needs"
    return Geometry(nodes, ranks, True, why, tuple(r.node for r in short))
