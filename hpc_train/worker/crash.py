"""A rank's last words: the report of the exception that ends it (``contract.FailureRecord``,
read and classified by task 0 through ``hpc_train.faults.failures``), and a crash injected on
purpose by ``hpc-train chaos JOB crash --at-update N`` (a user error, by class).

The report keeps the exception's chain (``__cause__``, else ``__context__``: torch's checkpoint
writer reports a full disk as ``RuntimeError: ... unexpected pos``, the ``OSError`` with its errno
only in its context) and the first errno in it, so that a storage failure can be told from a bug
(``faults.storage``). It is written to the save dir; when that fails (the same full or read-only
file system), the report goes to stderr as one line (``contract.failure_line``), which reaches
the task log through torchrun and which task 0's launcher reads (``faults.agent_exit.Tee``)."""

from __future__ import annotations

import re
import sys
from typing import Any

from hpc_core.rundir import RunDir
from hpc_train.contract import (
    FailureRecord,
    failure_line,
    node_name,
    read_crash_request,
    write_failure,
)

MESSAGE_MAX = 300  # of an exception's first line
CHAIN_MAX = 8  # exceptions of a chain kept
ERRNO_RE = re.compile(r"\[Errno (\d+)\]")


class InjectedCrash(RuntimeError):
    """``chaos JOB crash``: raised on purpose by a worker (a user error by class)."""


def chain(err: BaseException) -> list[BaseException]:
    """``err`` and what it was raised from or during (``__cause__``, else ``__context__``),
    outermost first; ``CHAIN_MAX`` at most, never round a cycle."""
    found: list[BaseException] = []
    now: BaseException | None = err
    while now is not None and len(found) < CHAIN_MAX and all(now is not e for e in found):
        found.append(now)
        now = now.__cause__ or now.__context__
    return found


def first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:MESSAGE_MAX] if lines else ""


def errno_in(errors: list[BaseException]) -> tuple[int | None, str | None]:
    """The first errno of ``errors``: an ``OSError``'s (and the file it names), else the first
    ``[Errno N]`` in a message (where a wrapper kept only the text)."""
    for err in errors:
        if isinstance(err, OSError) and err.errno:
            name = err.filename if isinstance(err.filename, str) else None
            return err.errno, name
    for err in errors:
        found = ERRNO_RE.search(str(err))
        if found is not None:
            return int(found.group(1)), None
    return None, None


def from_exception(err: BaseException, rank: int, update: int) -> FailureRecord:
    errors = chain(err)
    number, path = errno_in(errors)
    links = tuple(f"{type(e).__name__}: {first_line(e)}" for e in errors)
    return FailureRecord(rank, update, type(err).__name__, first_line(err), number, path, links,
                         node_name())  # fmt: skip


def report(
    run: RunDir, start: tuple[str, int] | None, rank: int, err: BaseException, update: int
) -> None:
    """The worker's last act before an exception ends it (outside a launcher: nothing). A
    report that cannot be written is said on stderr, whole (``contract.failure_line``)."""
    if start is None or isinstance(err, KeyboardInterrupt | SystemExit):
        return
    record = from_exception(err, rank, update)
    try:
        write_failure(run, *start, record)
    except OSError as failed:
        path = run.failure_report(*start, rank)
        print(failure_line(record, path, failed), file=sys.stderr, flush=True)


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
