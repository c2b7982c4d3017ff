"""On every node, while torchrun runs: watch this node's ranks, and act on a hang.

``Monitor`` is a thread beside the launcher's ``Popen.wait()`` (signal handlers stay on the main
thread). Every ``POLL_S`` it reads this node's heartbeats and asks ``hpc_train.watch.hangs``, and
every ``DECLARED_POLL_S`` it looks for a hang another node declared. On a hang, seen here or
declared by another node (``hang.json`` in the incident dir):

1. evidence: SIGUSR1 to each rank (faulthandler writes its Python stacks, even from inside a
   collective; a stopped rank writes nothing), copied to
   ``<save-dir>/.hpc-train/incidents/<job>-<restart>/stacks-rank<r>.txt``, and this node's report
   ``node-<node>.json`` (each rank's last update, heartbeat time, whether it gave a stack);
   GPU ranks also get a write on their NCCL flight-recorder FIFO (``flight_recorder_env``):
   their dumps of the last collectives are copied there too (``nccl_trace_rank_<r>``);
2. it waits (at most ``faults.end_evidence.REPORT_WAIT_S``) for every node's report, so no node
   stops its ranks before the others have dumped theirs (a declaration, and the report that
   completes the set, ring the round's other nodes: ``ring``, ``hpc_core.doorbell``; the thread
   naps on the launcher's bell between its ticks and its looks for the reports, so each node
   acts on them at once, the polls the backstop: at 39 hollow nodes the last report came 1.2 s
   after the declaration before, issue 46);
3. it kills this node's ranks and torchrun: the launcher then sees the hang
   (``Ended.hang``). This thread only reports: task 0 reads every node's report with the rest
   of the start's end (``hpc_train.faults.end_evidence``), its policy names the suspect
   (``faults.suspects.hang_suspect``) and the executor writes it to ``suspect.json``, records
   it and drains it unless ``--no-drain``, then restarts without it. Lost work: the updates since the
   last checkpoint.

The agent is watched too: once every rank of this node has exited (a zombie counts: a stopped
torchrun reaps nothing), torchrun must exit within the hang floor (``--hang-timeout-floor``).
If it does not (SIGSTOPped, stuck in its exit barrier on a stopped peer), it is stuck: its
state is logged and it is killed (``stuck``); the launcher then ends the start as the ranks left
it (training finished, or saved on notice) instead of holding the nodes until the time limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpc_core import doorbell, instances
from hpc_core.rundir import (
    HANG_DECLARED,
    atomic_write,
    incident_report,
    incident_reports,
    incident_stacks,
    nccl_pipe,
    nccl_pipe_prefix,
    nccl_trace_prefix,
    nccl_traces,
    stacks_file,
)
from hpc_core.wait import FAST, Backoff, process_exited, process_state, wait_until
from hpc_train.contract import STACKS_SIGNAL, Beat, StartFiles, read_beats
from hpc_train.faults import end_evidence
from hpc_train.faults.suspects import RankReport
from hpc_train.job.limits import HangLimits
from hpc_train.watch import hangs
from hpc_train.watch.watcher import Watcher

POLL_S = 2.0  # how often each launcher reads its ranks' heartbeats
# ... and how often it looks for a hang another node declared (``hang.json`` in the incident dir:
# one open, refused while there is none). Every node stops within this of a declaration: at the
# heartbeats' pace the last of N nodes came up to 2 s late, later the more nodes (the scale
# benchmark's hang at 16 hollow nodes: 2 s of its 6.6 s from the declaration to the stop)
DECLARED_POLL_S = 0.25
STACK_WAIT_S = 5.0  # for the ranks' faulthandler output after SIGUSR1
SETTLE_S = 0.5  # a dump that grew within this long is not complete yet
SETTLE_LOOK_S = 0.1  # ... looked at this often
KILL_WAIT_S = 15.0  # for torchrun's exit after SIGTERM, before SIGKILL
STUCK = "stuck agent"  # _check's answer when torchrun outlived its ranks (not a hang)
FLIGHT_RECORDER_WAIT_S = 20.0  # GPU ranks: their dumps after the pipe write (7.2 s on an H100)


def declaration(incident: Path) -> dict[str, Any] | None:
    """The hang declared in this start (by any node): node, why, time, allowance_s; or None."""
    try:
        record = json.loads((incident / HANG_DECLARED).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "why" in record else None


def declared(incident: Path) -> str | None:
    """Why a hang was declared in this start (by any node), or None."""
    record = declaration(incident)
    return None if record is None else str(record["why"])


def declare(incident: Path, node: str, why: str, allowance_s: float | None = None) -> None:
    """Record the hang (``allowance_s``: the T the watchdog applied) unless one already is."""
    if declared(incident) is None:  # two nodes at once: either record will do
        record = {"node": node, "why": why, "time": time.time(), "allowance_s": allowance_s}
        atomic_write(incident / HANG_DECLARED, json.dumps(record))


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

    # a stopped rank, or one stuck outside Python, writes nothing: that is evidence too. A
    # stopped one (state T: SIGSTOP, a debugger, a frozen cgroup) cannot answer until it is
    # continued, which the watchdog does not do: it is not waited for
    stopped = {b.rank for b in beats if process_state(b.pid) in STOPPED_STATES}
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: all(g or r in stopped for r, g in grown().items()) or None,
                   "the ranks' stacks", STACK_WAIT_S, FAST)  # fmt: skip
    gave = grown()
    _settle([stacks_file(directory, b.rank) for b in beats if gave[b.rank]])
    for b in beats:
        if gave[b.rank]:
            text = stacks_file(directory, b.rank).read_bytes()[before[b.rank] :]
            atomic_write(incident_stacks(incident, b.rank), text)
    return gave


class Quiet:
    """A ``wait_until`` condition: True once ``look()`` has given the same answer for
    ``quiet_s`` of ``clock``'s time (the first look only starts the count)."""

    def __init__(self, look: Callable[[], object], quiet_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.look, self.quiet_s, self.clock = look, quiet_s, clock
        self.seen: object = Quiet  # no look yet: differs from any answer
        self.since = 0.0

    def __call__(self) -> bool | None:
        seen, now = self.look(), self.clock()
        if seen != self.seen:
            self.seen, self.since = seen, now
            return None
        return True if now - self.since >= self.quiet_s else None


def _settle(paths: Sequence[Path]) -> None:
    """Wait until none of ``paths`` has grown for ``SETTLE_S`` (at most ``STACK_WAIT_S``),
    looking every ``SETTLE_LOOK_S``. faulthandler writes a dump line by line: copied as soon as
    its file had grown, a stack was cut after its first line (seen in a hang on the loaded CI
    machine: "Thread 0x... (most recent call first):" and no frame). Looks ``SETTLE_S`` apart
    made a node's wait a multiple of it: one dump still growing at the second look cost a third
    (the scale benchmark's hang, 1.0 s at 16 and 39 hollow nodes against 0.6 s at 2)."""
    if paths:
        with contextlib.suppress(TimeoutError):
            wait_until(Quiet(lambda: [_size(p) for p in paths], SETTLE_S),
                       "the ranks' stacks written whole", STACK_WAIT_S,
                       Backoff(SETTLE_LOOK_S, 1.0, SETTLE_LOOK_S))  # fmt: skip


STOPPED_STATES = ("T", "t")  # /proc/PID/stat: stopped by a signal, or by a tracer


def flight_recorder_env(directory: Path) -> dict[str, str]:
    """GPU ranks' environment for PyTorch's NCCL flight recorder (``instances.flight_recorder_env``),
    dumping into this node's heartbeat ``directory`` (made here: each rank makes its FIFO in it
    at start). The dumps are copied into the incident dir on a hang, so that dir still exists
    only when a hang was declared."""
    directory.mkdir(parents=True, exist_ok=True)
    env = instances.flight_recorder_env(
        str(nccl_trace_prefix(directory)), str(nccl_pipe_prefix(directory))
    )
    return instances.plain(env)


def poke_flight_recorders(directory: Path, ranks: Sequence[int]) -> list[int]:
    """Write to each rank's flight-recorder FIFO: the rank dumps its last collectives within
    about a second. The ranks poked (none on CPU ranks: gloo makes no FIFO; a rank that is gone
    has no reader, and is skipped; a stopped one takes the write and dumps nothing)."""
    poked = []
    for rank in ranks:
        pipe = nccl_pipe(directory, rank)
        if not pipe.is_fifo():
            continue
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no reader
        except OSError:
            continue
        try:
            os.write(fd, b"dump\n")
            poked.append(rank)
        except OSError:
            pass
        finally:
            os.close(fd)
    return poked


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def save_flight_records(
    directory: Path, incident: Path, poked: Sequence[int], since: float, timeout: float
) -> int:
    """Wait (at most ``timeout``) for a dump newer than ``since`` from every poked rank, then
    copy every dump in ``directory`` (an NCCL timeout's too) into the incident dir; how many."""

    def dumped() -> bool | None:
        prefix = nccl_trace_prefix(directory)
        return all(_mtime(Path(f"{prefix}{r}")) >= since for r in poked) or None

    if poked and timeout > 0:
        with contextlib.suppress(TimeoutError):
            wait_until(dumped, "the ranks' flight-recorder dumps", timeout, FAST)
    traces = nccl_traces(directory)
    for path in traces:
        atomic_write(incident / path.name, path.read_bytes())
    return len(traces)


class Monitor(Watcher[str | None]):
    """Watches this node's ranks while torchrun runs (see the module docstring)."""

    first_wait = False  # a hang declared by another node is seen at once

    def __init__(
        self,
        files: StartFiles,
        node: str,
        ranks: int,
        nodes: int,
        limits: HangLimits,
        torchrun_pid: int,
        exited: Callable[[], bool],
        log: Callable[[str], None],
        ring: Callable[[], object] = lambda: None,
    ) -> None:
        super().__init__("hang-watchdog", min(DECLARED_POLL_S, POLL_S))
        self.ring = ring  # the round's other nodes' bells (``Start.ring_round``)
        self.clock: Callable[[], float] = time.monotonic  # when the heartbeats are due again
        self._beats_due = 0.0
        self.directory = files.heartbeats(node)
        self.incident = files.incident
        self.node, self.ranks, self.nodes, self.limits = node, ranks, nodes, limits
        self.torchrun_pid, self.exited, self.log = torchrun_pid, exited, log
        self.hang: str | None = None
        self.stuck: str | None = None  # torchrun outlived its ranks by the allowance: killed
        self._ranks_gone_at: float | None = None
        self._started = time.time()

    def join_s(self) -> float:
        return STACK_WAIT_S + end_evidence.REPORT_WAIT_S + FLIGHT_RECORDER_WAIT_S

    def nap(self, seconds: float) -> None:
        """Between two ticks: on the launcher's bell (a ring of another node's declaration ends
        it), or until ``stop()``, which rings it."""
        if not self.stopping:
            doorbell.nap(seconds, self._stop)

    def stop(self) -> str | None:
        self._stop.set()
        doorbell.wake_here()  # the thread may nap on the bell
        return super().stop()

    def result(self) -> str | None:
        """After ``stop()`` (torchrun has exited): the hang it acted on, or one another node
        declared (this node's ranks may have died of it first)."""
        return self.hang or declared(self.incident)

    def _check(self) -> str | None:
        """Every tick: a hang declared elsewhere; every ``POLL_S``: this node's heartbeats."""
        elsewhere = declared(self.incident)
        if elsewhere is not None:
            return elsewhere
        now = self.clock()
        if now < self._beats_due:
            return None
        self._beats_due = now + POLL_S - self.interval / 2  # a tick a little early still reads
        beats = read_beats(self.directory)
        if self._agent_stuck(beats):
            return STUCK
        found = hangs.assess(beats, self.ranks, self._started, time.time(), self.limits)
        if found is None:
            return None
        declare(self.incident, self.node, found.why, found.allowance_s)
        self.ring()
        return found.why

    def _agent_stuck(self, beats: Sequence[Beat]) -> bool:
        """Have this node's ranks all exited while torchrun stays, past the allowance?"""
        gone = len(beats) >= self.ranks and all(process_exited(b.pid) for b in beats)
        now = time.time()
        if not gone or self.exited():
            self._ranks_gone_at = None
            return False
        self._ranks_gone_at = self._ranks_gone_at or now
        waited = now - self._ranks_gone_at
        if waited < self.limits.floor_s:
            return False
        state = process_state(self.torchrun_pid) or "gone"
        self.stuck = (
            f"torchrun (pid {self.torchrun_pid}, state {state}) still there {waited:.0f} s after "
            f"its ranks exited (allowance {self.limits.floor_s:.0f} s)"
        )
        return True

    def tick(self) -> bool | None:
        why = self._check()
        if why is None:
            return None
        if why == STUCK:  # the agent outlived its ranks: end it, the ranks' work stands
            self.log(f"stuck agent: {self.stuck}: killing it")
            _kill(self.torchrun_pid, signal.SIGKILL)
            _kill(self.torchrun_pid, signal.SIGCONT)
            return True
        self.hang = why
        try:
            self.respond(why)
        except Exception as err:  # never leave torchrun running on a hang
            self.log(f"hang: collecting evidence failed ({type(err).__name__}: {err})")
        self.stop_ranks()
        return True

    def respond(self, why: str) -> None:
        self.log(f"hang: {why}: saving this node's stacks in {self.incident}")
        beats = read_beats(self.directory)
        poked_at = time.time()  # GPU ranks first: their dumps come while the stacks do
        poked = poke_flight_recorders(self.directory, [b.rank for b in beats])
        gave = dump_stacks(beats, self.directory, self.incident)
        left = FLIGHT_RECORDER_WAIT_S - (time.time() - poked_at)
        traces = save_flight_records(self.directory, self.incident, poked, poked_at, left)
        if poked or traces:
            self.log(f"hang: flight recorder poked on ranks {poked}: {traces} dump(s) saved")
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
        if len(incident_reports(self.incident)) >= self.nodes:  # the last: the others wait on it
            self.ring()
        stackless = [r.rank for r in ranks if not r.stack]
        self.log(f"hang: {len(ranks) - len(stackless)} stack(s) saved; no stack from {stackless}")
        got = end_evidence.wait_for_reports(self.incident, self.nodes, end_evidence.REPORT_WAIT_S)
        self.log(f"hang: {got}/{self.nodes} node report(s): stopping this node's ranks")

    def stop_ranks(self) -> None:
        """SIGKILL this node's ranks (a stopped one too), then end torchrun: SIGTERM (it tears
        down what is left), SIGKILL after ``KILL_WAIT_S`` (a stopped or stuck agent). The
        wait for its exit ends at ``stop()``: the launcher stops this thread once torchrun has
        exited, and joins it (its polls, up to a second apart after seconds of teardown, were
        up to a second of every node's end at 39 hollow nodes, issue 46)."""
        for b in read_beats(self.directory):
            _kill(b.pid, signal.SIGKILL)
        _kill(self.torchrun_pid, signal.SIGTERM)
        _kill(self.torchrun_pid, signal.SIGCONT)

        def sleep(seconds: float) -> None:  # interrupted by stop() once: then the polls' pace
            if self.stopping:
                time.sleep(seconds)
            else:
                self._stop.wait(seconds)

        try:
            wait_until(lambda: self.exited() or None, "torchrun's exit", KILL_WAIT_S, FAST,
                       sleep=sleep)  # fmt: skip
        except TimeoutError:
            self.log(f"hang: torchrun still there {KILL_WAIT_S:.0f} s after SIGTERM: SIGKILL")
            _kill(self.torchrun_pid, signal.SIGKILL)


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
