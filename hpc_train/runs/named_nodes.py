"""The nodes a run named, from its ledger: every node it ``blamed`` (a hang's suspect, a crash's
node, a node Slurm lost, a start short of GPUs) and every ``straggler`` it measured, with what
followed (drained, evicted, quarantined). ``status`` and the end-of-run report show them: a run
left alone overnight accounts in the morning for every node it took out (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpc_core import ledger
from hpc_core.ledger import Kind
from hpc_train.contract import Cause
from hpc_train.faults.suspects import Evidence, machine_of, quarantined


@dataclass(frozen=True)
class NodeNote:
    """A node the run named: a ``straggler`` it measured, or a node it ``blamed`` (and maybe
    drained) for a hang, a crash, a node failure, a start short of GPUs or slowness."""

    node: str
    kind: Kind  # STRAGGLER or BLAMED
    why: str
    job: str
    start: int  # 1 for the job's first start
    drained: bool = False
    evicted: bool = False  # a straggler the run then blamed (--evict-stragglers)
    quarantined: bool = False  # blamed twice within a day: kept out of the run

    def describe(self) -> str:
        where = f"(job {self.job}, start #{self.start})"
        if self.kind == Kind.STRAGGLER:
            return f"straggler: {self.node} {self.why} {where}" + (
                "; evicted" if self.evicted else ""
            )
        held = "; quarantined" if self.quarantined else ""
        return f"blamed: {self.node}: {self.why} {where}{'; drained' if self.drained else ''}{held}"

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def node_notes(events: Sequence[ledger.Event]) -> list[NodeNote]:
    """The nodes the ledger names, in its order (pure)."""

    def eviction(e: ledger.Event) -> bool:
        """The blame of a straggler it then evicted: its cause (a line written before blames
        recorded their cause: its evidence, a measured straggler, which only an eviction has)."""
        said = e.get("cause") or (
            Cause.STRAGGLER if e.get("evidence") == Evidence.STRAGGLER else ""
        )
        return e.kind == Kind.BLAMED and said == Cause.STRAGGLER

    evicted = {(e.job, e.restart, e.get("node")) for e in events if eviction(e)}
    held = {(q.node, q.machine) for q in quarantined(events)}
    out = []
    for e in events:
        node = str(e.get("node") or "")
        if e.kind == Kind.STRAGGLER and node:
            why = (
                f"{float(e.get('ratio', 0)):.2f}x the other nodes' median compute "
                f"for {float(e.get('seconds', 0)):.0f} s"
            )
            gone = (e.job, e.restart, node) in evicted
            out.append(NodeNote(node, Kind.STRAGGLER, why, e.job, e.restart + 1, evicted=gone))
        elif e.kind == Kind.BLAMED and node and not eviction(e):
            out.append(
                NodeNote(
                    node, Kind.BLAMED, str(e.get("why", "")), e.job, e.restart + 1,
                    drained=bool(e.get("drained")),
                    quarantined=(node, machine_of(e)) in held,
                )
            )  # fmt: skip
    return out
