"""The worker's ledger events: the first update of each start, and every checkpoint save.

Rank 0 alone writes them (one writer per event), to the ledger of the run it trains
(``RunDir.ledger``); the launcher passes which start this is (``contract.WorkerEnv``).
Both hooks wrap fairseq functions the training loop looks up at call time:
``fairseq_cli.train.validate_and_save`` (called after every update) and
``fairseq.checkpoint_utils.save_checkpoint`` (every save: periodic, end of epoch, on notice).
With async saves (``hpc_train.worker.async_save``) a save's event is recorded once it is durable:
``seconds`` is the training stall, ``snapshot_s`` / ``write_s`` what the snapshot and the
background write took (tiered saves: ``write_s`` the local write, ``copy_s`` the copy to the
save dir); ``sha256`` the digest recorded in the file as it was written (``hpc_core.integrity``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from hpc_core import integrity, ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train.worker import async_save, preemption


def recorder(run: RunDir, start: tuple[str, int] | None, rank: int) -> Callable[..., None] | None:
    """Rank 0's ``note(kind, **data)`` for this start's events in the run's ledger (``start``:
    this start's (job, restart)); None when not recording (another rank, or no launcher). The
    fairseq hooks below use it, and the hollow rank (``worker.hollow``) as it is."""
    if start is None or rank != 0:
        return None
    job, restart = start

    def note(kind: Kind, **data: Any) -> None:
        ledger.record(run.ledger, kind, job, restart, **data)

    return note


def install(run: RunDir, start: tuple[str, int] | None, rank: int) -> bool:
    """Wrap fairseq's update and save steps so rank 0 records them (``start``: this start's
    (job, restart)); False when not recording (another rank, or no launcher)."""
    note = recorder(run, start, rank)
    if note is None:
        return False
    # fairseq loads here, not with this module: as everywhere in the rank, only once
    # worker.train has set the rank up (its filters for fairseq's import-time warnings first)
    import fairseq_cli.train as fairseq_train
    from fairseq import checkpoint_utils

    step = fairseq_train.validate_and_save
    first = {"seen": False}

    @functools.wraps(step)
    def validate_and_save(cfg: Any, trainer: Any, *args: Any, **kwargs: Any) -> Any:
        if not first["seen"]:
            first["seen"] = True
            note(Kind.FIRST_UPDATE, update=trainer.get_num_updates())
        return step(cfg, trainer, *args, **kwargs)

    save = checkpoint_utils.save_checkpoint

    @functools.wraps(save)
    def save_checkpoint(cfg: Any, trainer: Any, *args: Any, **kwargs: Any) -> Any:
        notice = preemption.saving_on_notice()  # not notice_received(): one may land mid-save
        began = time.monotonic()
        out = save(cfg, trainer, *args, **kwargs)
        seconds = time.monotonic() - began  # the training stall (async: wait + snapshot)
        update = trainer.get_num_updates()

        def record() -> None:  # once the save is durable (async: on the writer thread)
            last = run.checkpoint_last
            size = last.stat().st_size if last.exists() else 0
            saver = async_save.active()
            timing = {} if saver is None or saver.last is None else {
                "snapshot_s": round(saver.last.snapshot_s, 3),
                "write_s": round(saver.last.write_s, 3),
            }  # fmt: skip
            if saver is not None and saver.last is not None and saver.last.copy_s is not None:
                timing["copy_s"] = round(saver.last.copy_s, 3)  # tiered: local → save dir
            digest = integrity.recorded(last) if size else None
            note(Kind.CHECKPOINT, update=update, seconds=round(seconds, 3), bytes=size,
                 notice=notice, sha256=digest, **timing)  # fmt: skip

        async_save.when_durable(record, "the ledger's checkpoint event")
        return out

    fairseq_train.validate_and_save = validate_and_save
    checkpoint_utils.save_checkpoint = save_checkpoint
    return True
