"""The speed levers in the rank (issue 29; chosen in ``hpc_train.job.levers``).

The launcher passes the levers that are on as one argument (``levers.WORKER_FLAG``), which the
rank takes off before fairseq parses the rest. The rank checks them again against the GPU it
actually has (a lever its device cannot run is dropped, and said so), then:
- ``compile``: every encoder layer of the model fairseq builds is compiled in place
  (``nn.Module.compile``: Inductor; parameter names and checkpoints unchanged);
- ``flash`` off: SDPA's FlashAttention backend disabled for the process (memory-efficient, then
  math), as on a V100;
- ``fused-adamw``: carried by the optimizer argument already (``job.command_lines``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from hpc_train.job import levers

logger = logging.getLogger("hpc_train.worker.speed")

# fairseq 0.12's encoder layer (RoBERTa's TransformerEncoder holds these).
LAYER_CLASSES = ("TransformerEncoderLayerBase", "TransformerEncoderLayer")


def split_args(args: Sequence[str]) -> tuple[list[str], frozenset[str] | None]:
    """(fairseq's arguments, the levers asked for). None: no ``WORKER_FLAG`` (a rank started by
    hand): fairseq's own path, nothing changed."""
    rest, asked = [], None
    items = iter(args)
    for arg in items:
        if arg == levers.WORKER_FLAG:
            asked = levers.parse_worker_value(next(items, ""))
        else:
            rest.append(arg)
    return rest, asked


def device_cc() -> levers.CC | None:
    """This rank's GPU compute capability; None on a CPU rank."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.current_device() < 0:
        return None
    major, minor = torch.cuda.get_device_capability()
    return (major, minor)


def runnable(asked: frozenset[str], cc: levers.CC | None, cpu: bool) -> frozenset[str]:
    """The asked levers this device runs; the others are logged and dropped."""
    here = None if cpu else cc
    kept = frozenset(n for n in asked if levers.BY_NAME[n].runs_on(here))
    for name in sorted(asked - kept):
        logger.warning(f"speed lever {name}: {levers.where(here)} cannot run it; off")
    return kept


def compile_layers(model: Any) -> int:
    """Compile each encoder layer of ``model`` in place; returns how many."""
    layers = [m for m in model.modules() if type(m).__name__ in LAYER_CLASSES]
    for layer in layers:
        layer.compile(dynamic=True)  # batches vary in length: one dynamic graph, no recompile
    return len(layers)


def install(asked: frozenset[str] | None, cpu: bool) -> frozenset[str]:
    """Apply the levers (``split_args``'s) to this process and to the model fairseq will build;
    returns those in effect."""
    if asked is None:
        return frozenset()
    on = runnable(asked, None if cpu else device_cc(), cpu)
    if not cpu and "flash" not in on:
        import torch

        torch.backends.cuda.enable_flash_sdp(False)
    if "compile" in on:
        _compile_built_models()
    logger.info(f"speed levers on: {', '.join(sorted(on)) or 'none'}")
    return on


def _compile_built_models() -> None:
    """Wrap fairseq's task ``build_model`` so the model it returns has its layers compiled."""
    from fairseq.tasks import FairseqTask

    original = FairseqTask.build_model
    if getattr(original, "hpc_compiles", False):
        return

    def build_model(self, cfg, from_checkpoint=False):
        model = original(self, cfg, from_checkpoint)
        logger.info(f"torch.compile: {compile_layers(model)} encoder layer(s)")
        return model

    build_model.hpc_compiles = True  # type: ignore[attr-defined]
    FairseqTask.build_model = build_model
