"""Lever ``lazy-stats`` (issue 36): the per-update statistics nobody reads stay on the device.

Every update fairseq 0.12's ``Trainer._reduce_and_log_stats`` builds the return value of
``train_step`` (its "legacy interface") from that update's own meters with
``get_smoothed_values()``, which rounds each on the host (``safe_round`` -> ``.item()``): the
loss and its perplexity, two host syncs per update. fairseq's training loop only checks that
value against None (``fairseq_cli/train.py``: "not OOM, overflow, ..."); the figures it logs
come from the ``train_inner`` and ``train`` aggregates, which are smoothed only at each log
interval and are untouched here.

While ``_reduce_and_log_stats`` runs, ``MetersDict.get_smoothed_values`` returns each meter's
value unread (a device tensor or a number; a derived meter such as the perplexity is left out,
as fairseq deletes it from that dict anyway). Every other caller of ``get_smoothed_values``
(logging, validation's aggregates, checkpoints' meters) gets fairseq's own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

_inside = threading.local()


def unread_values(meters: Any) -> OrderedDict[str, Any]:
    """What ``get_smoothed_values`` names, each meter's raw value (not rounded, not read)."""
    out: OrderedDict[str, Any] = OrderedDict()
    for key, meter in meters.items():
        if key.startswith("_") or not hasattr(meter, "avg"):
            continue
        count = getattr(meter, "count", None)
        if isinstance(count, (int, float)) or count is None:
            out[key] = meter.avg  # AverageMeter with a host count, or a time meter: no read
        else:
            out[key] = meter.sum / count  # a device count: divided, never compared on the host
    return out


def install() -> None:
    from fairseq.logging.meters import MetersDict
    from fairseq.trainer import Trainer

    if getattr(Trainer._reduce_and_log_stats, "hpc_lazy", False):
        return
    reduce, smoothed = Trainer._reduce_and_log_stats, MetersDict.get_smoothed_values

    def _reduce_and_log_stats(self: Any, *args: Any, **kwargs: Any) -> Any:
        _inside.on = True
        try:
            return reduce(self, *args, **kwargs)
        finally:
            _inside.on = False

    def get_smoothed_values(self: Any) -> Any:
        return unread_values(self) if getattr(_inside, "on", False) else smoothed(self)

    _reduce_and_log_stats.hpc_lazy = True  # type: ignore[attr-defined]
    Trainer._reduce_and_log_stats = _reduce_and_log_stats
    MetersDict.get_smoothed_values = get_smoothed_values
