"""Nodes blamed twice within a window stay out of the run.

One blame (a hang's suspect, a node short of GPUs, a crashed rank's node) drains the node with
a reason (unless ``--no-drain``) and excludes it from the requeued job; an administrator may
resume it after a look. A node blamed twice within ``WINDOW_S`` is quarantined: it is listed in
``<save-dir>/.hpc-train/quarantine.json`` with the reasons, its drain reason says so, the next
``submit`` of this save dir excludes it (``sbatch --exclude``) and a start that lands on it
anyway (an administrator's resume, a plain requeue) is refused and requeued without it.
The ledger's ``blamed`` events are the record; the list is derived from them, never edited.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from hpc_core import ledger
from hpc_core.rundir import RunDir, atomic_write

WINDOW_S = 24 * 3600.0  # a node blamed twice within a day is not a coincidence
TIMES = 2


@dataclass(frozen=True)
class Entry:
    node: str
    reasons: tuple[str, ...]  # why it was blamed, oldest first
    since: float  # the blame that quarantined it (time.time())


def decide(events: Sequence[ledger.Event], window_s: float = WINDOW_S) -> list[Entry]:
    """The quarantined nodes: blamed ``TIMES`` times within ``window_s`` (pure)."""
    blames: dict[str, list[ledger.Event]] = {}
    for event in events:
        if event.kind == "blamed" and event.get("node"):
            blames.setdefault(event.get("node"), []).append(event)
    out = []
    for node, found in blames.items():
        for i in range(TIMES - 1, len(found)):
            if found[i].time - found[i - TIMES + 1].time <= window_s:
                reasons = tuple(str(e.get("why", "")) for e in found)
                out.append(Entry(node, reasons, found[i].time))
                break
    return sorted(out, key=lambda e: e.node)


def update(run: RunDir, also: Sequence[ledger.Event] = ()) -> list[Entry]:
    """Rewrite the save dir's list from the ledger (and ``also``: a blame about to be
    recorded); the quarantined nodes."""
    entries = decide([*ledger.read(run.ledger), *also])
    listed = [{"node": e.node, "since": e.since, "reasons": list(e.reasons)} for e in entries]
    atomic_write(run.quarantine, json.dumps(listed, indent=1) + "\n")
    return entries


def nodes(run: RunDir) -> list[str]:
    """The quarantined nodes this save dir lists (none if there is no list, or it is unreadable)."""
    try:
        listed = json.loads(run.quarantine.read_text())
        return sorted({str(e["node"]) for e in listed})
    except (OSError, ValueError, TypeError, KeyError):
        return []


def drain_reason(node: str, why: str, entries: Sequence[Entry]) -> str:
    """Slurm's drain reason for a node blamed now (at most 200 characters)."""
    if any(e.node == node for e in entries):
        return f"hpc-train: quarantined, blamed {TIMES}x within {WINDOW_S / 3600:.0f} h: {why}"[
            :200
        ]
    return f"hpc-train: {why}"[:200]
