"""Each rank's own compute time: timed around fairseq's train_step, into the heartbeat.

The fast tests use fakes where the real thing cannot exist here: a fake clock, and fake CUDA
events (no GPU on this machine). The last test trains real fairseq (tiny preset, one CPU rank)
through the worker and reads the heartbeat it wrote."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hpc_core.rundir import heartbeat_file
from hpc_train.contract import HEARTBEAT_DIR, read_beats
from hpc_train.worker import compute_time
from hpc_train.worker.compute_time import ComputeTimer
from hpc_train.worker.heartbeat import Heartbeat


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cpu_rank_times_forward_and_backward(tmp_path):
    clock, got = Clock(), []

    def train_step(task, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        clock.now += 0.25  # forward + backward; legacy_ddp all-reduces later, in the step
        if sample == "oom":
            raise RuntimeError("out of memory")
        return "loss", 1, {}

    timed = ComputeTimer(got.append, event=None, clock=clock).wrap(train_step)
    assert timed("task", "s", "model", "crit", "opt", 3) == ("loss", 1, {})
    with pytest.raises(RuntimeError):
        timed("task", "oom", "model", "crit", "opt", 4)
    assert got == [0.25, 0.25]


class Event:
    """A fake CUDA event: completes when the test says so."""

    def __init__(self, log: list[Any]) -> None:
        self.done, self.at, self.log = False, 0.0, log

    def record(self) -> None:
        self.at = len(self.log)
        self.log.append(self)

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: Event) -> float:
        return (end.at - self.at) * 40.0  # milliseconds


class GpuModel:
    def parameters(self):
        class P:
            is_cuda = True

        yield P()


def test_a_gpu_rank_times_the_forward_only_and_reads_the_events_without_waiting():
    events: list[Event] = []
    got: list[float] = []
    timer = ComputeTimer(got.append, event=lambda: Event(events))

    def criterion(model, sample):
        events.append(Event([]))  # the forward's kernels: one step between the two events
        return "loss", 1, {}

    def train_step(task, sample, model, crit, optimizer, update_num, ignore_grad=False):
        out = crit(model, sample)
        events.append(Event([]))  # the backward: not between the events
        return out

    timed = timer.wrap(train_step)
    timed("task", "s", GpuModel(), criterion, "opt", 1)
    assert got == [] and len(timer.pending) == 1  # not read yet: no synchronize
    timed("task", "s", GpuModel(), criterion, "opt", 2)
    assert got == []  # the first forward has not completed on the GPU yet
    timer.pending[0][1].done = True
    timed("task", "s", GpuModel(), criterion, "opt", 3)
    assert got == [pytest.approx(0.08)]  # 2 steps x 40 ms, read at a later micro-batch
    assert len(timer.pending) == 2


def test_micro_batches_add_up_and_the_heartbeat_carries_the_median_of_recent_updates(tmp_path):
    clock = Clock()
    hb = Heartbeat(tmp_path, rank=0, clock=clock)
    hb.completed(1)
    assert read_beats(tmp_path)[0].compute_s is None  # none timed yet
    for update, seconds in enumerate((0.5, 0.7, 3.0, 0.6), start=2):
        hb.compute(seconds / 2)  # update_freq 2: two micro-batches
        hb.compute(seconds / 2)
        hb.completed(update)
        hb.training()
    assert read_beats(tmp_path)[0].compute_s == pytest.approx(0.65)  # median: a spike is not it


def test_installed_on_fairseqs_train_step(tmp_path):
    """The real FairseqTask.train_step, with a fake model, criterion and optimizer."""
    from fairseq.tasks import FairseqTask

    original = FairseqTask.train_step
    got: list[float] = []
    try:
        assert compute_time.install(got.append) is not None
        assert compute_time.install(got.append) is not None  # twice: wrapped once
        assert FairseqTask.train_step.__wrapped__ is original

        class Model:
            def train(self):
                pass

            def set_num_updates(self, n):
                pass

            def parameters(self):
                return iter(())

        class Optimizer:
            def backward(self, loss):
                pass

        task = FairseqTask.__new__(FairseqTask)
        out = task.train_step("s", Model(), lambda m, s: (1.0, 1, {}), Optimizer(), 1)
        assert out == (1.0, 1, {}) and len(got) == 1 and 0 <= got[0] < 1
    finally:
        FairseqTask.train_step = original
    assert compute_time.install(None) is None


def test_real_fairseq_training_puts_the_compute_time_in_the_heartbeat(
    corpus, tmp_path, tiny_run, monkeypatch
):
    beats = tmp_path / "beats"
    monkeypatch.setenv(HEARTBEAT_DIR, str(beats))
    tiny_run(corpus, tmp_path / "run", 12)
    beat = json.loads(heartbeat_file(beats, 0).read_text())
    assert beat["update"] == 12
    assert 0 < beat["compute_s"] <= beat["slowest_s"], beat  # within an update's wall time
