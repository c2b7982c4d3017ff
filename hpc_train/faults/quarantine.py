"""Machines blamed twice within a window stay out of the run.

A blame on evidence about the node itself (a hang's suspect with no stack, a node short of GPUs,
a rank's hardware error: ``hpc_train.faults.evidence``) drains the node with a reason (unless
``--no-drain``) and excludes it from the requeued job; an administrator may resume it after a
look. A blame on weaker evidence (a kill by a signal) is recorded and drains at the machine's
second (``earlier``). A machine blamed twice within ``WINDOW_S`` is quarantined: it is listed
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
from dataclasses import dataclass

from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir, atomic_write

WINDOW_S = 24 * 3600.0  # a node blamed twice within a day is not a coincidence
TIMES = 2


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
    ones), so the blame that finds one earlier is the one that quarantines it (pure)."""
    found = _blames(events).get((node, machine), [])
    return sum(1 for e in found if now - window_s <= e.time <= now)


def quarantined(events: Sequence[ledger.Event], window_s: float = WINDOW_S) -> list[Entry]:
    """The quarantined machines: blamed ``TIMES`` times within ``window_s`` (pure)."""
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
    unknown machine holds the name; a machine not known now is held (pure)."""
    return any(
        e.node == node and (not e.machine or machine is None or e.machine == machine)
        for e in entries
    )


def update(run: RunDir, also: Sequence[ledger.Event] = ()) -> list[Entry]:
    """Rewrite the save dir's list from the ledger (and ``also``: a blame about to be
    recorded); the quarantined nodes."""
    entries = quarantined([*ledger.read(run.ledger), *also])
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
