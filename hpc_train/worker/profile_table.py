"""What a profile window says, per update: time by kind, device idle, host syncs, ops launched
(issue 36). Pure (no profiler): it reads plain records (``Op``), so the classification is tested on its
own.

Kinds, in the order a name is tried (the first match wins):
- ``communication``: NCCL/gloo collectives;
- ``optimizer``: everything under the toolkit's ``hpc:optimizer`` mark (clip, step, the bf16
  wrapper's copies), whatever its name;
- ``attention``: SDPA and its kernels (flash, memory-efficient, math: softmax);
- ``casts/copies``: dtype casts and copies (``copy_``, ``_to_copy``, memcpy);
- ``matmul``: GEMMs (aten's mm family, cuBLAS/CUTLASS kernels);
- ``norm/elementwise``: the rest (LayerNorm, GELU, dropout, adds, embeddings, the loss);
- ``kernels of no op`` (GPU only): kernels the profiler linked to no aten op, named in their own
  line (on an H200, 2026-11-29, a fifth of roberta-large's update, unnamed before: docs/gpu.md);
- ``outside the step``: wall time between updates (the next batch, logging, the hooks).

On a GPU the table also says when the device waited (``Waits``): every gap between kernels, by
length (many short gaps: the host launches too slowly; a few long ones: a sync, the data, Python
between steps), and the longest, each with what the host was running as it began and as it ended.

On a GPU the time is the kernels' (device) time, attributed through the op that launched them,
and "device idle" is the part of the window with no kernel running. On a CPU the time is each
op's own (self) time and "device idle" is the part of the window the main thread spent outside
any op: Python, the data pipeline, waiting. "Ops launched" is kernels on a GPU, top-level ops
(called from Python, not from inside another op) on a CPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from hpc_train.worker import host_reads

KINDS = ("matmul", "attention", "norm/elementwise", "casts/copies", "optimizer", "communication")
OUTSIDE = "outside the step"
UNLINKED = "kernels of no op"
NAMED_UNLINKED = 6  # the table names this many of them, the longest first
NAMED_WAITS = 6  # the device's longest waits the table names
NAMED_OPS = 8  # the ops with the most time the table names, each with its kind
WAIT_BOUNDS_US = (10.0, 100.0, 1000.0)  # the device's waits by length: <10 µs, ..., >= 1 ms
OPTIMIZER_MARK = "hpc:optimizer"
NAME_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("communication", ("nccl", "all_reduce", "allreduce", "gloo", "c10d::", "broadcast")),
    ("attention", ("scaled_dot_product", "flash", "efficient_attention", "fmha", "softmax")),
    ("casts/copies", ("copy", "_to_copy", "memcpy", "memset", "cast")),
    ("matmul", ("mm", "gemm", "matmul", "linear", "cutlass", "xmma", "cublas", "sm90", "sm80")),
)


def kind_of(name: str, marks: Iterable[str] = ()) -> str:
    """An op's or kernel's kind from its name and the toolkit's marks around it."""
    low = name.lower()
    if any(rule in low for rule in NAME_RULES[0][1]):
        return "communication"
    if OPTIMIZER_MARK in marks:
        return "optimizer"
    for kind, needles in NAME_RULES[1:]:
        if any(n in low for n in needles):
            return kind
    return "norm/elementwise"


@dataclass(frozen=True)
class Op:
    """One profiled op: its name, the marks around it, its own time (µs: self time on a CPU,
    its kernels' time on a GPU), whether Python called it directly, and its kernels' count."""

    name: str
    marks: tuple[str, ...]
    self_us: float
    top_level: bool
    kernels: int = 0
    span_us: tuple[float, float] = (0.0, 0.0)  # when it ran (the profiler's clock)


@dataclass(frozen=True)
class Wait:
    """One gap between kernels: its length and the host's innermost op as it began and ended."""

    us: float
    began_in: str
    ended_in: str


@dataclass(frozen=True)
class Waits:
    """The device's gaps between kernels over the window (GPU only)."""

    lengths_us: tuple[float, ...] = ()
    longest: tuple[Wait, ...] = ()

    def by_length_ms(self, n: int) -> dict[str, float]:
        """Per update: the gaps' time in each ``WAIT_BOUNDS_US`` bucket."""
        edges = (0.0, *WAIT_BOUNDS_US, float("inf"))
        out = {}
        for low, high in pairwise(edges):
            name = f"{low:g}-{high:g} us"
            if low == 0:
                name = f"<{high:g} us"
            elif high == edges[-1]:
                name = f">={low:g} us"
            out[name] = round(sum(g for g in self.lengths_us if low <= g < high) / 1000 / n, 2)
        return out

    def to_json(self, n: int) -> dict[str, object]:
        return {
            "count": len(self.lengths_us) / n,
            "ms": round(sum(self.lengths_us) / 1000 / n, 2),
            "ms_by_length": self.by_length_ms(n),
            "longest": [
                {
                    "ms": round(w.us / 1000, 3),
                    "host_as_it_began": w.began_in,
                    "host_as_it_ended": w.ended_in,
                }
                for w in self.longest
            ],
        }


@dataclass
class ProfileWindow:
    updates: int
    warmup: int
    wall_s: float
    outside_s: float  # between updates
    busy_s: float  # device busy (GPU: kernels running; CPU: the main thread inside an op)
    device: str  # "cuda" or "cpu"
    ops: list[Op] = field(default_factory=list)
    sync_sites: dict[str, int] = field(default_factory=dict)
    cuda_syncs: int | None = None  # torch's sync debug mode (GPU only)
    unlinked: dict[str, float] = field(default_factory=dict)  # kernel name -> µs, no op's (GPU)
    waits: Waits = field(default_factory=Waits)  # the device's gaps between kernels (GPU)

    def per_update(self) -> dict[str, object]:
        n = max(self.updates, 1)
        ms = dict.fromkeys((*KINDS, OUTSIDE), 0.0)
        for op in self.ops:
            ms[kind_of(op.name, op.marks)] += op.self_us / 1000 / n
        if self.device == "cuda":
            ms[UNLINKED] = sum(self.unlinked.values()) / 1000 / n
        ms[OUTSIDE] = self.outside_s * 1000 / n
        launched = sum(op.kernels for op in self.ops) if self.device == "cuda" else None
        top = sum(1 for op in self.ops if op.top_level)
        return {
            "wall_ms": round(self.wall_s * 1000 / n, 2),
            "ms_by_kind": {k: round(v, 2) for k, v in ms.items()},
            "device_idle_pct": round(100 * max(0.0, 1 - self.busy_s / self.wall_s), 1)
            if self.wall_s > 0
            else None,
            "host_syncs": sum(self.sync_sites.values()) / n,
            # a CPU rank's count less the reads only a CPU rank makes (host_reads.CPU_ONLY_SITES)
            "host_syncs_gpu_path": (
                host_reads.gpu_path(self.sync_sites)
                if self.device == "cpu"
                else sum(self.sync_sites.values())
            )
            / n,
            "cuda_syncs": None if self.cuda_syncs is None else self.cuda_syncs / n,
            "ops_launched": (launched if launched is not None else top) / n,
            "top_level_ops": top / n,
        }

    def longest_ops(self) -> list[tuple[str, str, float]]:
        """Per update: the ``NAMED_OPS`` op names with the most time, each with its kind (where
        an attention without its fused kernel shows: its matmuls and softmax by name)."""
        by: dict[tuple[str, str], float] = {}
        for op in self.ops:
            key = (op.name, kind_of(op.name, op.marks))
            by[key] = by.get(key, 0.0) + op.self_us
        n = max(self.updates, 1)
        top = sorted(by.items(), key=lambda kv: -kv[1])[:NAMED_OPS]
        return [(name, kind, us / 1000 / n) for (name, kind), us in top]

    def to_json(self) -> dict[str, object]:
        return {
            "device": self.device,
            "longest_ops_ms": [
                {"op": name, "kind": kind, "ms": round(ms, 3)}
                for name, kind, ms in self.longest_ops()
            ],
            "warmup_updates": self.warmup,
            "updates": self.updates,
            "per_update": self.per_update(),
            "host_sync_sites": {
                site: count / max(self.updates, 1)
                for site, count in sorted(self.sync_sites.items())
            },
            "unlinked_kernels_ms": {
                name: round(us / 1000 / max(self.updates, 1), 3)
                for name, us in sorted(self.unlinked.items(), key=lambda kv: -kv[1])
            },
            "device_waits": (
                self.waits.to_json(max(self.updates, 1)) if self.device == "cuda" else None
            ),
        }


def table(window: ProfileWindow) -> list[str]:
    """The profile as lines a person reads (train.log, docs/gpu.md)."""
    p = window.per_update()
    kinds: dict[str, float] = p["ms_by_kind"]  # type: ignore[assignment]
    total = sum(kinds.values()) or 1.0
    first = window.warmup + 1
    lines = [
        f"profile of updates {first}-{first + window.updates - 1} on {window.device} "
        f"({window.updates} after {window.warmup} of warm-up), per update:",
        f"  wall {p['wall_ms']} ms | device idle {p['device_idle_pct']} % | host syncs "
        f"{p['host_syncs']:g}{_gpu_path(p)}{_cuda(p)} | ops launched {p['ops_launched']:,.0f}",
        f"  {'kind':<18}{'ms':>10}{'share':>8}",
    ]
    lines += [f"  {k:<18}{v:>10.2f}{v / total:>8.0%}" for k, v in kinds.items()]
    sites = sorted(window.sync_sites.items(), key=lambda kv: -kv[1])
    n = max(window.updates, 1)
    lines.append(
        "  host syncs by site: " + (", ".join(f"{s} {c / n:g}" for s, c in sites) or "none")
    )
    if window.unlinked:
        named = sorted(window.unlinked.items(), key=lambda kv: -kv[1])[:NAMED_UNLINKED]
        lines.append(
            f"  {UNLINKED}, the longest: "
            + ", ".join(f"{name[:80]} {us / 1000 / n:.2f} ms" for name, us in named)
        )
    lines.append(
        "  ops with the most time: "
        + ", ".join(f"{name} {kind} {ms:.2f} ms" for name, kind, ms in window.longest_ops())
    )
    if window.device == "cuda":
        lines += _waits(window.waits, n)
    return lines


def _waits(waits: Waits, n: int) -> list[str]:
    buckets = ", ".join(f"{k} {v:.2f} ms" for k, v in waits.by_length_ms(n).items())
    lines = [
        f"  device waits: {len(waits.lengths_us) / n:,.0f} per update, "
        f"{sum(waits.lengths_us) / 1000 / n:.2f} ms: {buckets}"
    ]
    if waits.longest:
        lines.append(
            "  device waits, the longest (host as it began -> as it ended): "
            + ", ".join(
                f"{w.us / 1000:.2f} ms ({w.began_in} -> {w.ended_in})" for w in waits.longest
            )
        )
    return lines


def _gpu_path(p: dict[str, Any]) -> str:
    same = p["host_syncs_gpu_path"] == p["host_syncs"]
    return "" if same else f" ({p['host_syncs_gpu_path']:g} on a GPU's path)"


def _cuda(p: dict[str, object]) -> str:
    return "" if p["cuda_syncs"] is None else f" (torch's sync debug mode: {p['cuda_syncs']:g})"


def merged(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """(start, end) intervals merged where they overlap or touch, in order."""
    out: list[tuple[float, float]] = []
    for start, stop in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def union_s(intervals: Sequence[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals, in their unit."""
    return sum(stop - start for start, stop in merged(intervals))


def gaps(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (start, end) gaps between the intervals' union, first to last."""
    spans = merged(intervals)
    return [(a[1], b[0]) for a, b in pairwise(spans)]
