"""Task 0, while torchrun runs: name a straggler node, and with ``--evict-stragglers`` evict it.

A thread beside task 0's launcher reads the nodes' heartbeats each ``POLL_S`` (each rank's
median compute time per update, ``Beat.compute_s``; a node's is its slowest rank's) and asks
``hpc_train.watch.stragglers`` who has been slow for the whole window. At most
``NODES_PER_POLL`` nodes are read a poll, in turn, the others' last reading kept: a node's
median moves slowly and the window is minutes, while reading every node every poll made task 0's
file operations on the shared file system grow with the node count (64 nodes of 8 ranks: 640
reads every 5 s; ``make bench-scale``). A straggler is logged once
("straggler: node n2 computes an update in ... 1.40x the median ... for 300 s") and recorded in
the ledger (``straggler``: node, ratio, seconds, compute_s, median_s).

``--evict-stragglers`` treats the first one as a bad node at the next checkpoint: this thread
reports it (``evicted``: the suspect, on a measured straggler) and gives this node's ranks the
notice (SIGUSR2). The workers agree on it (all-reduce), all save ``checkpoint_last.pt`` at the
same update and stop. This thread acts no further: once torchrun has exited, task 0's policy
(``launch.restart_policy``) blames the node (a ledger ``blamed``, the quarantine list, drained
with the reason ``hpc-train: straggler in job J: ...`` unless ``--no-drain``) and the executor
(``launch.recovery``) requeues the job itself (not submitit: its requeue ends the launcher at
once) and excludes the node once the job is pending again. With ``--nodes MIN-MAX`` the run
continues without it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hpc_core.ledger import Kind
from hpc_train.contract import StartFiles, node_name, read_beats
from hpc_train.faults.suspects import Evidence, Suspect
from hpc_train.job.limits import StragglerLimits
from hpc_train.watch import stragglers
from hpc_train.watch.watcher import Watcher

POLL_S = 5.0  # how often task 0 reads the nodes' heartbeats ...
NODES_PER_POLL = 16  # ... at most this many nodes a poll, in turn (each every 20 s at 64 nodes)
KEEP_S = 3600.0  # samples kept beyond the window (the streak only needs the window)


class StragglerWatch(Watcher[Suspect | None]):
    """Task 0's straggler thread for one start (see the module docstring)."""

    def __init__(
        self,
        files: StartFiles,
        hosts: Sequence[str],
        limits: StragglerLimits,
        evict: bool,
        note: Callable[..., Any],
        log: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``files``: the start's (its round's heartbeats; the ledger and the blame keep the
        job id, ``files.job``)."""
        super().__init__("stragglers", POLL_S)
        self.files, self.hosts = files, list(hosts)
        self.limits, self.evict = limits, evict
        self.note, self.log, self.clock = note, log, clock
        self.samples: list[stragglers.Sample] = []
        self.named: set[str] = set()
        self.evicted: Suspect | None = None
        self._failed = False  # a check failed: said once (the next ones may fail the same way)
        self._compute: dict[str, float] = {}  # each node's compute time as last read
        self._next = 0  # the node the next poll reads first

    def join_s(self) -> float:
        return 30.0

    def result(self) -> Suspect | None:
        """After ``stop()`` (torchrun has exited): the node it evicted, if any (its ``why``:
        the measurement)."""
        return self.evicted

    def sample(self) -> stragglers.Sample:
        """Every node's compute time now: its slowest rank's recent median, read for at most
        ``NODES_PER_POLL`` nodes (in turn), the others' as last read."""
        count = min(NODES_PER_POLL, len(self.hosts))
        for i in range(self._next, self._next + count):
            host = self.hosts[i % len(self.hosts)]
            beats = read_beats(self.files.heartbeats(host))
            times = [b.compute_s for b in beats if b.compute_s]
            if times:
                self._compute[host] = max(times)
        self._next = (self._next + count) % len(self.hosts)
        return stragglers.Sample(self.clock(), dict(self._compute))

    def check(self) -> list[stragglers.Straggler]:
        """One poll: sample, decide, act on the stragglers not named before."""
        self.samples.append(self.sample())
        horizon = self.samples[-1].time - self.limits.window_s - KEEP_S
        self.samples = [s for s in self.samples if s.time >= horizon]
        new = [s for s in stragglers.find(self.samples, self.limits) if s.node not in self.named]
        for found in new:
            self.named.add(found.node)
            self.log(f"straggler: {found.describe()}")
            self.note(
                Kind.STRAGGLER, node=found.node, ratio=round(found.ratio, 3),
                seconds=round(found.seconds), compute_s=found.compute_s, median_s=found.median_s,
            )  # fmt: skip
            if self.evict and self.evicted is None:
                self.evict_node(found)
        return new

    def evict_node(self, found: stragglers.Straggler) -> None:
        """Report ``found`` as evicted and give this node's ranks the notice: they save and
        stop; the policy blames it once torchrun has exited."""
        self.evicted = Suspect(found.node, found.describe(), Evidence.STRAGGLER)
        ranks = read_beats(self.files.heartbeats(node_name()))
        for beat in ranks:  # one rank's notice is every rank's (they all-reduce it)
            with contextlib.suppress(ProcessLookupError):
                os.kill(beat.pid, signal.SIGUSR2)
        self.log(
            f"straggler: evicting {found.node}: notice to {len(ranks)} rank(s) here, save, "
            "requeue without it"
        )

    def tick(self) -> bool:
        try:
            self.check()
        except Exception as err:  # a record, never a reason to stop training
            if not self._failed:  # once: the next polls may fail the same way
                self.log(f"straggler check failed ({type(err).__name__}: {err})")
            self._failed = True
        return self.evicted is not None


class StartView(Protocol):
    """What this needs of the launcher's ``Start`` (``hpc_train.launch.starts``)."""

    @property
    def task(self) -> int: ...
    @property
    def hosts(self) -> tuple[str, ...]: ...


def watch(
    files: StartFiles,
    start: StartView,
    limits: StragglerLimits,
    evict: bool,
    note: Callable[..., Any],
    log: Callable[[str], None],
) -> StragglerWatch | None:
    """Task 0's straggler thread for this start; None on other tasks or on one node. ``evict``:
    ``--evict-stragglers`` with a restart left to resume without the node (the launcher asks
    ``restart_policy.may_requeue``); otherwise naming it is all. ``files``: the start's (an
    in-job round's heartbeats are its own: before, round 1 on read round 0's, stale, and never
    found a straggler)."""
    if start.task != 0 or len(start.hosts) < 2:
        return None
    return StragglerWatch(files, start.hosts, limits, evict, note, log).start()
