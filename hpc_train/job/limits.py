"""The watchers' settings as the user sets them: values a job carries (``--no-watchdog``,
``--hang-*``, ``--straggler-*``), each field with its option (``job.fields``). The limits are
judged by the pure verdicts in ``hpc_train.watch`` (``hangs``, ``stragglers``), whose docstrings
explain each figure. What follows a blame (``--no-drain``, ``--evict-stragglers``) is the
recovery section's (``job.spec.Recovery``): the blame and the requeue read it, not the watch."""

from __future__ import annotations

from dataclasses import dataclass

from hpc_train.job.fields import nested, option, seconds


@dataclass(frozen=True)
class HangLimits:
    """The hang watchdog's allowances, in seconds (``hpc_train.watch.hangs``)."""

    factor: float = option(
        "--hang-factor", "a hang: no update for this many times the slowest recent update…",
        default=10.0, type=float, metavar="K",
    )  # fmt: skip
    floor_s: float = seconds(
        "--hang-timeout-floor", "…or for this many seconds, whichever is longer", 300.0
    )
    save_s: float = seconds(
        "--hang-save-timeout",
        "seconds allowed for validation, a checkpoint save, an epoch change",
        900.0,
    )
    startup_s: float = seconds(
        "--hang-startup-timeout", "seconds allowed from torchrun's start to the first update", 900.0
    )


@dataclass(frozen=True)
class StragglerLimits:
    """When a node is a straggler (``hpc_train.watch.stragglers``)."""

    threshold: float = option(
        "--straggler-threshold", "a straggler: a node whose own compute per update is this "
        "much slower than the other nodes' median (0.2: 20 %)…",
        default=0.2, type=float, metavar="F",
    )  # fmt: skip
    window_s: float = seconds(
        "--straggler-window", "…at every check for this many seconds (logged, in the ledger)", 300.0
    )


@dataclass(frozen=True)
class Watch:
    """The in-job watchers of a run (``JobSpec.watch``): the hang watchdog with its limits, the
    straggler watch with its."""

    no_watchdog: bool = option(
        "--no-watchdog", "no hang detection (a stuck job then holds its nodes until --time)",
        default=False,
    )  # fmt: skip
    hang: HangLimits = nested(HangLimits)
    stragglers: StragglerLimits = nested(StragglerLimits)
