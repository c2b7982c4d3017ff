"""The signals a launcher gets, and what they mean: a notice (USR2) or a cancel (SIGTERM).

- a preemption, the time limit or a spot notice sends USR2 to every task: ``recording`` notes it
  (in the order signals came) and writes ``contract.record_notice`` for ranks that have no
  handler yet; on task 0 submitit's own handler then calls ``Launcher.checkpoint``, which waits
  for the save on notice (``wait_for_save``, the one wait for it, at most ``save_wait_s``) and
  requeues;
- ``scancel`` sends SIGTERM with no notice before it: the policy tells that from a crash on
  every node by the signals ``recording`` noted (``restart_policy._cancelled``; task 0 alone also
  asks Slurm, the others follow its word);
- torchrun ignores USR2 (``ignore_usr2``): only the ranks act on it;
- task 0 may send the notice itself (a grow, a stuck launcher): ``OwnNotice`` hands its cause
  from the thread that decided it to ``checkpoint()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hpc_core import doorbell, ledger, slurm
from hpc_core.wait import process_exited
from hpc_train.contract import Cause, record_notice
from hpc_train.job.spec import SIGNAL_DELAY_S, JobSpec
from hpc_train.launch.context import log
from hpc_train.planning import costs

# checkpoint() waits for the save on notice at most this long: HPC_TRAIN_SAVE_WAIT_S if set, else
# the need of the run's slowest recent save (the ledger's) or, before one, the preset's estimate
# (hpc_train.planning.costs.notice_wait_s: >= 25 s, <= the 90 s of submitit's USR2 before the time
# limit). The wait ends as soon as the save is durable.
SAVE_WAIT_ENV = "HPC_TRAIN_SAVE_WAIT_S"
NOTED = {signal.SIGTERM: "SIGTERM", signal.SIGUSR2: "notice"}


class OwnNotice:
    """A notice task 0 sends itself, and why (``Cause.GROW``, ``Cause.HANG``): handed from the
    watcher thread that decides it (the grow watch, the pulse that found a stuck launcher) to
    submitit's ``checkpoint()``, which runs in this process's main thread, inside the handler
    of the USR2 that notice is, and records the stop with its cause (a plain ``Cause.NOTICE``
    when no thread sent one).

    The hand-over is ``send``: it records the cause, then signals the job. The handler can only
    run once the signal is sent, so it always finds the cause recorded (said after the signal, a
    loaded machine ran the handler first and recorded a plain notice: run 13 of 2026-11-27).
    The record is one reference, written by one thread and read by the handler: no lock, which
    a signal handler could not take while the thread it interrupted held it."""

    def __init__(self) -> None:
        self._cause: Cause | None = None

    def send(self, cause: Cause, job_id: str) -> None:
        """From a watcher thread: this notice is ``cause``, then USR2 to every task of the job
        (the save on notice, then submitit's requeue)."""
        self._cause = cause
        slurm.signal(job_id, "USR2")

    def cause(self) -> Cause:
        """In ``checkpoint()``: why this notice came (``Cause.NOTICE``: not task 0's own)."""
        return self._cause or Cause.NOTICE


def ignore_usr2() -> None:
    """torchrun's preexec: Slurm signals every process of the step; the agent must not die of
    it (the default action of SIGUSR2 is to terminate). Workers install their own handler."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def recorder(
    name: str, received: list[str], pending: Path | None, previous: Any
) -> Callable[[int, Any], None]:
    """A handler that appends ``name`` to ``received`` (the order signals came), records a
    notice at ``pending`` for ranks without a handler yet, then runs ``previous`` (submitit's
    own: it logs SIGTERM and carries on; on USR2 task 0's calls checkpoint())."""

    def handler(signum: int, frame: Any) -> None:
        received.append(name)
        if name == "notice" and pending is not None:
            record_notice(pending, signal.Signals(signum).name)
        if callable(previous):
            previous(signum, frame)

    return handler


@contextlib.contextmanager
def recording(received: list[str], pending: Path | None) -> Iterator[None]:
    """While torchrun runs: every task notes a notice (USR2) before the requeue's SIGTERM, so
    that SIGTERM is no cancel; the handlers before are put back after."""
    previous = {sig: signal.getsignal(sig) for sig in NOTED}
    for sig, name in NOTED.items():
        signal.signal(sig, recorder(name, received, pending, previous[sig]))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def save_wait_s(spec: JobSpec) -> float:
    """The longest checkpoint() waits for the save on notice (see ``SAVE_WAIT_ENV``)."""
    if os.environ.get(SAVE_WAIT_ENV):
        return float(os.environ[SAVE_WAIT_ENV])
    measured = costs.measured_save_s(ledger.read(spec.run_dir.ledger))
    return costs.notice_wait_s(spec.training.preset, spec.sizing.gpus_per_node > 0, SIGNAL_DELAY_S,
                               measured_s=measured)  # fmt: skip


def wait_for_save(
    marker: Path | None, wait_s: float, exited: Callable[[], bool] | None = None
) -> bool:
    """After a notice: the one wait for the save on notice. Until it is durable (the stop
    ``marker`` exists: rank 0 writes it after the checkpoint) or, where ``exited`` is given, the
    workers it watches have exited (``workers_exited``: this node's torchrun), whichever comes
    first, at most ``wait_s``; was the save made? ``checkpoint()`` waits so, and task 1 acting
    for a stuck task 0 on the marker alone. Safe inside a signal handler: it reads /proc, never
    ``Popen.poll()`` (the interrupted ``wait()`` holds its lock)."""
    started = time.monotonic()

    def saved_or_exited() -> str | None:
        if marker is not None and marker.exists():
            return "the save on notice is durable"
        if exited is not None and exited():
            return "workers exited"
        return None

    try:
        # rank 0's word (its marker, rung: ``WorkerEnv.bell``): the requeue follows at once,
        # at most a quarter second after it unrung (FAST's back-off to 1 s: up to a second)
        what = doorbell.await_word(saved_or_exited, "the save on notice", wait_s)
        log(f"{what} {time.monotonic() - started:.1f} s after the notice: requeueing")
    except TimeoutError:
        log(f"no save on notice after {wait_s:.0f} s: requeueing anyway")
        return False
    return marker is not None and marker.exists()


def workers_exited(pid: int | None) -> Callable[[], bool]:
    """Have the workers of torchrun ``pid`` exited (None: none were started: they have)?"""
    return lambda: pid is None or process_exited(pid)
