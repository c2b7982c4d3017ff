"""The watchers' allowances as the user sets them: values a job carries (``--hang-*``,
``--straggler-*``), judged by the pure verdicts in ``hpc_train.watch`` (``hangs``, ``stragglers``),
whose docstrings explain each figure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HangLimits:
    """The hang watchdog's allowances, in seconds (``hpc_train.watch.hangs``)."""

    factor: float = 10.0
    floor_s: float = 300.0
    save_s: float = 900.0
    startup_s: float = 900.0


@dataclass(frozen=True)
class StragglerLimits:
    """When a node is a straggler (``hpc_train.watch.stragglers``)."""

    threshold: float = 0.2  # at least 20 % slower than the median of the other nodes...
    window_s: float = 300.0  # ...at every sample for this long
