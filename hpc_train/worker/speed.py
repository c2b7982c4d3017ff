"""The speed levers in the rank (issues 29 and 36; chosen in ``hpc_train.job.levers``).

The launcher passes the levers that are on as one argument (``levers.WORKER_FLAG``), which the
rank takes off before fairseq parses the rest. The rank checks them again against the GPU it
actually has (a lever its device cannot run is dropped, and said so), then:
- ``compile``: the training forward of every encoder layer of the model fairseq builds is
  compiled (Inductor; parameter names and checkpoints unchanged); in eval mode (validation) the
  layer runs eagerly, so validation never triggers a recompile (Dynamo guards on ``training``);
- ``flash`` off: SDPA's FlashAttention backend disabled for the process (memory-efficient, then
  math), as on a V100;
- ``gelu``: the model's GELUs (every layer's FFN, the LM head) in the compute dtype;
- ``pad-check``, ``host-sizes``: ``hpc_train.worker.batch_facts``;
- ``foreach-grads``: ``hpc_train.worker.grads_foreach``; ``lazy-stats``: ``.lazy_stats``;
- ``fused-adamw`` and ``pack``: carried by fairseq's arguments already (``job.command_lines``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from hpc_train.job import levers
from hpc_train.job.levers import LeverName
from hpc_train.worker import batch_facts, grads_foreach, lazy_stats

logger = logging.getLogger("hpc_train.worker.speed")

# fairseq 0.12's encoder layer (RoBERTa's TransformerEncoder holds these).
LAYER_CLASSES = ("TransformerEncoderLayerBase", "TransformerEncoderLayer")


def split_args(args: Sequence[str]) -> tuple[list[str], frozenset[LeverName] | None]:
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


def runnable(asked: frozenset[LeverName], cc: levers.CC | None, cpu: bool) -> frozenset[LeverName]:
    """The asked levers this device runs; the others are logged and dropped."""
    here = None if cpu else cc
    kept = frozenset(n for n in asked if levers.BY_NAME[n].runs_on(here))
    for name in sorted(asked - kept):
        logger.warning(f"speed lever {name}: {levers.where(here)} cannot run it; off")
    return kept


COMPILE_BACKEND = "inductor"  # the tests swap in Dynamo's "eager" backend: the guards alone


def compile_layers(model: Any) -> int:
    """Compile each encoder layer's training forward in place; returns how many. Eval mode
    (validation) runs the layer eagerly: no second graph, no recompile at validation."""
    import torch

    layers = [m for m in model.modules() if type(m).__name__ in LAYER_CLASSES]
    for layer in layers:
        # batches vary in length: one dynamic graph (one more for a batch with padding)
        compiled = torch.compile(layer.forward, dynamic=True, backend=COMPILE_BACKEND)
        layer.forward = functools.partial(_by_mode, layer, compiled, layer.forward)
    return len(layers)


def _by_mode(layer: Any, compiled: Any, eager: Any, *args: Any, **kwargs: Any) -> Any:
    return (compiled if layer.training else eager)(*args, **kwargs)


def native_gelu(model: Any) -> int:
    """Every module of ``model`` whose activation is fairseq's fp32-round-trip GELU gets
    ``F.gelu`` (the compute dtype, no casts); returns how many."""
    import torch
    from fairseq.modules.gelu import gelu

    changed = [m for m in model.modules() if getattr(m, "activation_fn", None) is gelu]
    for module in changed:
        module.activation_fn = torch.nn.functional.gelu
    return len(changed)


def install(asked: frozenset[LeverName] | None, cpu: bool) -> frozenset[LeverName]:
    """Apply the levers (``split_args``'s) to this process and to the model fairseq will build;
    returns those in effect."""
    if asked is None:
        return frozenset()
    on = runnable(asked, None if cpu else device_cc(), cpu)
    if not cpu and LeverName.FLASH not in on:
        import torch

        torch.backends.cuda.enable_flash_sdp(False)
    batch_facts.install(pad_check=LeverName.PAD_CHECK in on, host_sizes=LeverName.HOST_SIZES in on)
    if LeverName.FOREACH_GRADS in on:
        grads_foreach.install()
    if LeverName.LAZY_STATS in on:
        lazy_stats.install()
    _on_built_models(
        [("GELU in the compute dtype", native_gelu)] * (LeverName.GELU in on)
        + [("torch.compile", compile_layers)] * (LeverName.COMPILE in on)
    )
    logger.info(f"speed levers on: {', '.join(sorted(on)) or 'none'}")
    return on


def _on_built_models(changes: list[tuple[str, Callable[[Any], int]]]) -> None:
    """Wrap fairseq's task ``build_model`` so each change is made to the model it returns."""
    from fairseq.tasks import FairseqTask

    original = getattr(FairseqTask.build_model, "hpc_original", FairseqTask.build_model)
    if not changes:
        return

    def build_model(self, cfg, from_checkpoint=False):
        model = original(self, cfg, from_checkpoint)
        for what, change in changes:
            logger.info(f"{what}: {change(model)} module(s)")
        return model

    build_model.hpc_original = original  # type: ignore[attr-defined]
    FairseqTask.build_model = build_model
