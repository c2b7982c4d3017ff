"""Batch per GPU and precision, per preset and instance type. Pure: no torch, no fairseq.

The global batch (sequences per update) is the training recipe and never changes. The batch per
GPU only says how many of those sequences one GPU takes at a time, which is a matter of its
memory; ``--update-freq`` makes up the rest (``hpc_train.job.batch.keep_global_batch``), so the loss curve is the
same in expectation on every instance type.

How the numbers were found (``BATCH_TABLE``, one row per preset and instance type):
- **measured** on one H100 80GB HBM3 (2026-11-22, ``python -m benchmarks.gpu probe``, results in
  ``benchmarks/results/gpu-probe.json``): real fairseq training steps (bf16, ``fused_adamw``,
  512-token sequences) at 4 batch sizes; the memory the CUDA allocator reserved, fitted to
  ``fixed + per_sequence x batch`` (``MEMORY``), and the words/s at each size. The chosen batch
  is the fastest one (within 3 %: the smallest such) whose memory fits ``1 - HEADROOM`` of the
  GPU: roberta-base 256 (54 GiB; words/s still rising at 256), roberta-large 64 (39 GiB; 128
  ran at 72 GiB, past the headroom). Real training (benchmarks/results/gpu.json) reserved more
  than these synthetic steps: 61 GiB for roberta-base at 256 in bf16, 77 GiB in fp16;
- **derived** for the other GPUs from that memory line: the largest power of two whose
  predicted memory stays within ``1 - HEADROOM`` of the GPU's, and never above the H100's
  choice (a slower GPU saturates at a smaller batch, not a larger one). Not measured on those
  GPUs. fp16 (V100) keeps the same bytes per value as bf16, so the same line applies; V100's
  attention kernels differ from H100's, which the headroom has to absorb.

Precision: bf16 where the GPU has bf16 tensor cores (A100, H100: no loss scaling, fp32's
range), fp16 on V100 (no bf16 units). Both are overridable (``--precision``, ``--batch-per-device``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hpc_core.instances import INSTANCE_TYPES

PRECISIONS = ("bf16", "fp16", "fp32")
PRECISION_BY_GPU = {"V100": "fp16", "A100": "bf16", "H100": "bf16"}
FALLBACK_PRECISION = "fp16"  # a GPU this table does not know: fp16 runs on every CUDA GPU
NO_BF16 = frozenset({"V100"})  # no bf16 arithmetic units: bf16 would be emulated, slowly

# fairseq's data loader processes per GPU rank. One (fairseq's default) made about 1,000
# masked-LM sequences/s on a core of the development machine: about what one H100 trains at
# 256 sequences per batch (~430k words/s), so the GPU waited on it.
# Every instance type has >= 6 cores per GPU. torch's own exit would join each loader process
# with a 5 s timeout (42 s with 4, benchmarks/results/gpu.json exit_s): the rank stops them
# itself after its last save (hpc_train.worker.loaders).
LOADER_WORKERS = 4

# Kept free of the GPU's memory: the allocator's fragmentation, the CUDA context, NCCL's buffers
# and DDP's gradient buckets (2 bytes per parameter), none of which a one-GPU probe sees in full.
HEADROOM = 0.15
MAX_BATCH = 4096  # sequences per GPU; far beyond any GPU's memory at 512 tokens
MEASURED_ON = "H100 80GB HBM3 (p5.48xlarge's GPU), 2026-11-22"


@dataclass(frozen=True)
class MemoryLine:
    """Peak GPU memory of a training step, in GiB: ``fixed + per_sequence x batch``."""

    fixed_gib: float  # weights, fp32 master copy, gradients, Adam's two moments, workspace
    per_sequence_gib: float  # activations of one 512-token sequence

    def peak_gib(self, batch: int) -> float:
        return self.fixed_gib + self.per_sequence_gib * batch


def fit_line(points: Sequence[tuple[int, float]]) -> MemoryLine:
    """Least-squares line through (batch, peak GiB) points; ValueError with fewer than two sizes."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("a memory line needs peaks at two batch sizes or more")
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_m = sum(m for _, m in points) / n
    slope = sum((b - mean_b) * (m - mean_m) for b, m in points) / sum(
        (b - mean_b) ** 2 for b, _ in points
    )
    return MemoryLine(round(mean_m - slope * mean_b, 3), round(slope, 4))


def largest_fitting(line: MemoryLine, gpu_gib: float, headroom: float = HEADROOM) -> int:
    """The largest power-of-two batch whose predicted peak fits ``(1 - headroom) x gpu_gib``;
    0 when not even one sequence fits."""
    budget = gpu_gib * (1.0 - headroom)
    batch = 0
    while batch < MAX_BATCH and line.peak_gib(max(1, batch * 2)) <= budget:
        batch = max(1, batch * 2)
    return batch


def chosen_batch(
    words_per_s: dict[int, float], line: MemoryLine, gpu_gib: float, within: float = 0.03
) -> int:
    """Among the measured batches that fit the GPU with headroom, the smallest whose words/s is
    within ``within`` of the fastest of them."""
    fits = {b: w for b, w in words_per_s.items() if b <= largest_fitting(line, gpu_gib)}
    if not fits:
        raise ValueError("no measured batch size fits")
    best = max(fits.values())
    return min(b for b, wps in fits.items() if wps >= (1.0 - within) * best)


def derived_batch(line: MemoryLine, gpu_gib: float, measured: int) -> int:
    """A GPU not measured here: what fits its memory, capped at the measured GPU's choice."""
    return min(largest_fitting(line, gpu_gib), measured)


@dataclass(frozen=True)
class BatchRow:
    preset: str
    instance_type: str
    batch: int  # sequences per GPU
    how: str


# Measured on the H100 (benchmarks/results/gpu-probe.json, reserved GiB at each batch size):
#   roberta-base  32: 8.28  64: 14.84  128: 28.22  256: 54.25  -> 237k 311k 375k 433k words/s
#   roberta-large 16: 13.70 32: 21.96   64: 38.71  128: 71.71  ->  73k 105k 129k 145k words/s
MEMORY: dict[str, MemoryLine] = {
    "roberta-base": MemoryLine(fixed_gib=1.761, per_sequence_gib=0.2053),
    "roberta-large": MemoryLine(fixed_gib=5.432, per_sequence_gib=0.5181),
}
MEASURED_BATCH: dict[str, int] = {"roberta-base": 256, "roberta-large": 64}

_DERIVED = f"derived from the H100 memory line, {HEADROOM:.0%} headroom; not measured"
# The GPU session on an H200 (2026-11-29, benchmarks/results/gpu-session-h200-20261129-*.json):
H200_LARGE = (
    "; on an H200 (2026-11-29) 128 per GPU ran at 188k words/s and 58 GiB, 64 at 192k and 32 GiB"
)
P3DN_ESTIMATE = (
    "; estimated on an H200 under p3dn's limits (fp16, no flash, the allocator capped at 32 GiB, "
    "2026-11-29): 32 fits, 22 GiB at its peak, no out-of-memory; an H200 runs neither V100's "
    "kernels nor its fp16 memory use"
)
# fmt: off
BATCH_TABLE: tuple[BatchRow, ...] = (
    BatchRow("roberta-base",  "p5.48xlarge",   256, f"measured: {MEASURED_ON}"),
    BatchRow("roberta-base",  "p4de.24xlarge", 256, _DERIVED),
    BatchRow("roberta-base",  "p4d.24xlarge",  128, _DERIVED),
    BatchRow("roberta-base",  "p3dn.24xlarge", 64,  _DERIVED),
    BatchRow("roberta-large", "p5.48xlarge",   64,  f"measured: {MEASURED_ON}{H200_LARGE}"),
    BatchRow("roberta-large", "p4de.24xlarge", 64,  _DERIVED),
    BatchRow("roberta-large", "p4d.24xlarge",  32,  _DERIVED),
    BatchRow("roberta-large", "p3dn.24xlarge", 32,  _DERIVED + P3DN_ESTIMATE),
)
# fmt: on


def table_row(preset: str, instance_type: str) -> BatchRow | None:
    return next(
        (r for r in BATCH_TABLE if r.preset == preset and r.instance_type == instance_type), None
    )


def batch_per_device(
    preset: str,
    instance_type: str | None,
    default: int,
    global_batch: int,
    world_size: int,
    override: int | None = None,
) -> int:
    """Sequences per GPU (or CPU rank) for one start.

    ``override`` (``--batch-per-device``) wins. Otherwise the table's row for a GPU instance
    type, a memory limit: in a world so large that one step of it would exceed the global batch,
    fewer per GPU rather than a refusal. Without a row (CPU ranks, unknown GPUs) the preset's
    ``default``, as it is.
    """
    if override is not None:
        return override
    row = table_row(preset, instance_type) if instance_type else None
    if row is None:
        return default
    return fitted_batch(row.batch, global_batch, world_size)


def fitted_batch(most: int, global_batch: int, world_size: int) -> int:
    """Sequences per device, at most ``most``, whose steps come closest above ``global_batch``
    without one step of the world exceeding it: ``update_freq`` F is the fewest steps that fit,
    then the batch the smallest that fills F steps. (2048 over 24 GPUs, at most 256: 43 x 24 x 2 =
    2064 per update, not 85 x 24 x 2 = 4080.)"""
    if world_size > global_batch:
        return 1  # one sequence per device is already too many: batch.keep_global_batch refuses it by name
    steps = max(1, math.ceil(global_batch / (most * world_size)))
    while True:
        batch = math.ceil(global_batch / (steps * world_size))
        if batch <= most and batch * world_size <= global_batch:
            return batch
        steps += 1


def precision(instance_type: str | None, override: str | None = None) -> str:
    """bf16 / fp16 / fp32 for GPU ranks on ``instance_type``; ``override`` wins."""
    if override is not None:
        return override
    itype = INSTANCE_TYPES.get(instance_type or "")
    return (
        PRECISION_BY_GPU.get(itype.gpu_model, FALLBACK_PRECISION) if itype else FALLBACK_PRECISION
    )


def precision_problem(instance_type: str | None, chosen: str) -> str | None:
    """Why ``chosen`` cannot run on ``instance_type`` (one line), or None."""
    if chosen not in PRECISIONS:
        return f"--precision {chosen}: choose from {', '.join(PRECISIONS)}"
    itype = INSTANCE_TYPES.get(instance_type or "")
    if chosen == "bf16" and itype is not None and itype.gpu_model in NO_BF16:
        return (
            f"--precision bf16: the {itype.gpu_model} of {itype.name} has no bf16 units; use fp16"
        )
    return None


def precision_flags(chosen: str) -> list[str]:
    """fairseq's flag for a precision: ``--bf16``, ``--fp16``, or none for fp32."""
    return [] if chosen == "fp32" else [f"--{chosen}"]
