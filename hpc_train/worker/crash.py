"""A rank's last words: the report of the exception that ends it (``contract.FailureRecord``,
read and classified by task 0 through ``hpc_train.faults.failures``), and a crash injected on
purpose by ``hpc-train chaos JOB crash --at-update N`` (a user error, by class)."""

from __future__ import annotations

import contextlib
from typing import Any

from hpc_core.rundir import RunDir
from hpc_train.contract import FailureRecord, read_crash_request, write_failure


class InjectedCrash(RuntimeError):
    """``chaos JOB crash``: raised on purpose by a worker (a user error by class)."""


def from_exception(err: BaseException, rank: int, update: int) -> FailureRecord:
    lines = str(err).strip().splitlines()
    return FailureRecord(rank, update, type(err).__name__, lines[0][:300] if lines else "")


def report(
    run: RunDir, start: tuple[str, int] | None, rank: int, err: BaseException, update: int
) -> None:
    """The worker's last act before an exception ends it (outside a launcher: nothing)."""
    if start is None or isinstance(err, KeyboardInterrupt | SystemExit):
        return
    with contextlib.suppress(OSError):  # the exception itself still reaches the log
        write_failure(run, *start, from_exception(err, rank, update))


def crash_if_asked(run: RunDir, update: int, rank: int) -> None:
    """Called at every update: one stat() unless a crash was injected (then one read)."""
    asked = read_crash_request(run)
    if asked is not None and asked.update == update and asked.rank == rank:
        raise InjectedCrash(f"chaos: crash injected at update {update} on rank {rank}")


def install(run: RunDir, rank: int, progress: dict[str, int]) -> None:
    """Track the update this rank reached (``progress["update"]``, for its crash report) and
    raise an injected crash when asked, from fairseq's per-update step."""
    import fairseq_cli.train as fairseq_train

    step = fairseq_train.validate_and_save

    def validate_and_save(cfg: Any, trainer: Any, *args: Any, **kwargs: Any) -> Any:
        progress["update"] = trainer.get_num_updates()
        crash_if_asked(run, progress["update"], rank)
        return step(cfg, trainer, *args, **kwargs)

    fairseq_train.validate_and_save = validate_and_save
