"""Stragglers, pure: which node computes its updates markedly slower than the others.

In data-parallel training every rank's update takes the same wall time (the gradient
all-reduce waits for the slowest rank), so the update time cannot name a slow node. What can is
each rank's own compute time per update, collectives excluded (``hpc_train.worker.compute_time``
measures it; the heartbeat carries the median of its recent updates as ``compute_s``). A node's
compute time is its slowest rank's (one slow GPU holds the whole node back).

A node straggles when its compute time is at least ``1 + threshold`` times the median of the
*other* nodes' (for many nodes that is the median of all; with two nodes it still names the
slow one: the median of both would sit half-way), at every sample for at least ``window_s``
seconds. A brief spike (a save, a noisy neighbour for a minute) is not a straggler. Defaults
(``--straggler-threshold``, ``--straggler-window``): 0.2 (20 % slower) for 300 s.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpc_train.job.limits import StragglerLimits


@dataclass(frozen=True)
class Sample:
    """Every node's compute time per update (seconds) as seen at ``time``."""

    time: float
    compute_s: Mapping[str, float]


@dataclass(frozen=True)
class Straggler:
    node: str
    ratio: float  # its compute time over the median of the others', at the latest sample
    since: float  # the first sample of the slow streak
    seconds: float  # how long it has been slow (latest sample - since)
    compute_s: float
    median_s: float  # the other nodes' median

    def describe(self) -> str:
        return (
            f"node {self.node} computes an update in {self.compute_s:.3g} s, "
            f"{self.ratio:.2f}x the median of the other nodes ({self.median_s:.3g} s) "
            f"for {self.seconds:.0f} s"
        )


def ratios(compute_s: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """{node: (its compute time / the median of the other nodes', that median)}; empty with
    fewer than two nodes timed."""
    timed = {n: s for n, s in compute_s.items() if s > 0}
    if len(timed) < 2:
        return {}
    out = {}
    for node, seconds in timed.items():
        median = statistics.median(s for n, s in timed.items() if n != node)
        out[node] = (seconds / median, median)
    return out


def find(samples: Sequence[Sample], limits: StragglerLimits) -> list[Straggler]:
    """The nodes slow at every sample of the last ``window_s`` seconds or more (slowest
    first). ``samples`` in time order; a node absent from a sample ends its streak."""
    since: dict[str, float] = {}
    latest: dict[str, tuple[float, float]] = {}
    for sample in samples:
        now = ratios(sample.compute_s)
        for node in list(since):
            if node not in now or now[node][0] < 1 + limits.threshold:
                del since[node]
        for node, (ratio, median) in now.items():
            if ratio >= 1 + limits.threshold:
                since.setdefault(node, sample.time)
                latest[node] = (ratio, median)
    if not samples:
        return []
    end = samples[-1]
    found = [
        Straggler(
            node, latest[node][0], start, end.time - start, end.compute_s[node], latest[node][1]
        )
        for node, start in since.items()
        if end.time - start >= limits.window_s
    ]
    return sorted(found, key=lambda s: -s.ratio)
