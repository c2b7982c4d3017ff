"""The cost of one logging call of rank 0's tracking (issue 45): ``make bench-tracking``.

    python -m benchmarks.tracking --out benchmarks/results/tracking.json

What is timed: ``hpc_train.worker.tracking.Tracker.log`` for one ``train_inner`` step, as
fairseq's training loop calls it, with a roberta-large log line's figures (loss, ppl, wps, ups,
wpb, bsz, lr, gnorm, loss_scale, train_wall, gb_free, wall, num_updates) and everything the call
does: the step filter and its record (a file replaced), the toolkit's figures from the ledger
(goodput over a long run's ledger: ``--starts`` starts and ``--saves`` saves, read once and
cached as the tracker does), and the writers. Four writer sets, each in a save dir of its own:
``none`` (the filter and the figures alone), ``tensorboard`` (torch's event writer, flushed each
call), ``wandb`` (W&B offline, one ``log`` a call) and ``both``; ``--calls`` calls each after
``--warmup``, the median and the 90th percentile.

Against what: the update time of roberta-large on a GPU (docs/gpu.md,
``benchmarks/results/gpu.json``: the toolkit's run on one H100, its sequences of 512 tokens per
update at its words/s). The goal: one call (both writers) at most 1 % of one update. fairseq logs
once per ``--log-interval`` updates (the presets: 100), so per update the cost is a hundredth of
that; the goal holds as if every update logged.

Checked: the event files are read back record by record (``hpc_train.testing``) and must hold
each step of the timed calls once, W&B's offline file each step once.

Keys of the JSON: ``call_ms.<writers>`` (``median``, ``p90``), ``update_s`` (and where it comes from), ``goal`` (``call_over_update``, ``limit``, ``met``),
``checked``, ``sizes``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.report import fmt, run_and_write
from hpc_core import ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train import testing
from hpc_train.contract import Cause, WandbRun, WorkerEnv
from hpc_train.worker import tracking

GPU_RESULTS = report.RESULTS / "gpu.json"
PRESET = "roberta-large"
RUN = "toolkit"  # the toolkit's defaults on the GPU (bf16, fused AdamW)
TOKENS = 512  # tokens per sequence (the presets' --tokens-per-sample)
LIMIT = 0.01  # one call at most 1 % of an update
WRITERS = ("none", "tensorboard", "wandb", "both")
RUN_ID = "hpc-bench-tracking"


def update_time(path: Path = GPU_RESULTS) -> dict[str, Any]:
    """Seconds per update of roberta-large on the GPU of ``path``: its global batch of 512-token
    sequences over the toolkit's words/s."""
    said = json.loads(path.read_text())
    preset = said["presets"][PRESET]
    words_per_s = float(preset["runs"][RUN]["words_per_s"])
    sequences = int(preset["lengths"]["global_batch"])
    return {
        "seconds": sequences * TOKENS / words_per_s,
        "source": f"{path.name}: {PRESET}, run {RUN!r}, {sequences} x {TOKENS} tokens at "
        f"{words_per_s:.0f} words/s on {said['device']['gpu']} ({said['date']})",
    }


def long_ledger(run: RunDir, starts: int, saves: int, now: float) -> None:
    """A long run's ledger: ``starts`` starts, each ended by a notice, ``saves`` saves."""
    ledger.record(run.ledger, Kind.SUBMITTED, "1", 0, now - 10.0 * (starts + saves), nodes="8")
    t = now - 10.0 * (starts + saves) + 1
    per_start = max(1, saves // starts)
    for n in range(starts):
        ledger.record(run.ledger, Kind.STARTED, "1", n, t, nodes=[f"n{i}" for i in range(8)],
                      world=64, update_freq=1, resume_at=n * per_start * 100, previous="x")  # fmt: skip
        ledger.record(run.ledger, Kind.FIRST_UPDATE, "1", n, t + 1, update=n * per_start * 100 + 1)
        for k in range(per_start):
            t += 10
            ledger.record(run.ledger, Kind.CHECKPOINT, "1", n, t, update=(n * per_start + k) * 100,
                          seconds=2.0, bytes=3_759_669_067, notice=False)  # fmt: skip
        if n + 1 < starts:
            ledger.record(run.ledger, Kind.STOPPED, "1", n, t + 1, cause=Cause.NOTICE, why="x",
                          reached=(n + 1) * per_start * 100, last_progress=t)  # fmt: skip
        t += 10


def stats(step: int) -> dict[str, Any]:
    """One roberta-large ``train_inner`` log line's figures (fairseq's keys)."""
    return {
        "loss": 7.5 - step * 1e-4, "ppl": 181.0, "wps": 122763.5, "ups": 0.94, "wpb": 131072.0,
        "bsz": 256.0, "num_updates": step, "lr": 4.9e-4, "gnorm": 0.71, "loss_scale": 1.0,
        "train_wall": 106.0, "gb_free": 21.3, "wall": 3600.0 + step,
    }  # fmt: skip


def open_tracker(root: Path, writers: str, starts: int, saves: int) -> tracking.Tracker:
    run = RunDir(root / writers)
    long_ledger(run, starts, saves, time.time())
    wandb = WandbRun("bench", RUN_ID, writers, "offline")
    worker = WorkerEnv(
        save_dir=run.root,
        start=("1", starts - 1),
        tensorboard=run.tensorboard if writers in ("tensorboard", "both") else None,
        wandb=wandb if writers in ("wandb", "both") else None,
    )
    return tracking.open_tracker(run, worker)


def timed(call: Callable[[int], Any], first: int, count: int) -> list[float]:
    """Seconds of each of ``count`` calls ``call(step)``, steps from ``first``."""
    took = []
    for step in range(first, first + count):
        began = time.perf_counter()
        call(step)
        took.append(time.perf_counter() - began)
    return took


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "median": round(statistics.median(ordered) * 1e3, 4),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))] * 1e3, 4),
    }


def measure(args: argparse.Namespace, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(call_ms by writer set, what was read back), each set in its own save dir."""
    calls, checked = {}, {}
    for writers in WRITERS:
        tracker = open_tracker(root, writers, args.starts, args.saves)

        def call(step: int, tracker: tracking.Tracker = tracker) -> None:
            tracker.log("train_inner", step, stats(step))

        timed(call, 1, args.warmup)
        took = timed(call, 1 + args.warmup, args.calls)
        tracker.close()
        calls[writers] = summary_ms(took)
        checked[writers] = read_back(root / writers, writers, args.warmup + args.calls)
    return calls, checked


def read_back(save: Path, writers: str, steps: int) -> bool:
    """Does each writer hold every step once (1..steps)?"""
    ok = True
    run = RunDir(save)
    if writers in ("tensorboard", "both"):
        drawn = testing.tensorboard_series(run.tensorboard)[("train_inner", "loss")]
        ok &= [s for s, _ in drawn] == list(range(1, steps + 1))
    if writers in ("wandb", "both"):
        ((_, rows),) = testing.wandb_runs(run.wandb, 1, timeout=120)
        ok &= [s for s, row in rows if "train_inner/loss" in row] == list(range(1, steps + 1))
    return bool(ok)


def compute(args: argparse.Namespace) -> dict[str, Any]:
    started, load = time.time(), os.getloadavg()
    update = update_time(args.gpu_results)
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        calls, checked = measure(args, Path(tmp))
    share = calls["both"]["median"] / 1e3 / update["seconds"]
    sizes = {"calls": args.calls, "warmup": args.warmup, "starts": args.starts,
             "saves": args.saves, "smoke": args.smoke}  # fmt: skip
    machine = {"python": sys.version.split()[0], "cpu": platform.processor() or platform.machine()}
    return {
        "call_ms": calls,
        "update_s": round(update["seconds"], 4),
        "update_source": update["source"],
        "goal": {"call_over_update": round(share, 6), "limit": LIMIT, "met": share <= LIMIT},
        "checked": checked,
        "sizes": sizes,
        **report.provenance(started, load, machine),
    }


def rows(r: dict[str, Any]) -> report.Rows:
    out = [(f"one call, {w} (median ms)", fmt(r["call_ms"][w]["median"], ".3f"), "")
           for w in WRITERS]  # fmt: skip
    out += [
        ("roberta-large update on the GPU (s)", fmt(r["update_s"], ".3f"), ""),
        ("one call (both) / one update", f"{r['goal']['call_over_update']:.4%}", "<= 1%"),
        ("every step read back once", str(all(r["checked"].values())), "True"),
    ]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.tracking", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=report.RESULTS / "tracking.json")
    p.add_argument("--calls", type=int, default=300, help="timed calls per writer set")
    p.add_argument("--warmup", type=int, default=20, help="calls before the timed ones")
    p.add_argument("--starts", type=int, default=20, help="starts in the ledger")
    p.add_argument("--saves", type=int, default=1000, help="saves in the ledger")
    p.add_argument("--gpu-results", type=Path, default=GPU_RESULTS, help="the GPU's figures")
    args = report.parse(p, argv, "tracking", {"calls": 20, "warmup": 3, "starts": 3, "saves": 20})
    errors = (OSError, KeyError, ValueError, TimeoutError)
    result = run_and_write("bench-tracking", args.out, lambda: compute(args), rows, errors)
    return 0 if result is not None and all(result["checked"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
