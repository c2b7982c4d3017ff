"""A rehearsal's pace (``hpc-train chaos JOB pace --seconds S``, ``contract.ask_pace``): every
update takes at least S seconds; each rank sleeps what its update left of them, after the
update, before fairseq's per-update validate-and-save.

Why: a rehearsed fault must land mid-run, and its allowance (a hang's floor, a silent launcher's
30 s) is wall time. A tiny run trains 25-35 updates/s on an idle machine and a few on a loaded
one, so a run sized for the fast case trains thousands of updates on the slow one. Paced, a run
trains at most 1/S updates/s anywhere: sized by time, it trains few updates and leaves the CPU
to others while it waits. The sleep is outside the update's compute time (``worker.compute_time``),
so the straggler check sees no difference between paced ranks; the hang watchdog sees an update
that takes S seconds at most longer, far below its floor. Nothing is asked: one stat() an update.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hpc_core.rundir import RunDir
from hpc_train.contract import pace_s


class Pace:
    """Called once an update: sleeps until ``pace_s(run)`` has passed since the previous call."""

    def __init__(
        self,
        run: RunDir,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.run, self.clock, self.sleep = run, clock, sleep
        self.last: float | None = None

    def __call__(self) -> float:
        """The seconds slept (0 without a pace, and at the first update)."""
        now, slept = self.clock(), 0.0
        asked = pace_s(self.run)
        if asked > 0 and self.last is not None and now - self.last < asked:
            slept = asked - (now - self.last)
            self.sleep(slept)
            now = self.clock()
        self.last = now
        return slept


def install(run: RunDir) -> Pace:
    """Pace fairseq's training loop: ``Pace`` before each update's validate-and-save."""
    import fairseq_cli.train as fairseq_train

    step, pace = fairseq_train.validate_and_save, Pace(run)

    def validate_and_save(*args: Any, **kwargs: Any) -> Any:
        pace()
        return step(*args, **kwargs)

    fairseq_train.validate_and_save = validate_and_save
    return pace
