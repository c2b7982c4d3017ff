"""``--save-interval auto``: the periodic save interval chosen from the run's own costs.

Daly's interval (``hpc_train.planning.plan.daly_interval``, the same formula ``hpc-train plan`` prints)
from three figures: ``C``, what a save point costs training — measured on rank 0 as the time
fairseq's validate-and-save step takes when it saves (with async saves that is the snapshot,
plus validation where fairseq validates at save points), the preset's estimated write until the
first save is measured; the update time, the median of the recent updates timed on rank 0; and
the job's MTBF, one node's ``--mtbf-hours`` divided by the nodes of this start (any node failing
ends the start). The interval in updates is rounded, at least 1.

When: rank 0 proposes an interval at its second update (one update timed) and after every save;
the proposal travels in the all-reduce the save on notice already makes every update
(``hpc_train.worker.preemption.agree``), so every rank sets the same
``cfg.checkpoint.save_interval_updates`` at the same update and fairseq's own save test
(``updates % interval == 0``) stays in step everywhere. Between saves the interval holds.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable

from hpc_train.planning import plan

RECENT = 50  # updates in the median
logger = logging.getLogger("hpc_train.worker.save_interval")


def interval_updates(save_s: float, update_s: float, mtbf_s: float) -> int:
    """Daly's interval in whole updates (at least 1)."""
    return max(1, round(plan.daly_interval(max(save_s, 1e-6), mtbf_s) / update_s))


class AutoInterval:
    """Rank 0's chooser: told when each update completed and each validate-and-save step ended."""

    def __init__(
        self, mtbf_s: float, estimated_save_s: float, log: Callable[[str], None] | None = None
    ) -> None:
        self.mtbf_s = mtbf_s
        self.save_s = estimated_save_s
        self.measured = False  # save_s is a measured save, not the estimate
        self.updates: deque[float] = deque(maxlen=RECENT)
        self.log = log
        self._training_since: float | None = None
        self._due = True  # propose at the next chance: the first timed update, after each save
        self.interval: int | None = None

    @classmethod
    def for_rank(cls, inputs: tuple[float, float] | None, rank: int) -> AutoInterval | None:
        """The chooser for rank 0 under ``--save-interval auto`` (``inputs``: the launcher's job
        MTBF and estimated save, ``contract.WorkerEnv.auto_interval``), logging to this module's
        logger (the train log); None otherwise."""
        if inputs is None or rank != 0:
            return None
        return cls(inputs[0], inputs[1], logger.info)

    def completed(self, now: float) -> None:
        """An update completed (validate-and-save begins)."""
        if self._training_since is not None:
            self.updates.append(now - self._training_since)

    def step_ended(self, began: float, now: float, saved: bool) -> None:
        """Validate-and-save, begun at ``began``, returned at ``now``; ``saved``: it saved."""
        if saved:
            self.save_s, self.measured, self._due = now - began, True, True
        self._training_since = now

    def proposal(self) -> int:
        """The interval to set now, or 0 (no change)."""
        if not self._due or not self.updates:
            return 0
        self._due = False
        update_s = statistics.median(self.updates)
        chosen = interval_updates(self.save_s, update_s, self.mtbf_s)
        if chosen != self.interval and self.log is not None:
            what = "measured" if self.measured else "estimated"
            self.log(
                f"save interval: every {chosen} updates (Daly: save point {self.save_s:.2f} s "
                f"{what}, update {update_s:.3f} s, job MTBF {self.mtbf_s / 3600:.3g} h)"
            )
        self.interval = chosen
        return chosen


def saves_at(update: int, interval: int, end_of_epoch: bool) -> bool:
    """Does fairseq save at this validate-and-save step (``--save-interval-updates``, or an
    epoch's end with the default ``--save-interval 1``)?"""
    return end_of_epoch or (interval > 0 and update > 0 and update % interval == 0)
