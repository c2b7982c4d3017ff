"""The rank's data-loader processes stop at once after training (issue 29), with real loader
processes: torch DataLoaders here, fairseq's own in the runs."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from hpc_train import contract
from hpc_train.worker import loaders

STUCK_S = 60.0


class StuckAfterFirst(Dataset):
    """Index 0 comes at once; every other index keeps its loader process busy for a minute, as
    a loader process that does not leave when told (what torch's exit hook waited on, 5 s per
    process, on the H100)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        if index:
            time.sleep(STUCK_S)
        return torch.zeros(4)


def stuck_loader(workers: int):
    """A persistent loader that handed out its first batch; its processes are now stuck."""
    it = iter(
        DataLoader(StuckAfterFirst(), batch_size=1, num_workers=workers, persistent_workers=True)
    )
    next(it)
    return it


@pytest.mark.slow  # waits out torch's 5 s join by design: not in make test-fast
def test_torchs_own_shutdown_waits_5_s_per_stuck_loader_process():
    """Why ``loaders`` exists: torch joins each process with its 5 s timeout, one at a time."""
    it = stuck_loader(1)
    began = time.monotonic()
    it._shutdown_workers()
    assert time.monotonic() - began >= 4.5


def test_stop_all_ends_every_loader_process_within_its_deadline():
    it = stuck_loader(4)
    processes = list(it._workers)
    assert all(p.is_alive() for p in processes)
    stopped = loaders.stop_all(deadline_s=2.0)
    assert (stopped.loaders, stopped.processes) == (1, 4)
    assert stopped.seconds < 4.0  # 2 s deadline, then SIGKILL and its 1 s join at most
    assert not any(p.is_alive() for p in processes)
    assert it._shutdown and loaders.live_loaders() == []
    began = time.monotonic()
    del it  # torch's own shutdown now has nothing left to wait for
    assert time.monotonic() - began < 4.0  # not one of torch's 5 s joins, however busy the machine


def ignore_sigterm(_worker_id: int) -> None:
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # after torch's own handlers: ours wins


def test_a_loader_process_that_ignores_sigterm_is_killed_at_the_deadline():
    """The SIGKILL after the shared wait is what ends such a process (without it, it lives)."""
    it = iter(DataLoader(StuckAfterFirst(), batch_size=1, num_workers=2, persistent_workers=True,
                         worker_init_fn=ignore_sigterm))  # fmt: skip
    next(it)
    processes = list(it._workers)
    stopped = loaders.stop_all(deadline_s=1.0)
    assert (stopped.processes, stopped.killed) == (2, 2)
    assert stopped.seconds < 4.0  # the 1 s deadline, then SIGKILL and its join
    assert not any(p.is_alive() for p in processes)


def test_stop_all_without_loaders_stops_nothing():
    assert loaders.stop_all().processes == 0


# The last save durable (the rank's own log) -> the process's exit, with 4 loader processes per
# loader; the write itself is not the loaders' time (20 s once in CI, a busy disk).
# The goal on a GPU is <= 5 s (issue 29; 42 s before, torch's hook: 2 loaders x 4 processes x
# 5 s). On CPU torch has no pin-memory thread and no such hook; what is left is the
# interpreter's own exit, 1-6 s measured on this 2-core machine under load; beside a whole
# suite run it may stretch further (a run of this file failed once there, 2026-11-27). 20 s:
# still half the 42 s.
EXIT_BOUND_S = 20.0
STOP_LINE = "data-loader process(es)"


def run_rank(corpus: Path, save: Path, *extra: str, env: dict[str, str] | None = None):
    """The tiny preset through the worker, one CPU rank, 4 loader processes; returns (log lines,
    the wall clock time the process exited)."""
    from hpc_train.job.command_lines import TRAIN_MODULE, fairseq_args
    from hpc_train.job.sizing import Sizing
    from hpc_train.job.spec import JobSpec, Saves, Training

    spec = JobSpec(
        Training("tiny", corpus, save, max_update=20),
        sizing=Sizing(gpus_per_node=0),
        saves=Saves(keep_checkpoints=5),
    )
    args, _ = fairseq_args(spec, world_size=1, gpu=False)
    proc = subprocess.run(
        [sys.executable, "-m", TRAIN_MODULE, *args, "--num-workers", "4", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    exited = time.time()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return (save / "train.log").read_text().splitlines(), exited


def stamp(line: str) -> float:
    """The rank's log time (``log_to_file``: local time, milliseconds) as epoch seconds."""
    return dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def first(lines: list[str], text: str) -> int:
    return next(i for i, line in enumerate(lines) if text in line)


def durable(lines: list[str]) -> float:
    """When the rank's last save was durable: its last background write's end (async_save logs
    it from the writer thread; 20 s on a busy CI machine), else "done training"."""
    done = first(lines, "done training")
    wrote = [i for i, line in enumerate(lines) if "in the background in" in line]
    return stamp(lines[max([done, *wrote])])


def assert_prompt_exit(lines: list[str], exited: float, save: Path) -> None:
    done, stop, saved = (first(lines, t) for t in ("done training", STOP_LINE, "Saved checkpoint"))
    # the checkpoint first, the loaders as the step says stop: before fairseq's main returns
    # and its loaders become garbage a collection may shut down the slow way (torch's __del__)
    assert saved < stop < done
    assert "stopped 8 data-loader process(es) of 2 loader(s)" in lines[stop]  # train and valid
    assert exited - durable(lines) <= EXIT_BOUND_S
    assert torch.load(save / "checkpoint_last.pt", weights_only=False)["optimizer_history"]


def test_a_rank_with_4_loader_processes_exits_promptly_after_training(corpus, tmp_path):
    lines, exited = run_rank(corpus, tmp_path)
    assert_prompt_exit(lines, exited, tmp_path)


def test_a_rank_stopped_by_a_notice_saves_then_exits_promptly(corpus, tmp_path):
    """The launcher's record of a notice (one it got before the rank's handler was there): the
    rank saves at its first update and stops; its loaders go after the save."""
    pending = tmp_path / "notice-pending"
    contract.record_notice(pending, "SIGUSR2")
    env = {"HPC_TRAIN_NOTICE_PENDING": str(pending)}
    lines, exited = run_rank(corpus, tmp_path, env=env)
    assert "saved on notice at update 1" in "\n".join(lines)
    assert first(lines, "saved on notice") < first(lines, STOP_LINE)
    assert_prompt_exit(lines, exited, tmp_path)


def test_a_rank_that_crashes_stops_its_loaders_before_it_exits(corpus, tmp_path):
    """An injected crash (``chaos JOB crash``) at update 5: the rank's loaders go with it, not
    through torch's exit hook (5 s per process on a GPU)."""
    from hpc_core.rundir import RunDir
    from hpc_train.job.command_lines import TRAIN_MODULE, fairseq_args
    from hpc_train.job.sizing import Sizing
    from hpc_train.job.spec import JobSpec, Training

    contract.write_crash_request(RunDir(tmp_path), contract.CrashRequest(update=5, rank=0))
    spec = JobSpec(
        Training("tiny", corpus, tmp_path, max_update=20), sizing=Sizing(gpus_per_node=0)
    )
    args, _ = fairseq_args(spec, world_size=1, gpu=False)
    proc = subprocess.run([sys.executable, "-m", TRAIN_MODULE, *args, "--num-workers", "4"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode != 0 and "InjectedCrash" in proc.stderr
    lines = (tmp_path / "train.log").read_text().splitlines()
    stop = first(lines, STOP_LINE)
    assert "stopped 8 data-loader process(es) of 2 loader(s)" in lines[stop]  # train and valid


@pytest.mark.parametrize("says_stop", [True, False])
def test_the_loaders_stop_when_fairseqs_step_says_stop(monkeypatch, says_stop):
    """``install``: a step that says stop ends every loader's processes before it returns, a
    step that trains on leaves them (fairseq's validate-and-save faked: a real one needs a
    whole trainer; the runs above drive the real one)."""
    import fairseq_cli.train as fairseq_train

    monkeypatch.setattr(fairseq_train, "validate_and_save", lambda *a, **k: ([1.0], says_stop))
    loaders.install()
    it = stuck_loader(2)
    processes = list(it._workers)
    assert fairseq_train.validate_and_save("cfg", "trainer") == ([1.0], says_stop)
    assert it._shutdown is says_stop
    assert [p.is_alive() for p in processes] == [not says_stop] * 2
    loaders.stop_all()  # before ``it`` goes: torch's __del__ would join each stuck one for 5 s


@pytest.fixture(autouse=True)
def no_loader_left():
    yield
    loaders.stop_all()
