"""Machines blamed twice within a window stay out of the run: the list in the save dir, what it
holds now, and a drained node's reason. The rules (what drains, what a machine's earlier blames
count, what is quarantined) are pure and live with the suspects (``hpc_train.faults.suspects``).

A blame on evidence about the node itself (a hang's suspect with no stack, a node short of GPUs,
a rank's hardware error: ``faults.suspects.drain_verdict``) drains the node with a reason (unless
``--no-drain``) and excludes it from the requeued job; an administrator may resume it after a
look. A blame on weaker evidence (a kill by a signal) is recorded and drains at the machine's
second (``suspects.earlier``). A machine blamed twice within ``WINDOW_S`` is quarantined: it is listed
in ``<save-dir>/.hpc-train/quarantine.json`` with the reasons, its drain reason says so, the
next ``submit`` of this save dir excludes its node (``sbatch --exclude``) and a start that lands
on it anyway (an administrator's resume, a plain requeue) is refused and requeued without it.

A blame counts against the machine, not the name: each records the node's machine
(``hpc_core.slurm.machine``: its NodeAddr, which ParallelCluster sets to the instance's IP).
Where the cluster replaces drained nodes, two blames of two machines under one name are two
bad days, not one bad machine, and the name's new machine is not held: a start on it runs.
The ledger's ``blamed`` events are the record; the list is derived from them, never edited.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir, atomic_write
from hpc_train.faults.suspects import TIMES, WINDOW_S, Entry, holds, quarantined


def update(run: RunDir, events: Sequence[ledger.Event] | None = None) -> list[Entry]:
    """Rewrite the save dir's list from the ledger's ``events`` (read here if None; the
    executor passes the ones it read, and the blames about to be recorded); the quarantined
    nodes."""
    entries = quarantined(ledger.read(run.ledger) if events is None else events)
    listed = [
        {"node": e.node, "machine": e.machine, "since": e.since, "reasons": list(e.reasons)}
        for e in entries
    ]
    atomic_write(run.quarantine, json.dumps(listed, indent=1) + "\n")
    return entries


def nodes(run: RunDir, machine_now: Callable[[str], str] | None = None) -> list[str]:
    """The nodes this save dir's list holds: each still on the machine it quarantined (asked of
    Slurm, ``slurm.node_machine`` unless ``machine_now``; one it cannot tell is held). None if
    there is no list, or it is unreadable."""
    ask = machine_now or slurm.node_machine
    try:
        listed = json.loads(run.quarantine.read_text())
        entries = [
            Entry(str(e["node"]), tuple(e["reasons"]), float(e["since"]), str(e.get("machine", "")))
            for e in listed
        ]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []

    def now(node: str) -> str | None:
        if all(not e.machine for e in entries if e.node == node):
            return None  # held by name: no need to ask
        try:
            return ask(node)
        except slurm.SlurmError:
            return None

    return sorted(n for n in {e.node for e in entries} if holds(entries, n, now(n)))


def drain_reason(node: str, why: str, entries: Sequence[Entry], machine: str = "") -> str:
    """Slurm's drain reason for ``node`` on ``machine`` blamed now (at most 200 characters)."""
    if holds(entries, node, machine):
        return f"hpc-train: quarantined, blamed {TIMES}x within {WINDOW_S / 3600:.0f} h: {why}"[
            :200
        ]
    return f"hpc-train: {why}"[:200]
