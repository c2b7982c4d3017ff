"""The one schema of ``benchmarks/results/gpu.json`` (issue 36), written by ``make bench-gpu``
(``benchmarks.gpu``) and by the GPU session (``benchmarks.gpu_session``), read by both and by
the docs' tables::

    {"date": "YYYY-MM-DD", "device": {"gpu": ..., "gpu_memory_gib": ..., "driver": ..., ...},
     "peak": {"gpu": ..., "tflops": ..., "source": ...},
     "presets": {PRESET: {"runs": {RUN: RUN_RECORD, ...}, "figures": {...}, ...}, ...},
     "figures": {"toolkit_over_bare": {PRESET: ratio, ...}}, ...}

A run record has at least ``RUN_KEYS`` (null where not measured, e.g. on a CPU rehearsal):
words/s (fairseq's wps, median after the warm-up intervals), MFU, the GPU's busy % over the
training window, peak GPU memory (GiB), the last logged loss, ``exit_s`` ("done training" -> the
process's exit, less the final checkpoint flush) and ``flush_s`` (that flush), and ``status``
(ok, timeout, oom, failed, skipped). ``figures.toolkit_over_bare``: the toolkit's defaults over
bare ``fairseq-train`` with fairseq's own README settings at the same global batch.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

RUN_KEYS = (
    "status", "words_per_s", "mfu", "gpu_util_pct", "peak_mem_gib", "loss_last", "exit_s",
    "flush_s",
)  # fmt: skip


@dataclass(frozen=True)
class Peak:
    gpu: str  # found in torch.cuda.get_device_name()
    tflops: float  # dense bf16 = fp16 tensor-core peak
    source: str


# First match wins: the PCIe and NVL forms before the SXM one.
PEAKS: tuple[Peak, ...] = (
    Peak("H100 PCIe", 756.0, "NVIDIA H100 datasheet, PCIe: 1,513 TFLOPS bf16/fp16 with sparsity"),
    Peak("H100 NVL", 835.5, "NVIDIA H100 datasheet, NVL: 1,671 TFLOPS bf16/fp16 with sparsity"),
    Peak("H100", 989.4, "NVIDIA H100 datasheet, SXM5: 1,979 TFLOPS bf16/fp16 with sparsity"),
    Peak("H200 NVL", 835.5, "NVIDIA H200 datasheet, NVL: 1,671 TFLOPS bf16/fp16 with sparsity"),
    Peak("H200", 989.4, "NVIDIA H200 datasheet, SXM: 1,979 TFLOPS bf16/fp16 with sparsity"),
    Peak("A100", 312.0, "NVIDIA A100 datasheet: 312 TFLOPS bf16/fp16 tensor core, dense"),
    Peak("V100", 125.0, "NVIDIA V100 datasheet, SXM2: 125 TFLOPS fp16 tensor core"),
)


def peak_for(device_name: str) -> Peak | None:
    return next((p for p in PEAKS if p.gpu in device_name), None)


def mfu(params: int, words_per_s: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: 6 FLOPs per parameter per token (forward 2, backward 4)."""
    return 6.0 * params * words_per_s / (peak_tflops * 1e12)


def run_record(status: str, **values: Any) -> dict[str, Any]:
    """A run's record: every ``RUN_KEYS`` key (null unless given), then the rest as given."""
    return {**dict.fromkeys(RUN_KEYS), **values, "status": status}


def document(device: dict[str, Any], peak: Peak | None, **rest: Any) -> dict[str, Any]:
    """A results file's top level (``presets`` and ``figures`` empty until filled)."""
    return {
        "date": device.get("date") or dt.date.today().isoformat(),
        "device": device,
        "peak": peak.__dict__ if peak else None,
        "presets": {},
        "figures": {"toolkit_over_bare": {}},
        **rest,
    }


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` over ``old``: its presets replace (only) the same presets, its figures the same."""
    figures = {**old.get("figures", {}), **new.get("figures", {})}
    ratios = {
        **old.get("figures", {}).get("toolkit_over_bare", {}),
        **new.get("figures", {}).get("toolkit_over_bare", {}),
    }
    return {
        **old,
        **new,
        "presets": {**old.get("presets", {}), **new.get("presets", {})},
        "figures": {**figures, "toolkit_over_bare": ratios},
    }
