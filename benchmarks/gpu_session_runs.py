"""The GPU session's runs (``benchmarks.gpu_session``): what each one is, how it is started,
and how it is stopped and read.

Every run is one training process on one device, started as the launcher starts a rank
(torchrun with ``command_lines.fairseq_args``), or as bare ``fairseq-train`` for the baseline,
or as the rank alone under an allocator cap (the p3dn limits). Each has a hard timeout (its
process group killed at it), and a watch on its output: a run may stop at the first line that
says it ran out of memory (the p3dn limits: on one GPU fairseq treats an OOM batch as
recoverable and skips it, so an oversized batch would never count an update).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import gpu, gpu_measure
from hpc_train.job import command_lines
from hpc_train.job.levers import LeverName, Speed

P3DN = "p3dn.24xlarge"
P3DN_CAP_GIB = 32.0  # a V100's memory, as the cap on this GPU's allocator
README_BATCH = 16  # fairseq's RoBERTa pretraining README: MAX_SENTENCES=16
OOM_RE = re.compile(r"out of memory|OutOfMemoryError|OOM: Ran out of memory", re.IGNORECASE)
CAPPED = """import runpy, torch
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(min(1.0, {cap_gib} * 2**30 / total), 0)
print(f"[gpu-session] allocator capped at {cap_gib} GiB of", round(total / 2**30, 1), flush=True)
runpy.run_module("hpc_train.worker.train", run_name="__main__")
"""
# every lever of issue 36 that keeps fairseq's samples (pack changes them, compile is apart)
EXACT_LEVERS = (
    LeverName.GELU, LeverName.PAD_CHECK, LeverName.HOST_SIZES, LeverName.LAZY_STATS,
    LeverName.FOREACH_GRADS,
)  # fmt: skip


@dataclass(frozen=True)
class Run:
    name: str
    preset: str
    kind: str = "toolkit"  # toolkit, bare (fairseq-train, README settings), p3dn (capped rank)
    speed: Speed = field(default_factory=Speed)
    per_gpu: int | None = None  # None: the toolkit's table
    profile: tuple[int, int] | None = None  # HPC_TRAIN_PROFILE (warm-up, updates)
    stop_on_oom: bool = False
    extra: tuple[str, ...] = ()  # fairseq flags after the toolkit's (fairseq takes the last)


def levers_on(*names: LeverName) -> Speed:
    return Speed.of(dict.fromkeys(names, "on"))


def argv_of(run: Run, data: Path, save: Path, lengths: gpu.Lengths, gpu_run: bool) -> list[str]:
    """The command line of ``run`` (``gpu_run`` False: the CPU rehearsal of it)."""
    python = sys.executable
    if run.kind == "bare":
        # fairseq's default data loader on a GPU (the README sets none); the rank's 0 on a CPU
        argv = gpu.seed_argv(run.preset, data, save, README_BATCH, lengths, None if gpu_run else 0)
        if not gpu_run:  # the rehearsal: a CPU, and tiny's 64 positions (longer sentences skipped)
            argv = [a if a != "--fp16" else "--cpu" for a in argv]
            argv.append("--skip-invalid-size-inputs-valid-test")
        return [python, "-m", "fairseq_cli.train", *argv]
    spec = gpu.toolkit_spec(run.preset, data, save, lengths, per_gpu=run.per_gpu, extra=run.extra)
    spec = dataclasses.replace(spec, speed=run.speed)
    if run.kind == "p3dn":
        spec = dataclasses.replace(
            spec, sizing=dataclasses.replace(spec.sizing, instance_type=P3DN)
        )
        args, _ = command_lines.fairseq_args(spec, world_size=1, gpu=gpu_run)
        if not gpu_run:
            return [python, "-m", command_lines.TRAIN_MODULE, *args]
        return [python, "-c", CAPPED.format(cap_gib=P3DN_CAP_GIB), *args]
    # its own rendezvous port: another process's toolkit run (a test, a benchmark) may run beside
    return gpu.toolkit_argv(spec, python, gpu=gpu_run, job=str(40000 + os.getpid() % 10000))


@dataclass
class Outcome:
    status: str  # ok, timeout, oom, failed
    lines: list[str]
    wall_s: float
    ended: float
    samples: list[tuple[float, float, float]]
    oom_line: str | None = None
    returncode: int | None = None


def execute(argv: list[str], env: dict[str, str], log: Path, timeout_s: float,
            stop_on_oom: bool, sample_gpu: bool) -> Outcome:  # fmt: skip
    """Run ``argv`` to its end, its timeout, or (``stop_on_oom``) its first OOM line; its output
    to ``log``; nvidia-smi sampled beside it when ``sample_gpu``."""
    smi = gpu_measure.SmiSampler() if sample_gpu else None
    began = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    lines: list[str] = []
    oom: list[str] = []
    reader = threading.Thread(target=_read, args=(proc, log, lines, oom, stop_on_oom), daemon=True)
    reader.start()
    status = "ok"
    try:
        proc.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        status = "timeout"
        _kill(proc)
    except BaseException:  # Ctrl-C, the command's own limit: the run goes with the session
        _kill(proc)
        raise
    reader.join(timeout=10)
    samples = smi.stop() if smi else []
    if oom:
        status = "oom"
    elif status == "ok" and proc.returncode != 0:
        status = "failed"
    return Outcome(status, lines, time.monotonic() - began, time.time(), samples,
                   oom[0] if oom else None, proc.returncode)  # fmt: skip


def _read(proc: subprocess.Popen[str], log: Path, lines: list[str], oom: list[str],
          stop_on_oom: bool) -> None:  # fmt: skip
    assert proc.stdout is not None
    with log.open("w") as out:
        for line in proc.stdout:
            out.write(line)
            lines.append(line.rstrip("\n"))
            if stop_on_oom and not oom and OOM_RE.search(line):
                oom.append(line.strip())
                _kill(proc)


def _kill(proc: subprocess.Popen[str]) -> None:
    """The run's whole process group (torchrun, its rank, the rank's loader processes)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path
