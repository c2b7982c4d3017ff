"""Heartbeats inside validate-and-save: validation judged batch by batch, a save from its start.

fairseq calls ``validate_and_save`` after every update; at a save point it validates (per batch: a
forward pass, then an all-reduce of the logging stats) and then saves. The update's own beat says
``checkpoint``, which gets the save allowance (``--hang-save-timeout``, 900 s by default), so a rank
stuck in a validation collective used to be caught only once a save would have been overdue.
Measured by ``make bench-soak`` (2026-11-26, save allowance 60 s, training allowance 10 s): a
rank SIGSTOPped during validation was caught after 61 s, one stopped between saves after ~10 s.

Here a rank beats when validation begins and after each validation batch (phase ``validate``:
the training allowance, since a batch's forward pass is never slower than a training update) and
again as each save begins (``checkpoint``: the save allowance, counted from the save's start).

All three wrap fairseq names its training loop looks up at call time:
``fairseq_cli.train.validate``, ``fairseq.trainer.Trainer.valid_step`` and
``fairseq.checkpoint_utils.save_checkpoint`` (periodic, end-of-epoch and on-notice saves alike).
"""

from __future__ import annotations

import functools
from typing import Any

from hpc_train.worker.heartbeat import Heartbeat


def install(heartbeat: Heartbeat | None) -> bool:
    """Beat inside validate-and-save; False (nothing wrapped) without a heartbeat."""
    if heartbeat is None:
        return False
    # fairseq loads here, not with this module (as everywhere in the rank: once worker.train
    # has set up its filters for fairseq's import-time warnings)
    import fairseq_cli.train as fairseq_train
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    validate = fairseq_train.validate

    @functools.wraps(validate)
    def validating(*args: Any, **kwargs: Any) -> Any:
        heartbeat.validating()  # building the validation iterator: the training allowance too
        return validate(*args, **kwargs)

    valid_step = Trainer.valid_step

    @functools.wraps(valid_step)
    def beating_valid_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = valid_step(self, *args, **kwargs)
        heartbeat.validating()
        return out

    save = checkpoint_utils.save_checkpoint

    @functools.wraps(save)
    def saving(*args: Any, **kwargs: Any) -> Any:
        heartbeat.saving()
        return save(*args, **kwargs)

    fairseq_train.validate = validating
    Trainer.valid_step = beating_valid_step
    checkpoint_utils.save_checkpoint = saving
    return True
