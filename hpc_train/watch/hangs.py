"""The progress watchdog's decision, pure: is a node's training stuck.

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

Who is to blame for a hang is not decided here: the hang monitor reports what each rank did, and
task 0's policy (``hpc_train.launch.restart_policy``) names the suspect
(``faults.suspects.hang_suspect``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpc_train.contract import CHECKPOINT, EPOCH, STARTUP, STOPPING, Beat
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
