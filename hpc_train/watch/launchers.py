"""Launchers watched like the ranks: each node's launcher beats, and another launcher listens.

The hang monitor watches a node's ranks and its torchrun agent from inside that node's launcher;
nothing watched the launcher itself. A launcher that stops (SIGSTOP, a freeze, a kernel hang in
its I/O) trains on through its torchrun, but can neither end its part of the job (the job holds
its nodes until the time limit), act on a notice (on task 0: no save is waited for, no requeue)
nor follow task 0's word. So every launcher runs a ``Pulse`` thread for the whole start: it writes
the launcher's ``contract.LauncherBeat`` every ``PULSE_S`` and reads the beats of the launchers it
watches (``watched``): task 0 every other node's, task 1 task 0's, each again only once the beat
last read could pass the allowance by the next poll (``Pulse.due``: O(N) reads per allowance on
task 0, not per poll). A watched launcher silent for
the allowance (``allowance_s``: the hang floor, never under ``MIN_ALLOWANCE_S``) is stuck: the
callback gets its task, node and silence once, and the launcher that saw it requeues the job
without that node (``hpc_train.launch.launcher``). A launcher whose part is over writes ``ENDED``
and is silent by right; one that has not written yet counts from the start. A callback that
fails is said (``log``) and the thread beats on: a pulse that stopped beating would read, to the
launcher watching this one, as this launcher stuck, and its node would be blamed for it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Self

from hpc_train.contract import ENDED, LAUNCHING, LauncherBeat, StartFiles, node_name
from hpc_train.watch.watcher import Watcher

PULSE_S = 5.0  # a launcher beats this often
MIN_ALLOWANCE_S = 30.0  # six beats missed at the least: a busy machine delays a beat, not six


@dataclass(frozen=True)
class Silence:
    """A watched launcher that has not beaten for ``seconds``."""

    task: int
    node: str
    seconds: float
    phase: str  # what it last said it was doing

    def describe(self) -> str:
        return (
            f"the launcher on {self.node} (task {self.task}) is silent for "
            f"{self.seconds:.0f} s (last: {self.phase})"
        )


def watched(task: int, num_nodes: int) -> list[int]:
    """Whose launchers this task watches: task 0 every other node's, task 1 task 0's."""
    if task == 0:
        return list(range(1, num_nodes))
    return [0] if task == 1 else []


def allowance_s(hang_floor_s: float) -> float:
    return max(MIN_ALLOWANCE_S, hang_floor_s)


def silent(
    beats: Mapping[int, LauncherBeat | None],
    hosts: Sequence[str],
    started: float,
    now: float,
    allowance: float,
) -> list[Silence]:
    """The watched launchers (``beats``' keys: task -> its latest beat, None before its first)
    silent for longer than ``allowance``; one that ended its part is never silent."""
    out = []
    for task, beat in sorted(beats.items()):
        if beat is not None and beat.phase == ENDED:
            continue
        last = beat.time if beat is not None else started
        if now - last > allowance:
            node = beat.node if beat else hosts[task] if task < len(hosts) else f"task {task}"
            out.append(Silence(task, node, now - last, beat.phase if beat else "no beat yet"))
    return out


class Pulse(Watcher[Silence | None]):
    """This launcher's beat and its watch over ``watched`` launchers, in one thread."""

    def __init__(
        self,
        files: StartFiles,
        task: int,
        hosts: Sequence[str],
        allowance: float,
        on_silent: Callable[[Silence], None],
        interval: float = PULSE_S,
        clock: Callable[[], float] = time.time,
        watch: bool = True,
        log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
    ) -> None:
        super().__init__("hpc-train-pulse", interval)
        self.files, self.task, self.hosts = files, task, list(hosts)
        self.allowance, self.on_silent, self.clock, self.log = allowance, on_silent, clock, log
        self.failed: str | None = None  # the callback's error, said once (the beat goes on)
        self.phase = LAUNCHING
        self.watching = watched(task, len(self.hosts)) if watch else []  # --no-watchdog: none
        self.started = clock()
        self.said: Silence | None = None  # the silence reported (once)
        self.seen: dict[int, LauncherBeat | None] = {}  # each watched launcher's beat, last read
        self.reads = 0  # the beats read so far (task 0 watches N - 1 launchers)

    def start(self) -> Self:
        self.beat()
        return super().start()

    def beat(self, phase: str | None = None) -> None:
        """Write this launcher's beat now (with ``phase``, from now on)."""
        if phase is not None:
            self.phase = phase
        beat = LauncherBeat(self.task, node_name(), os.getpid(), self.clock(), self.phase)
        with contextlib.suppress(OSError):  # a sign of life: the next one may get through
            self.files.write_launcher_beat(beat)

    def check(self) -> Silence | None:
        """The silent launcher found among the watched ones (told to ``on_silent`` once), or
        None."""
        if self.said is not None or not self.watching:
            return self.said
        now = self.clock()
        for task in self.due(now):
            self.seen[task] = self.files.launcher_beat(task)
            self.reads += 1
        found = silent(self.seen, self.hosts, self.started, now, self.allowance)
        if found:
            self.said = found[0]
            try:
                self.on_silent(found[0])
            except Exception as err:  # the beat must go on: silence here would blame this node
                self.failed = f"{type(err).__name__}: {err}"
                self.log(f"{found[0].describe()}: acting on it failed ({self.failed}); this "
                         f"launcher beats on\n{traceback.format_exc().rstrip()}")  # fmt: skip
        return self.said

    def due(self, now: float) -> list[int]:
        """The watched launchers whose beat is read this poll: those never read, and those whose
        last beat read could be past the allowance by the next poll. A beat read is proof of life
        up to its time, so the others need no read (issue 46: task 0 read N - 1 beats every
        ``PULSE_S``, O(N) on the shared file system; now each about once per allowance less a
        poll), and a silent one is still found at the same poll as by reading every beat. One
        that ended its part (``ENDED``) is never read again."""
        out = []
        for task in self.watching:
            if task not in self.seen:
                out.append(task)
                continue
            beat = self.seen[task]
            if beat is not None and beat.phase == ENDED:
                continue
            last = beat.time if beat is not None else self.started
            if now - last > self.allowance - self.interval:
                out.append(task)
        return out

    def result(self) -> Silence | None:
        return self.said

    def stop(self, phase: str = ENDED) -> Silence | None:
        """End the thread and say ``phase`` (``ENDED``: this launcher's part is over)."""
        said = super().stop()
        self.beat(phase)
        return said

    def tick(self) -> None:
        self.beat()
        self.check()
