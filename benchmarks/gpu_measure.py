"""What ``benchmarks.gpu`` needs a GPU for: the enlarged corpus, one timed training run with
nvidia-smi sampled beside it, the bf16 matmul ceiling, and the machine's versions."""

from __future__ import annotations

import datetime as dt
import platform
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from hpc_core.rundir import RunDir
from hpc_train.job import command_lines


def build_corpus(src: Path, dest: Path, repeat: int) -> Path:
    """``src`` with its train split repeated ``repeat`` times (fairseq's own index builder)."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder

    if (dest / "train.idx").exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("train.*"))
    dtype = MMapIndexedDataset.Index(str(src / "train.idx")).dtype
    builder = MMapIndexedDatasetBuilder(str(tmp / "train.bin"), dtype=dtype)
    for _ in range(repeat):
        builder.merge_file_(str(src / "train"))
    builder.finalize(str(tmp / "train.idx"))
    tmp.rename(dest)
    return dest


class SmiSampler:
    """nvidia-smi every 0.5 s: (time, MiB used, % utilisation) samples until stopped."""

    def __init__(self) -> None:
        query = "--query-gpu=memory.used,utilization.gpu"
        self.proc = subprocess.Popen(
            ["nvidia-smi", query, "--format=csv,noheader,nounits", "-lms", "500", "-i", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.samples: list[tuple[float, float, float]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            used, util = (float(x) for x in line.split(","))
            self.samples.append((time.time(), used, util))

    def stop(self) -> list[tuple[float, float, float]]:
        self.proc.terminate()
        self.proc.wait()
        return self.samples


def run_one(name: str, argv: list[str], save_dir: Path, log: Path) -> dict[str, Any]:
    """Run ``argv`` (a fresh ``save_dir``, output to ``log``) with nvidia-smi sampling beside it;
    RuntimeError when it fails."""
    shutil.rmtree(save_dir, ignore_errors=True)
    print(f"[bench-gpu] {name}: {command_lines.shell(argv)}", flush=True)
    smi = SmiSampler()
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    wall, ended = time.monotonic() - started, time.time()
    samples = smi.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} exited {proc.returncode}; see {log}")
    ckpt = RunDir(save_dir).checkpoint_last
    return {
        "lines": log.read_text().splitlines(),
        "samples": samples,
        "wall_s": wall,
        "ended": ended,
        "checkpoint_bytes": ckpt.stat().st_size if ckpt.exists() else None,
    }


def matmul_tflops(n: int = 8192, repeats: int = 10) -> float:
    """The GPU's measured bf16 ceiling: an n x n x n product on random data, mean of ``repeats``."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return round(2 * n**3 * repeats / (start.elapsed_time(end) / 1000) / 1e12, 1)


def environment() -> dict[str, Any]:
    import fairseq
    import torch

    driver = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "fairseq": fairseq.__version__,
        "python": platform.python_version(),
        "date": dt.date.today().isoformat(),
    }


def cpu_environment() -> dict[str, Any]:
    """The machine of a CPU run (a rehearsal): what ``environment`` says of a GPU machine."""
    import os

    import fairseq
    import torch

    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "fairseq": fairseq.__version__,
        "python": platform.python_version(),
        "date": dt.date.today().isoformat(),
    }
