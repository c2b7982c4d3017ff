"""Save on notice, inside each training worker.

A notice is SIGUSR2: Slurm sends it to every process of the step at preemption
(``preempt_send_user_signal``) and before the time limit (submitit's ``--signal=USR2@90``), and
the launcher's spot watcher sends it when EC2 posts a two-minute interruption notice. The handler
only sets a flag. After every update, all ranks all-reduce the flag (MAX), so they all act at the
same update: write ``checkpoint_last.pt`` (no validation: grace time is short), record a stop
marker for the launcher, and leave fairseq's training loop normally. The resumed run continues at
the next update, so no update is trained twice.

A notice can come before a rank has its handler: torchrun is started with USR2 ignored (the
agent must not die of it) and its workers inherit that until ``install_handler``. Each launcher
records the notices it receives (``contract.record_notice``); a rank reads that record at every
update until it knows of a notice, so a notice during start-up is saved on too, at the first update.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Any

from hpc_train.contract import LauncherBell, StopMarker, read_notice, write_stop
from hpc_train.worker import async_save, save_interval
from hpc_train.worker.heartbeat import Heartbeat
from hpc_train.worker.save_interval import AutoInterval

logger = logging.getLogger("hpc_train.worker.preemption")

NOTICE_SIGNAL = signal.SIGUSR2
# at: monotonic time of the signal; why: its name; via: how this rank learnt of it, when not by
# its own handler ("recorded by the launcher"; a peer's is known only from ``agree``)
_notice: dict[str, Any] = {"at": None, "why": None, "via": None, "saving": False}


def _on_signal(signum: int, _frame: Any) -> None:
    if _notice["at"] is None:
        _notice["at"] = time.monotonic()
        _notice["why"] = signal.Signals(signum).name


def install_handler() -> None:
    signal.signal(NOTICE_SIGNAL, _on_signal)


def notice_received() -> bool:
    return _notice["at"] is not None


def notice_recorded(pending: Path | None) -> bool:
    """A notice this rank's handler missed (it came while torchrun or this rank was starting,
    with USR2 ignored): the launcher recorded it at ``pending``. One stat per update until a
    notice is known."""
    if pending is None or notice_received() or not pending.exists():
        return False
    name, at = read_notice(pending)
    ago = max(0.0, time.time() - at) if at is not None else 0.0
    # the signal's own name: the launcher's SIGUSR2 is the same notice the rank's own handler
    # would have had a moment later (Slurm signals the step's processes one by one)
    _notice.update(at=time.monotonic() - ago, why=name or NOTICE_SIGNAL.name,
                   via="recorded by the launcher")  # fmt: skip
    return True


def _source() -> str:
    """The notice as the rank's log says it: "SIGUSR2", "SIGUSR2, recorded by the launcher",
    "SIGUSR2, from a peer rank"."""
    name = str(_notice["why"] or NOTICE_SIGNAL.name)
    via = _notice["via"] or (None if _notice["why"] else "from a peer rank")
    return f"{name}, {via}" if via else name


def saving_on_notice() -> bool:
    """True while the save that a notice triggered runs: a periodic or end-of-epoch save the
    signal merely landed in is not the save on notice."""
    return bool(_notice["saving"])


def dist_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def agree(device: Any, proposal: int = 0) -> tuple[bool, int]:
    """(any rank has a notice, the largest ``proposal``) on every rank: one all-reduce (MAX) per
    update; alone, the local values. Rank 0 proposes a save interval (``hpc_train.worker.save_interval``),
    the others 0."""
    import torch
    import torch.distributed as dist

    local = [1 if notice_received() else 0, proposal]
    if not dist_initialized() or dist.get_world_size() == 1:
        return bool(local[0]), proposal
    values = torch.tensor(local, dtype=torch.int64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    notice, agreed = values.tolist()
    return bool(notice), int(agreed)


def _save_and_stop(
    cfg: Any, trainer: Any, epoch_itr: Any, marker: Path, update: int,
    bell: LauncherBell | None = None,
) -> tuple[list[None], bool]:  # fmt: skip
    """The agreed notice's save: ``checkpoint_last.pt`` (durable: async saves flushed), then
    rank 0's stop marker at ``marker`` (``bell`` rung), then a barrier; returns fairseq's
    (valid losses, stop)."""
    from fairseq import checkpoint_utils

    started = time.monotonic()
    logger.info(f"notice ({_source()}): saving at update {update} and stopping")
    _notice["saving"] = True
    try:
        checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, None)
    finally:
        _notice["saving"] = False
    async_save.flush()  # durable before the stop marker says so
    since = time.monotonic() - (_notice["at"] or started)
    logger.info(
        f"saved on notice at update {update} in {time.monotonic() - started:.1f} s "
        f"({since:.1f} s after the signal)"
    )
    if trainer.data_parallel_rank == 0:
        # last: once it exists the checkpoint is durable and task 0's launcher may requeue
        # every notice is NOTICE_SIGNAL: named the same whichever rank (or launcher) had it first
        write_stop(marker, StopMarker(update, _notice["why"] or NOTICE_SIGNAL.name), bell)
    if dist_initialized():
        import torch.distributed as dist

        dist.barrier()  # every node's launcher sees the marker once its workers exit
    return [None], True


def install_save_on_notice(
    marker: Path,
    heartbeat: Heartbeat | None = None,
    auto: AutoInterval | None = None,
    pending: Path | None = None,
    bell: LauncherBell | None = None,
) -> None:
    """Wrap fairseq's per-update validate-and-save step with the agreed notice check; the stop
    marker goes to ``marker`` (a path the launcher chose, ``bell`` rung with it); ``pending``:
    where the launcher records a notice it received (``notice_recorded``). ``heartbeat``: told
    when each update completed and when validate-and-save returned (fairseq calls it once per
    update, with ``end_of_epoch`` on the epoch's last one). ``auto`` (rank 0 under ``--save-interval auto``):
    times updates and save points and proposes the interval every rank then sets."""
    import fairseq_cli.train as fairseq_train

    original = fairseq_train.validate_and_save

    def validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
        update, began = trainer.get_num_updates(), time.monotonic()
        if auto is not None:
            auto.completed(began)
        if heartbeat is not None:  # trained (and logged by fairseq): the goodput's "reached"
            heartbeat.stepped(update)
        notice_recorded(pending)
        notice, interval = agree(trainer.device, auto.proposal() if auto is not None else 0)
        if heartbeat is not None:  # after the agreement: a rank blocked in that all-reduce
            heartbeat.completed(update)  # is still training (a peer stopped mid-update)
        if interval:
            cfg.checkpoint.save_interval_updates = interval
        if not notice:
            saves = auto is not None and save_interval.saves_at(
                update, cfg.checkpoint.save_interval_updates, end_of_epoch
            )
            valid_losses, should_stop = original(
                cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch
            )
            if heartbeat is not None:
                heartbeat.training(end_of_epoch, stopping=should_stop)
            if auto is not None:
                auto.step_ended(began, time.monotonic(), saves)
            return valid_losses, should_stop
        return _save_and_stop(cfg, trainer, epoch_itr, marker, update, bell)

    fairseq_train.validate_and_save = validate_and_save
