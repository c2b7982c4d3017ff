"""Task 0's grow-back thread, while a ``--nodes MIN-MAX`` run trains on fewer than MAX nodes.

Every ``POLL_S`` it reads the partition's nodes (one ``sinfo``); once some could be added and
stayed idle for the settle window (``hpc_train.watch.grows``), it asks Slurm whether a job of that
many nodes would start now (``sbatch --test-only``, nothing submitted) and, only if so, calls
``on_grow(target, why)`` once: the launcher records ``grown`` in the ledger and sends the notice
(USR2): the ranks save on notice, the job is requeued and Slurm gives it the larger width. A
Slurm that does not answer is skipped until the next poll; a grow Slurm would not start now is
not attempted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from hpc_core import slurm
from hpc_train.watch import grows
from hpc_train.watch.watcher import Watcher

POLL_S = 10.0
START_SLACK_S = 60.0  # "starts now": Slurm's estimate at most this far ahead


class GrowWatch(Watcher[int | None]):
    """Task 0's grow-back thread (see the module docstring)."""

    def __init__(
        self,
        partition: str | None,
        hosts: Collection[str],
        nodes_max: int,
        settle_s: float,
        excluded: Callable[[], Collection[str]],
        end_time: float | None,
        on_grow: Callable[[int, str], None],
        log: Callable[[str], None],
    ) -> None:
        super().__init__("grow-watch", POLL_S)
        self.partition, self.hosts, self.nodes_max = partition, list(hosts), nodes_max
        self.settle = grows.Settle(settle_s)
        self.excluded, self.end_time, self.on_grow, self.log = excluded, end_time, on_grow, log
        self.grown: int | None = None

    def join_s(self) -> float:
        return POLL_S + 35

    def result(self) -> int | None:
        """After ``stop()``: the width it asked to grow to, if it did."""
        return self.grown

    def tick(self) -> bool:
        try:
            return self.poll(time.time())
        except slurm.SlurmError as err:
            self.log(f"grow: Slurm did not answer ({err}); trying again")
            return False

    def poll(self, now: float) -> bool:
        """One look; True once it has asked to grow."""
        excluded = set(self.excluded())
        states = slurm.partition_nodes(self.partition)
        free = grows.idle_candidates(states, self.hosts, excluded)
        if not self.settle.ready(free, now) or not grows.time_to_grow(self.end_time, now):
            return False
        target = grows.grow_target(len(self.hosts), self.nodes_max, free)
        extra = target - len(self.hosts)
        ask = ["-N", str(extra), *(["-p", self.partition] if self.partition else [])]
        ask += [f"--exclude={','.join(sorted({*self.hosts, *excluded}))}"]
        starts = slurm.start_estimate(ask)
        if starts is None or starts > now + START_SLACK_S:
            self.log(f"grow: {extra} more node(s) idle, but Slurm would not start them now")
            self.settle.since = None  # settle again before the next ask
            return False
        why = (
            f"{', '.join(free)} idle for {now - (self.settle.since or now):.0f} s and Slurm would "
            f"start {extra} more node(s) now"
        )
        self.grown = target
        self.on_grow(target, why)
        return True
