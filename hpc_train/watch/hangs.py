"""The progress watchdog's decisions, pure: is a node's training stuck, and who is to blame.

Every rank writes a heartbeat after each update (``hpc_train.worker.heartbeat``): the update it
completed, when, the phase it went on to, and the slowest of its recent updates. A rank has hung
when its heartbeat is older than its allowance:

- training (``train``): T = max(factor x the slowest recent update, floor);
- validation (``validate``, a beat per validation batch): T as well;
- a checkpoint save (counted from its start), an epoch change or the end of training
  (``checkpoint``, ``epoch``, ``stopping``): max(save, T);
- before its first update of this start (loading data, building the model, the first
  collective, resuming a checkpoint): the start-up allowance, counted from the rank's first
  heartbeat (``startup``, written as soon as its stacks can be asked for), or from torchrun's
  start for a rank that has not written one.

Defaults (``--hang-factor``, ``--hang-timeout-floor``, ``--hang-save-timeout``,
``--hang-startup-timeout``; ``--no-watchdog`` turns it off): factor 10, floor 300 s, save 900 s,
start-up 900 s. A RoBERTa-base update takes about 1 s on 8 GPUs, so 300 s is far above any
healthy update and far below the 24 h a hung job would otherwise hold its nodes.

The suspect of a hang, among the ranks of all nodes: a node that sent no report, else a rank
that gave no Python stack when asked (SIGSTOPped, or stuck outside the interpreter), else the
rank whose heartbeat is oldest (fewest updates, then earliest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpc_train.contract import CHECKPOINT, EPOCH, STARTUP, STOPPING, Beat
from hpc_train.faults.evidence import Evidence, of_hang
from hpc_train.job.limits import HangLimits

SLOW_PHASES = frozenset({CHECKPOINT, EPOCH, STOPPING})


@dataclass(frozen=True)
class Hang:
    rank: int | None  # None: a rank that never beat (still starting)
    age_s: float  # how long without progress
    allowance_s: float
    why: str


def allowance(beat: Beat | None, limits: HangLimits) -> float:
    """How long ``beat`` may stay the rank's latest before the rank counts as hung."""
    if beat is None or beat.phase == STARTUP:
        return limits.startup_s
    train = max(limits.factor * (beat.slowest_s or 0.0), limits.floor_s)
    return max(limits.save_s, train) if beat.phase in SLOW_PHASES else train


def assess(
    beats: Sequence[Beat], expected: int, started: float, now: float, limits: HangLimits
) -> Hang | None:
    """A hang among one node's ranks, or None.

    ``beats``: the latest heartbeat of each rank that has written one this start; ``expected``:
    the ranks this node runs (those without a heartbeat are still starting, since ``started``).
    """
    worst: Hang | None = None
    for beat in beats:
        limit, age = allowance(beat, limits), now - beat.time
        if age > limit and (worst is None or age - limit > worst.age_s - worst.allowance_s):
            since = (
                "it started (start-up"
                if beat.phase == STARTUP
                else f"update {beat.update} ({beat.phase}"
            )
            why = (
                f"rank {beat.rank} on {beat.node}: no update for {age:.0f} s after {since}; "
                f"allowed {limit:.0f} s)"
            )
            worst = Hang(beat.rank, age, limit, why)
    if worst is None and len(beats) < expected and now - started > limits.startup_s:
        age = now - started
        missing = expected - len(beats)
        why = f"{missing} rank(s) completed no update in {age:.0f} s of start-up"
        worst = Hang(None, age, limits.startup_s, why)
    return worst


@dataclass(frozen=True)
class RankReport:
    """What a node's launcher saw of one of its ranks when the hang was declared."""

    rank: int
    node: str
    update: int
    time: float
    stack: bool  # it wrote its Python stacks when asked


@dataclass(frozen=True)
class Suspect:
    node: str
    rank: int | None
    why: str
    evidence: Evidence | None = None  # what the blame rests on (hpc_train.faults.evidence)


def suspect(
    ranks: Sequence[RankReport], reported: Sequence[str], nodes: Sequence[str]
) -> Suspect | None:
    """The node to blame for a hang (see the module docstring); None when nothing is known.

    ``reported``: the nodes whose launcher sent a report; ``nodes``: every node known to run
    ranks (from the heartbeats).
    """
    silent = [n for n in nodes if n not in reported]
    if silent:
        why = f"node {silent[0]} sent no report (its launcher is gone)"
        return Suspect(silent[0], None, why, of_hang(stack=False))
    oldest = sorted(ranks, key=lambda r: (r.update, r.time, r.rank))
    for r in oldest:
        if not r.stack:
            why = (
                f"rank {r.rank} on {r.node} gave no Python stack (stopped, or stuck outside Python)"
            )
            return Suspect(r.node, r.rank, why, of_hang(stack=False))
    if oldest:
        r = oldest[0]
        why = f"rank {r.rank} on {r.node} has the oldest heartbeat"
        return Suspect(r.node, r.rank, why, of_hang(stack=True))
    return None
