"""The profile mode (issue 36): torch.profiler over a few updates after a warm-up, on rank 0.

``HPC_TRAIN_PROFILE=W:N`` (``contract.WorkerEnv.profile``) profiles updates W+1..W+N: every op
and (on a GPU) every kernel, the toolkit's host-read counter (``host_reads``) and, on a GPU,
torch's own sync debug mode. When the window closes, rank 0 logs the table
(``profile_table.table``) to train.log and writes it as JSON to the run directory
(``RunDir.profile``); training goes on. The same code runs on a CPU rank, where the "kernels"
are CPU ops (see ``profile_table``). The optimizer's part is marked (``hpc:optimizer``) around
fairseq's clip and step, so its ops count there whatever their names.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from hpc_core.rundir import RunDir, atomic_write
from hpc_train.worker import host_reads, profile_table

logger = logging.getLogger("hpc_train.worker.profile")
OPS = ("aten::", "c10d::", "nccl:", "gloo:", "record_param_comms")


def ops_of(events: Any, gpu: bool) -> list[profile_table.Op]:
    """Every op of a profiler's ``events()`` as ``profile_table.Op`` (marks: the toolkit's
    ``hpc:`` annotations around it; top level: no op around it)."""
    out = []
    for e in events:
        if not e.name.startswith(OPS) or e.device_type != torch.autograd.DeviceType.CPU:
            continue
        marks, top, parent = [], True, e.cpu_parent
        while parent is not None:
            if parent.name.startswith("hpc:"):
                marks.append(parent.name)
            elif parent.name.startswith(OPS):
                top = False
            parent = parent.cpu_parent
        kernels = list(getattr(e, "kernels", []) or [])
        us = sum(k.duration for k in kernels) if gpu else e.self_cpu_time_total
        span = (float(e.time_range.start), float(e.time_range.end))
        out.append(profile_table.Op(e.name, tuple(marks), float(us), top, len(kernels), span))
    return out


def device_kernels(events: Any) -> list[Any]:
    """The device's kernels (and copies): its events less the ranges the profiler also draws on
    the device's timeline (``gpu_user_annotation``: train_step-N, forward, hpc:optimizer). On the
    H200 (2026-11-29) those ranges, taken for kernels, covered the device's gaps (idle 0.8 %
    logged) and filled the row of kernels of no op. A range is known by torch's flag and, where a
    torch has none, by its name: the name of a host event that is no op."""
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    ranges = {e.name for e in events if e.device_type == cpu and not e.name.startswith(OPS)}
    return [
        e
        for e in events
        if e.device_type == cuda
        and not getattr(e, "is_user_annotation", False)
        and e.name not in ranges
    ]


def unlinked_kernels(events: Any, gpu: bool) -> dict[str, float]:
    """The kernels no row of the table holds (name -> µs): the device's kernels less those the
    profiler linked to an op ``ops_of`` keeps (aten, c10d, ...; matched by name and duration).
    A kernel linked to another CPU event (a record_function range, a runtime call) is here too."""
    if not gpu:
        return {}
    claimed = Counter(
        (k.name, k.duration)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith(OPS)
        for k in getattr(e, "kernels", []) or []
    )
    out: dict[str, float] = {}
    for e in device_kernels(events):
        key = (e.name, e.time_range.end - e.time_range.start)
        if claimed[key] > 0:
            claimed[key] -= 1
        else:
            out[e.name] = out.get(e.name, 0.0) + float(key[1])
    return out


def device_waits(events: Any) -> profile_table.Waits:
    """The gaps between the device's kernels; the longest with the host's innermost op (else
    range) as each began and as it ended: a sync shows where it began, a slow launch where it
    ended."""
    spans = [(float(k.time_range.start), float(k.time_range.end)) for k in device_kernels(events)]
    found = profile_table.gaps(spans)
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    longest = sorted(found, key=lambda g: g[0] - g[1])[: profile_table.NAMED_WAITS]
    return profile_table.Waits(
        tuple(end - start for start, end in found),
        tuple(
            profile_table.Wait(end - start, host_at(host, start), host_at(host, end))
            for start, end in longest
        ),
    )


def host_at(host: list[Any], t: float) -> str:
    """The innermost op running on the host at ``t`` (else the innermost range, not a runtime
    call: cudaLaunchKernel, cudaStreamSynchronize, ...)."""
    around = [e for e in host if e.time_range.start <= t <= e.time_range.end]
    for pick in (
        [e for e in around if e.name.startswith(OPS)],
        [e for e in around if not e.name.startswith("cuda")],
    ):
        if pick:
            return min(pick, key=lambda e: e.time_range.end - e.time_range.start).name
    return "no host event"


def busy_s(events: Any, ops: list[profile_table.Op], gpu: bool) -> float:
    """Device busy time: kernels' union on a GPU (their sum where the profiler gives no device
    events), the main thread's top-level ops on a CPU."""
    if gpu:
        device = [(e.time_range.start, e.time_range.end) for e in device_kernels(events)]
        if device:
            return profile_table.union_s(device) / 1e6
        return sum(op.self_us for op in ops) / 1e6
    return profile_table.union_s([op.span_us for op in ops if op.top_level]) / 1e6


class WindowProfiler:
    """Counts updates; profiles ``count`` of them after ``warmup``; then ``finish(window)``."""

    def __init__(
        self, warmup: int, count: int, finish: Callable[[profile_table.ProfileWindow], None]
    ):
        self.warmup, self.count, self.finish = warmup, count, finish
        self.gpu = False  # decided as the window opens: the rank binds its GPU after install
        self.seen = 0
        self.outside = 0.0
        self.last_end: float | None = None
        self.began = 0.0
        self.prof: Any = None
        self.counter = host_reads.Counter()
        self.caught: Any = None

    def around(self, step: Callable[[], Any]) -> Any:
        """Run one update's ``step`` inside the window's bookkeeping."""
        now = time.perf_counter()
        if self.prof is not None and self.last_end is not None:
            self.outside += now - self.last_end
        try:
            return step()
        finally:
            self.seen += 1
            self.last_end = time.perf_counter()
            if self.seen == self.warmup:
                self._open()
            elif self.seen == self.warmup + self.count and self.prof is not None:
                self._close()

    def _open(self) -> None:
        self.gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.counter.gpu_only = self.gpu
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.gpu:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            self.caught = warnings.catch_warnings(record=True)
            self._warnings = self.caught.__enter__()
            warnings.simplefilter("always")
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.__enter__()
        self.counter.__enter__()
        self.began = self.last_end = time.perf_counter()

    def _close(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - self.began
        self.counter.__exit__(None, None, None)
        self.prof.__exit__(None, None, None)
        cuda_syncs = None
        if self.caught is not None:
            torch.cuda.set_sync_debug_mode(0)
            cuda_syncs = sum("synchroniz" in str(w.message) for w in self._warnings)
            self.caught.__exit__(None, None, None)
        events = self.prof.events()
        ops = ops_of(events, self.gpu)
        window = profile_table.ProfileWindow(
            self.count, self.warmup, wall, self.outside, busy_s(events, ops, self.gpu),
            "cuda" if self.gpu else "cpu", ops, dict(self.counter.sites), cuda_syncs,
            unlinked_kernels(events, self.gpu),
            device_waits(events) if self.gpu else profile_table.Waits(),
        )  # fmt: skip
        self.prof = None
        self.finish(window)


def report(run: RunDir) -> Callable[[profile_table.ProfileWindow], None]:
    """Log the table and write ``RunDir.profile`` (rank 0)."""

    def finish(window: profile_table.ProfileWindow) -> None:
        for line in profile_table.table(window):
            logger.info(line)
        atomic_write(run.profile, json.dumps(window.to_json(), indent=1) + "\n")

    return finish


def install(run: RunDir, rank: int, window: tuple[int, int] | None) -> None:
    """Profile rank 0's updates ``window`` = (warm-up, count); nothing when None."""
    if window is None or rank != 0:
        return
    from fairseq.tasks import FairseqTask
    from fairseq.trainer import Trainer

    profiler = WindowProfiler(*window, report(run))
    step, clip, optimizer_step = (
        Trainer.train_step,
        Trainer.clip_grad_norm,
        FairseqTask.optimizer_step,
    )

    def train_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        return profiler.around(lambda: step(self, *args, **kwargs))

    def marked(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with torch.profiler.record_function(profile_table.OPTIMIZER_MARK):
                return fn(*args, **kwargs)

        return call

    Trainer.train_step = train_step
    Trainer.clip_grad_norm = marked(clip)
    FairseqTask.optimizer_step = marked(optimizer_step)
