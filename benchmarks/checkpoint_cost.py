"""Checkpoint cost benchmark (issue 11): ``make bench-ckpt``.

    python -m benchmarks.checkpoint_cost --data .local/data/demo-bin \
        --out benchmarks/results/checkpoint_cost.json

RoBERTa-base dimensions (12 layers, dim 768; the demo corpus's vocabulary) trained on this CPU
box by the toolkit's worker (``python -m hpc_train.worker.train``, one process), 2 sequences of 128
tokens per update: an update takes about a second, a checkpoint (model + Adam state, ~1.1 GB)
several, so a save costs more than an update. Three runs of the same ``--updates``:

1. **none** - ``--no-save``: the training alone;
2. **sync** - ``--sync-save``: a checkpoint every ``--every`` updates, written in the loop;
3. **async** - the default: at each save point a host-memory snapshot, written in the background.

Each run records, inside the worker, the moment each update's validate-and-save step returned
(after its save, if any). The timed span runs from update 1 to update ``--updates - 1``: start-up,
the first update and the final save at ``--updates`` (followed by the end-of-training flush) are
outside it; the span holds ``--updates - 2`` updates and every interval save.

Figures (keys of the JSON):
- ``seconds_per_100_updates``: the span's wall time per 100 updates, per mode;
- ``overhead_per_100_updates``: sync or async less none (what the saves cost training);
- ``async_over_sync_overhead``: async's overhead / sync's (goal <= 0.2);
- ``wall_ratio_sync_over_async``: the span's wall time, sync / async;
- ``saves``: per save, from the run's ledger: ``seconds`` (the training stall), ``bytes``, and
  for async ``snapshot_s`` (copy to host memory) and ``write_s`` (the background write).

The worker runs as the launcher runs a CPU rank: one OpenMP thread (``instances.cpu_env``), so
of this box's two cores one trains and the other is free for the background writer (niced,
``async_save.WRITER_NICE``). Measured while writing a 1.1 GB checkpoint: a training loop on one
thread keeps 93-101% of its pace, on two threads (oversubscribed by the writer) 39-51%. A GPU
node's host cores are mostly idle during training.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.report import fmt, ratio, run_and_write
from hpc_core import instances, ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train import contract
from hpc_train.job.command_lines import fairseq_args
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Training

MODES = ("none", "sync", "async")
GPU_INSTANCE = "p5.48xlarge"  # --gpu: an H100's precision (bf16) and batch rules
WORKER = "_worker"  # argv[1] of the benchmark's own subprocess: the timed training worker
PRESET = "roberta-base"
# --smoke: the same three runs of the tiny preset, 6 updates, a save every 2
SMOKE = {"preset": "tiny", "updates": 6, "every": 2}


class BenchError(RuntimeError):
    pass


# --- arithmetic (pure) ----------------------------------------------------------------------


def span_seconds(returns: dict[int, float], first: int, last: int) -> float:
    """Wall seconds from update ``first``'s step returning to update ``last``'s."""
    if first not in returns or last not in returns or last <= first:
        raise BenchError(f"updates {first}..{last} were not all timed")
    return returns[last] - returns[first]


def per_100(seconds: float, updates: int) -> float:
    return seconds / updates * 100


def overhead(with_saves: float, without: float) -> float:
    """What the saves added (never below 0: noise can make a run with saves faster)."""
    return max(0.0, with_saves - without)


def saves_in_span(every: int, first: int, last: int) -> list[int]:
    """The interval saves that fall inside the timed span (after ``first``, up to ``last``)."""
    return [u for u in range(first + 1, last + 1) if u % every == 0]


# --- the worker (a subprocess) --------------------------------------------------------------


def worker(out: Path, args: list[str]) -> None:
    """The toolkit's training worker, with the moment each update's step returned recorded."""
    import fairseq_cli.train as fairseq_train

    from hpc_train.worker import train

    step = fairseq_train.validate_and_save
    returns: dict[int, float] = {}

    def timed(cfg: Any, trainer: Any, *rest: Any, **kwargs: Any) -> Any:
        result = step(cfg, trainer, *rest, **kwargs)
        returns[trainer.get_num_updates()] = time.monotonic()
        return result

    fairseq_train.validate_and_save = timed  # innermost: the notice and ledger hooks wrap it
    train.main(args)
    out.write_text(json.dumps({"returns": returns, "exited": time.monotonic()}))


# --- the runs -------------------------------------------------------------------------------


def train_args(
    data: Path,
    save: Path,
    updates: int,
    every: int,
    mode: str,
    gpu: bool = False,
    preset: str = PRESET,
) -> list[str]:
    extra = (
        "--batch-size", "16" if gpu else "2", "--update-freq", "1",
        "--tokens-per-sample", "128", "--max-positions", "128",
        "--save-interval-updates", str(every), "--keep-interval-updates", "1",
        "--disable-validation", "--log-interval", "10",
        *(("--no-save",) if mode == "none" else ()),
    )  # fmt: skip
    spec = JobSpec(
        Training(preset, data, save, max_update=updates, extra_args=extra),
        Sizing(gpus_per_node=1 if gpu else 0, global_batch=16, instance_type=GPU_INSTANCE),
    )  # fmt: skip
    args, _ = fairseq_args(spec, world_size=1, gpu=gpu)
    return args


def run_mode(
    mode: str,
    data: Path,
    work: Path,
    updates: int,
    every: int,
    gpu: bool = False,
    preset: str = PRESET,
) -> dict[str, Any]:
    save = work / mode
    if save.exists():
        subprocess.run(["rm", "-rf", str(save)], check=True)
    save.mkdir(parents=True)
    times = work / f"{mode}-times.json"
    env = {**os.environ, contract.START: "bench:0"}  # rank 0 records its saves in the ledger
    if not gpu:
        env.update(instances.plain(instances.cpu_env()))  # as the launcher runs a CPU rank
    env[contract.SYNC_SAVE] = "1" if mode == "sync" else "0"
    os.sync()  # the previous run's dirty pages are not this run's to write
    started = time.monotonic()
    argv = [sys.executable, "-m", "benchmarks.checkpoint_cost", WORKER, str(times)]
    proc = subprocess.run(
        [*argv, *train_args(data, save, updates, every, mode, gpu, preset)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        raise BenchError(f"{mode} run failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    recorded = json.loads(times.read_text())
    returns = {int(k): v for k, v in recorded["returns"].items()}
    first, last = 1, updates - 1
    span = span_seconds(returns, first, last)
    events = ledger.read(RunDir(save).ledger)
    saves = [e.data for e in events if e.kind == Kind.CHECKPOINT]
    return {
        "span_s": round(span, 3),
        "span_updates": last - first,
        "process_s": round(time.monotonic() - started, 3),
        "final_save_and_exit_s": round(recorded["exited"] - returns[last], 3),
        "saves": saves,
    }


def machine() -> dict[str, Any]:
    import torch

    return {
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    data = args.data.resolve()
    if not (data / "dict.txt").exists():
        raise BenchError(f"--data {data}: no binarized corpus (make demo-data)")
    work = args.work_dir.resolve()
    began = time.time()
    runs = {
        m: run_mode(m, data, work, args.updates, args.every, args.gpu, args.preset) for m in MODES
    }
    subprocess.run(["rm", "-rf", str(work)], check=True)
    span_updates = runs["none"]["span_updates"]
    per = {m: round(per_100(r["span_s"], span_updates), 2) for m, r in runs.items()}
    over = {m: round(overhead(per[m], per["none"]), 2) for m in ("sync", "async")}
    interval = [s for s in runs["sync"]["saves"] if s["update"] < args.updates]
    async_interval = [s for s in runs["async"]["saves"] if s["update"] < args.updates]
    return {
        "benchmark": "checkpoint_cost",
        "preset": args.preset,
        "model": model(args.preset)
        + (
            "16 x 128 tokens per update, GPU 0, bf16"
            if args.gpu
            else "2 x 128 tokens per update, CPU"
        ),
        "updates": args.updates,
        "save_every": args.every,
        "saves_in_span": len(saves_in_span(args.every, 1, args.updates - 1)),
        "seconds_per_100_updates": per,
        "overhead_per_100_updates": over,
        "async_over_sync_overhead": ratio(over["async"], over["sync"]),
        "wall_ratio_sync_over_async": ratio(runs["sync"]["span_s"], runs["async"]["span_s"]),
        "checkpoint_bytes": interval[0]["bytes"] if interval else None,
        "sync_save_s_median": median([s["seconds"] for s in interval]),
        "async_stall_s_median": median([s["seconds"] for s in async_interval]),
        "async_snapshot_s_median": median([s.get("snapshot_s") for s in async_interval]),
        "async_write_s_median": median([s.get("write_s") for s in async_interval]),
        "seconds_per_update_no_save": round(per["none"] / 100, 3),
        "runs": runs,
        "machine": machine(),
        "duration_s": round(time.time() - began, 1),
    }


def model(preset: str) -> str:
    if preset == PRESET:
        return "roberta_base dims (12 x 768), demo vocabulary, "
    return f"the {preset} preset (not the benchmark's model: --smoke), demo vocabulary, "


def median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    per, over = result["seconds_per_100_updates"], result["overhead_per_100_updates"]
    return [
        ("s / 100 updates, no saves", fmt(per["none"], ".1f"), ""),
        ("save overhead s / 100 updates, sync", fmt(over["sync"], ".1f"), ""),
        ("save overhead s / 100 updates, async", fmt(over["async"], ".1f"), ""),
        (f"s / 100 updates, sync save every {result['save_every']}", fmt(per["sync"], ".1f"), ""),
        (f"s / 100 updates, async save every {result['save_every']}", fmt(per["async"], ".1f"), ""),
        ("save overhead async / sync", fmt(result["async_over_sync_overhead"]), "<= 0.20"),
        ("wall time sync / async", fmt(result["wall_ratio_sync_over_async"]), "> 1"),
        ("checkpoint MB", fmt((result["checkpoint_bytes"] or 0) / 1e6, ".0f"), ""),
        ("s per update (no saves)", fmt(result["seconds_per_update_no_save"]), "< sync save"),
        ("s per save, sync (training stall)", fmt(result["sync_save_s_median"]), ""),
        ("s per save, async stall", fmt(result["async_stall_s_median"]), ""),
        ("  of which snapshot", fmt(result["async_snapshot_s_median"]), ""),
        ("s per save, async background write", fmt(result["async_write_s_median"]), ""),
    ]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [WORKER]:
        worker(Path(argv[1]), argv[2:])
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_cost", description=__doc__)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--data", type=Path, default=Path(".local/data/demo-bin"))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/checkpoint_cost.json"))
    p.add_argument("--updates", type=int, default=34, help="updates per run")
    p.add_argument("--every", type=int, default=8, help="save interval (updates)")
    p.add_argument("--work-dir", type=Path, default=Path(".local/bench/checkpoint_cost"))
    p.add_argument("--gpu", action="store_true", help="on GPU 0 (bf16, as on a p5), not the CPU")
    p.add_argument("--preset", default=PRESET, help=f"the model (default {PRESET}; --smoke: tiny)")
    args = report.parse(p, argv, "checkpoint_cost", SMOKE)
    if args.updates < 4 or args.every < 1:
        p.error("--updates must be >= 4 and --every >= 1")
    result = run_and_write("bench-ckpt", args.out, lambda: run(args), summary_rows, (BenchError,))
    return 0 if result is not None else 1


if __name__ == "__main__":
    sys.exit(main())
