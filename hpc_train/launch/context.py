"""What every part of the launcher asks of one start, computed once: ``Here``; and ``log``.

``Here`` is one node's start (``starts.Start``) with the run's spec, the start's files
(``contract.StartFiles``: the run directory bound to the start's key once, here, and passed on
as a value: no part passes the key apart), the policy's options (``restart_policy.EndOptions``,
derived from the spec once) and task 0's ledger (``Launcher.note``). The parts (``lifecycle``,
``recovery``, ``requeue``, ``rounds``, ``signals``) take it instead of the launcher; ``where``
is the start as its end's evidence names it (``faults.end_evidence.Where``); ``blamer`` is the
executor's one ``hpc_train.faults.node_blame.Blamer``, which records a blame.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpc_core.rundir import RunDir
from hpc_train.contract import RoundVerdict, StartFiles, node_name
from hpc_train.faults import node_blame
from hpc_train.faults.end_evidence import Where
from hpc_train.job.spec import JobSpec
from hpc_train.launch.restart_policy import EndOptions
from hpc_train.launch.starts import Start

LOG_STAMP = "%Y-%m-%dT%H:%M:%SZ"  # a launcher log line's time (UTC), in brackets first


def log(msg: str) -> None:
    stamp = time.strftime(LOG_STAMP, time.gmtime())
    print(f"[{stamp}] hpc-train {socket.gethostname()}: {msg}", flush=True)


@dataclass(frozen=True)
class Here:
    """One node's start, as every part of the launcher sees it."""

    spec: JobSpec
    start: Start
    files: StartFiles  # start.files(run): this start's files, its key bound once
    note: Callable[..., Any]  # task 0's ledger (a no-op on the other tasks)
    deputy_note: Callable[..., Any]  # the ledger from task 1, acting for a stuck task 0
    options: EndOptions  # what the policy reads of the spec (``EndOptions.of(spec)``)

    @classmethod
    def of(
        cls,
        spec: JobSpec,
        start: Start,
        note: Callable[..., Any],
        deputy_note: Callable[..., Any] | None = None,
    ) -> Here:
        files = start.files(spec.run_dir)
        return cls(spec, start, files, note, deputy_note or note, EndOptions.of(spec))

    @property
    def run(self) -> RunDir:
        return self.spec.run_dir

    @property
    def job_id(self) -> str:
        return self.start.job_id

    @property
    def task0(self) -> bool:
        return self.start.task == 0

    def tell(self, verdict: RoundVerdict) -> None:
        """Task 0's word on this round (or task 1's, for a stuck task 0): written for every
        node (``files.write_verdict``), then their bells rung (``Start.ring_others``)."""
        self.files.write_verdict(verdict)
        self.start.ring_others(self.run)

    def blamer(self, deputy: bool = False) -> node_blame.Blamer:
        """Who records this start's blames (``faults.node_blame``): task 0, or task 1 acting
        for a stuck task 0 (``deputy``: its own ledger note)."""
        note = self.deputy_note if deputy else self.note
        return node_blame.Blamer(self.files, self.options.drain, note, log)

    def where(self, spent: int = 0) -> Where:
        """This start as its end's evidence names it (``spent``: the restarts the budget
        counted before it)."""
        start = self.start
        return Where(self.files, start.task, start.hosts, start.num_nodes, start.standby,
                     node_name(), spent)  # fmt: skip

    def done(self, **extra: Any) -> dict[str, Any]:
        """This node's result for submitit: its host and the start's restart count."""
        return {"node": socket.gethostname(), "restarts": self.start.restart, **extra}
