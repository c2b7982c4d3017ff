"""The one home for recording a blame: the ledger, the quarantine list, the drain.

Whom a stop blames, on what evidence, and whether that drains the node, is the policy's
(``hpc_train.launch.restart_policy``, with ``faults.suspects``' picks, on the evidence
``faults.end_evidence`` read once); the watchers only report (a hang's node reports,
``hpc_train.watch.hang_monitor``; a straggler, ``hpc_train.watch.straggler_monitor``). The
executor (``hpc_train.launch.recovery``) records each ``suspects.Blame`` through the start's
one ``Blamer`` (``Here.blamer()``: task 0's, or task 1's acting for a stuck task 0):

- the ledger's ``blamed`` event (node, its machine, why, the evidence, the verdict, drained, the
  stop's cause);
- the quarantine list (``hpc_train.faults.quarantine``): a machine blamed twice within a day
  stays out;
- where the verdict drains (evidence about the node itself, or the machine's second blame),
  the drain the executor makes (``scontrol update State=DRAIN Reason="hpc-train: …"``, unless
  ``--no-drain``; a quarantined node's reason says so), and the node is left out: of the
  in-job restart, and of the requeued job by its ``ExcNodeList``. Where it does not (a first
  signal kill, say), the node is blamed, recorded and kept: the run restarts on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpc_core import ledger
from hpc_core.ledger import Kind
from hpc_train.contract import StartFiles
from hpc_train.faults import quarantine
from hpc_train.faults.suspects import Blame, holds

Log = Callable[[str], None]
Note = Callable[..., None]
Drain = Callable[[str, str], bool]  # (node, reason): drained? (the executor's Slurm change)


@dataclass(frozen=True)
class Blamer:
    """Who records blames for one start: task 0 (or task 1 acting for it, with its own
    ``note``), the start's ``files``, ``drain`` (false: --no-drain), the ledger and the log."""

    files: StartFiles
    drain: bool
    note: Note
    log: Log

    def record(self, blame: Blame, events: Sequence[ledger.Event], drain: Drain) -> bool:
        """Record ``blame`` against its machine (``events``: the ledger the decision read, with
        this decision's earlier blames) and update the quarantine list; drain the node
        (``drain``) where its verdict says so, unless --no-drain; the ledger's ``blamed``, the
        log. Whether it was drained."""
        files, node, verdict = self.files, blame.node, blame.verdict
        entries = quarantine.update(
            files.run, [*events, blame.event(files.name, files.restart, time.time())]
        )
        drained = False
        if self.drain and verdict.drain:
            drained = drain(node, quarantine.drain_reason(node, blame.why, entries, blame.machine))
        rank = {"rank": blame.rank} if blame.ranked else {}
        self.note(Kind.BLAMED, node=node, why=blame.why, drained=drained, machine=blame.machine,
                  evidence=str(blame.evidence), verdict=verdict.why, cause=blame.cause,
                  **rank)  # fmt: skip
        kept = "; --no-drain: left out, not drained" if verdict.drain and not self.drain else ""
        held = (
            f" (quarantined: machine {blame.machine or '?'} blamed twice within a day)"
            if holds(entries, node, blame.machine)
            else ""
        )
        self.log(f"blamed {node}: {blame.why}; {verdict.why}{kept}{held}")
        return drained
