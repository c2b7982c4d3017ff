"""Each rank's own compute time per update, for the straggler check (``hpc_train.watch.stragglers``).

In data-parallel training the update time is the same on every rank: the gradient all-reduce
waits for the slowest. So this times what each rank does alone, fairseq's
``FairseqTask.train_step`` (forward and backward of one micro-batch), and adds it to the
heartbeat (``Heartbeat.compute``), which reports the median over recent updates:

- CPU ranks (gloo, ``legacy_ddp``): the gradients are all-reduced after the backward, in the
  optimizer step, so forward + backward is all compute: timed with ``time.perf_counter``.
- GPU ranks (NCCL, c10d DDP): the backward overlaps the all-reduce and its end waits for it, so
  only the forward (the criterion's call) is timed, with CUDA events on the current stream. The
  events are read at a later micro-batch once they have completed (``Event.query``): no extra
  synchronize in the training loop. The forward is a proxy for the rank's speed: a slow GPU (clock
  throttling, a bad HBM stack, a busy neighbour) is slow in the forward too.

A task that overrides ``train_step`` (not the masked-LM task this stack trains) is not timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class ForwardTimed:
    """A criterion whose calls are timed with CUDA events (``pending`` until read)."""

    def __init__(self, criterion: Any, pending: list[tuple[Any, Any]], event: Callable[[], Any]):
        self._criterion, self._pending, self._event = criterion, pending, event

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start, end = self._event(), self._event()
        start.record()
        try:
            return self._criterion(*args, **kwargs)
        finally:
            end.record()
            self._pending.append((start, end))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._criterion, name)


class ComputeTimer:
    """Wraps ``train_step``; hands each micro-batch's compute seconds to ``add``."""

    def __init__(
        self,
        add: Callable[[float], None],
        event: Callable[[], Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.add, self.clock = add, clock
        self.event = event  # a CUDA event factory: GPU ranks time the forward only
        self.pending: list[tuple[Any, Any]] = []

    def collect(self) -> None:
        """Hand over the timings of the forwards that have completed on the GPU."""
        while self.pending and self.pending[0][1].query():
            start, end = self.pending.pop(0)
            self.add(start.elapsed_time(end) / 1000.0)  # milliseconds

    def wrap(self, train_step: Callable[..., Any]) -> Callable[..., Any]:
        def timed(task: Any, sample: Any, model: Any, criterion: Any, *args: Any, **kw: Any) -> Any:
            if self.event is not None and on_gpu(model):
                self.collect()
                criterion = ForwardTimed(criterion, self.pending, self.event)
                return train_step(task, sample, model, criterion, *args, **kw)
            started = self.clock()
            try:
                return train_step(task, sample, model, criterion, *args, **kw)
            finally:
                self.add(self.clock() - started)

        timed.__wrapped__ = train_step  # type: ignore[attr-defined]
        return timed


def on_gpu(model: Any) -> bool:
    try:
        return bool(next(model.parameters()).is_cuda)
    except (StopIteration, AttributeError):
        return False


def cuda_event_factory() -> Callable[[], Any] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return lambda: torch.cuda.Event(enable_timing=True)


def install(add: Callable[[float], None] | None) -> ComputeTimer | None:
    """Time fairseq's ``FairseqTask.train_step`` in this worker, feeding ``add``
    (``Heartbeat.compute``); nothing without a heartbeat."""
    if add is None:
        return None
    from fairseq.tasks import FairseqTask

    timer = ComputeTimer(add, cuda_event_factory())
    original = getattr(FairseqTask.train_step, "__wrapped__", FairseqTask.train_step)
    FairseqTask.train_step = timer.wrap(original)
    return timer
