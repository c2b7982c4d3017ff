"""On every node, while torchrun runs: watch this node's ranks, and act on a hang.

``Monitor`` is a thread beside the launcher's ``Popen.wait()`` (signal handlers stay on the main
thread). Every ``POLL_S`` it reads this node's heartbeats and asks ``hpc_train.watchdog``. On a
hang, seen here or declared by another node (``hang.json`` in the incident dir):

1. evidence: SIGUSR1 to each rank (faulthandler writes its Python stacks, even from inside a
   collective; a stopped rank writes nothing), copied to
   ``<save-dir>/.hpc-train/incidents/<job>-<restart>/stacks-rank<r>.txt``, and this node's report
   ``node-<node>.json`` (each rank's last update, heartbeat time, whether it gave a stack);
2. it waits (at most ``REPORT_WAIT_S``) for every node's report, so no node stops its ranks
   before the others have dumped theirs;
3. it kills this node's ranks and torchrun: the launcher then sees the hang
   (``restarts.after_exit(hang=…)``), and task 0 calls ``blame``: the suspect
   (``watchdog.suspect``) is written to ``suspect.json`` and drained unless ``--no-drain``; the
   launcher requeues and excludes it. Lost work: the updates since the last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpc_core import slurm  # SlurmError only: the launcher passes its drain
from hpc_core.rundir import (
    HANG_DECLARED,
    SUSPECT,
    RunDir,
    atomic_write,
    incident_report,
    incident_reports,
    incident_stacks,
    stacks_file,
)
from hpc_core.wait import FAST, Backoff, wait_until
from hpc_train import watchdog
from hpc_train.heartbeat import STACKS_SIGNAL, read_beats
from hpc_train.watchdog import Beat, RankReport, Suspect

POLL_S = 2.0  # how often each launcher reads its ranks' heartbeats
STACK_WAIT_S = 5.0  # for the ranks' faulthandler output after SIGUSR1
REPORT_WAIT_S = 20.0  # for the other nodes' reports
KILL_WAIT_S = 15.0  # for torchrun's exit after SIGTERM, before SIGKILL


def declared(incident: Path) -> str | None:
    """Why a hang was declared in this start (by any node), or None."""
    path = incident / HANG_DECLARED
    try:
        return str(json.loads(path.read_text())["why"])
    except (OSError, ValueError, KeyError):
        return None


def declare(incident: Path, node: str, why: str) -> None:
    if declared(incident) is None:  # two nodes at once: either record will do
        atomic_write(
            incident / HANG_DECLARED, json.dumps({"node": node, "why": why, "time": time.time()})
        )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def dump_stacks(beats: Sequence[Beat], directory: Path, incident: Path) -> dict[int, bool]:
    """Ask each rank for its Python stacks; copy what they wrote. {rank: gave a stack}."""
    before = {b.rank: _size(stacks_file(directory, b.rank)) for b in beats}
    for b in beats:
        with contextlib.suppress(ProcessLookupError):
            os.kill(b.pid, STACKS_SIGNAL)

    def grown() -> dict[int, bool]:
        return {b.rank: _size(stacks_file(directory, b.rank)) > before[b.rank] for b in beats}

    # a stopped rank, or one stuck outside Python, writes nothing: that is evidence too
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: all(grown().values()) or None, "the ranks' stacks", STACK_WAIT_S, FAST)
    gave = grown()
    for b in beats:
        if gave[b.rank]:
            text = stacks_file(directory, b.rank).read_bytes()[before[b.rank] :]
            atomic_write(incident_stacks(incident, b.rank), text)
    return gave


def wait_for_reports(incident: Path, nodes: int, timeout: float) -> int:
    """Wait until ``nodes`` nodes have reported (or ``timeout``); how many did."""
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: len(incident_reports(incident)) >= nodes or None,
            "every node's hang report",
            timeout,
            Backoff(0.2, 1.5, 1.0),
        )
    return len(incident_reports(incident))


class Monitor:
    """Watches this node's ranks while torchrun runs (see the module docstring)."""

    def __init__(
        self,
        run: RunDir,
        job_id: str,
        restart: int,
        node: str,
        ranks: int,
        nodes: int,
        limits: watchdog.Limits,
        torchrun_pid: int,
        exited: Callable[[], bool],
        log: Callable[[str], None],
    ) -> None:
        self.directory = run.heartbeats(job_id, restart, node)
        self.incident = run.incident(job_id, restart)
        self.node, self.ranks, self.nodes, self.limits = node, ranks, nodes, limits
        self.torchrun_pid, self.exited, self.log = torchrun_pid, exited, log
        self.hang: str | None = None
        self._stop = threading.Event()
        self._started = time.time()
        self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def stop(self) -> str | None:
        """torchrun has exited: end the thread; the hang it acted on, or one another node
        declared (this node's ranks may have died of it first)."""
        self._stop.set()
        self._thread.join(timeout=STACK_WAIT_S + REPORT_WAIT_S + 10)
        return self.hang or declared(self.incident)

    def _nap(self, seconds: float) -> None:
        self._stop.wait(seconds)  # torchrun's exit wakes the thread at once

    def _check(self) -> str | bool | None:
        if self._stop.is_set():
            return True
        elsewhere = declared(self.incident)
        if elsewhere is not None:
            return elsewhere
        beats = read_beats(self.directory)
        found = watchdog.assess(beats, self.ranks, self._started, time.time(), self.limits)
        if found is None:
            return None
        declare(self.incident, self.node, found.why)
        return found.why

    def _watch(self) -> None:
        poll = Backoff(POLL_S, 1.0, POLL_S)
        why = wait_until(self._check, "a hang", None, poll, sleep=self._nap)
        if why is True:
            return
        assert isinstance(why, str)
        self.hang = why
        try:
            self.respond(why)
        except Exception as err:  # never leave torchrun running on a hang
            self.log(f"hang: collecting evidence failed ({type(err).__name__}: {err})")
        self.stop_ranks()

    def respond(self, why: str) -> None:
        self.log(f"hang: {why}: saving this node's stacks in {self.incident}")
        beats = read_beats(self.directory)
        gave = dump_stacks(beats, self.directory, self.incident)
        ranks = [
            RankReport(b.rank, b.node, b.update, b.time, gave.get(b.rank, False)) for b in beats
        ]
        report = {
            "node": self.node,
            "why": why,
            "time": time.time(),
            "ranks": [asdict(r) for r in ranks],
        }
        atomic_write(incident_report(self.incident, self.node), json.dumps(report))
        stackless = [r.rank for r in ranks if not r.stack]
        self.log(f"hang: {len(ranks) - len(stackless)} stack(s) saved; no stack from {stackless}")
        got = wait_for_reports(self.incident, self.nodes, REPORT_WAIT_S)
        self.log(f"hang: {got}/{self.nodes} node report(s): stopping this node's ranks")

    def stop_ranks(self) -> None:
        """SIGKILL this node's ranks (a stopped one too), then end torchrun: SIGTERM (it tears
        down what is left), SIGKILL after ``KILL_WAIT_S`` (a stopped or stuck agent)."""
        for b in read_beats(self.directory):
            _kill(b.pid, signal.SIGKILL)
        _kill(self.torchrun_pid, signal.SIGTERM)
        _kill(self.torchrun_pid, signal.SIGCONT)
        try:
            wait_until(lambda: self.exited() or None, "torchrun's exit", KILL_WAIT_S, FAST)
        except TimeoutError:
            self.log(f"hang: torchrun still there {KILL_WAIT_S:.0f} s after SIGTERM: SIGKILL")
            _kill(self.torchrun_pid, signal.SIGKILL)


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _ranks_of(report: dict[str, Any]) -> list[RankReport]:
    return [RankReport(**r) for r in report.get("ranks", [])]


def blame(
    run: RunDir,
    job_id: str,
    restart: int,
    hosts: Sequence[str],
    drain: Callable[[str, str], None] | None,
    log: Callable[[str], None],
) -> Suspect | None:
    """Task 0, after a hang: name the suspect from every node's report, drain it with
    ``drain(node, reason)`` (None: ``--no-drain``) and record both in ``suspect.json``. None
    when no node can be named."""
    incident = run.incident(job_id, restart)
    wait_for_reports(incident, len(hosts), REPORT_WAIT_S)
    reports = []
    for path in incident_reports(incident):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    ranks = [r for report in reports for r in _ranks_of(report)]
    nodes = list(hosts) or sorted({r.node for r in ranks})
    found = watchdog.suspect(ranks, [str(r["node"]) for r in reports], nodes)
    drained = False
    if found is not None and drain is not None:
        reason = f"hpc-train: hang in job {job_id}: {found.why}"
        try:
            drain(found.node, reason)
            drained = True
        except slurm.SlurmError as err:
            log(f"could not drain {found.node}: {err}")
    record = {"suspect": asdict(found) if found else None, "drained": drained, "time": time.time()}
    atomic_write(incident / SUSPECT, json.dumps(record))
    if found is None:
        log("hang: no suspect node (no rank had completed an update)")
    else:
        log(f"hang: suspect {found.node}: {found.why}" + ("; drained" if drained else ""))
    return found
