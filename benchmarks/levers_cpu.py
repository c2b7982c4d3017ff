"""What the CPU can measure of the speed levers (issue 36): ``make bench-levers``.

Host syncs and ops per update, for roberta-base's dimensions (12 layers, 768 wide, its ~200
parameter tensors) on one CPU rank, with the GPU's defaults (bf16, ``fused-adamw``) and each lever
of issue 36 on top, one at a time, then all together. Both are counted by the rank's profile
mode (``hpc_train.worker.profile``) over ``WINDOW`` updates after a warm-up:
- *host syncs*: device-to-host reads (``.item()``, ``bool(t)``, ...), by call site; reported as
  a GPU rank would make them (``host_syncs_gpu_path``: less the reads only a CPU rank makes,
  ``host_reads.CPU_ONLY_SITES``). A proxy for the GPU's idle time: each drains its queue;
- *ops*: the ops Python launches (top-level ATen calls), a proxy for kernel launches.
Neither depends on the batch's size, so the batch is small (2 sequences of 64 tokens) and the
log interval longer than the run (logging's own reads left out). Times on this CPU mean nothing
for a GPU and are not compared. ``compile`` is left out (Inductor's C++ compile of 12 layers
takes minutes on 2 cores); ``flash`` is GPU-only.

Goals (issue 36): every lever on, host syncs per update <= 2 on a GPU's path; ops per update
at least 30 % fewer than the defaults. ``--smoke``: the tiny preset, the defaults and all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import gpu, report
from benchmarks import gpu_session_runs as runs
from benchmarks.gpu_session_runs import EXACT_LEVERS, Run, levers_on
from hpc_core.rundir import RunDir
from hpc_train import contract
from hpc_train.job.levers import LeverName

DEFAULTS = (LeverName.FUSED_ADAMW,)  # the GPU's defaults a CPU rank can run (flash: GPU only)
LEVERS = (*EXACT_LEVERS, LeverName.PACK)
WINDOW = (2, 3)  # warm-up, profiled updates
GOAL_SYNCS = 2.0
GOAL_FEWER_OPS = 0.30
SMALL = ("--bf16", "--batch-size", "2", "--update-freq", "1", "--tokens-per-sample", "64")
SMOKE = {"preset": "tiny", "singles": False}


def variants(preset: str, singles: bool) -> list[Run]:
    """The defaults, each lever on top (``singles``), every lever on."""
    extra = SMALL if preset != "tiny" else ("--bf16",)
    out = [Run("defaults", preset, speed=levers_on(*DEFAULTS), profile=WINDOW, extra=extra)]
    if singles:
        out += [Run(name, preset, speed=levers_on(*DEFAULTS, name), profile=WINDOW, extra=extra)
                for name in LEVERS]  # fmt: skip
    out.append(Run("all", preset, speed=levers_on(*DEFAULTS, *LEVERS), profile=WINDOW, extra=extra))
    return out


def measure(run: Run, data: Path, work: Path) -> dict[str, Any]:
    """One variant's profile (``RunDir.profile``'s per-update figures and sites)."""
    save = runs.fresh(work / run.name)
    lengths = gpu.Lengths(16, sum(WINDOW) + 1, 100)
    argv = runs.argv_of(run, data, save, lengths, gpu_run=False)
    env = {**os.environ, contract.PROFILE: f"{WINDOW[0]}:{WINDOW[1]}", "OMP_NUM_THREADS": "2"}
    done = runs.execute(argv, env, work / f"{run.name}.log", 600, False, False)
    profile = RunDir(save).profile
    if done.status != "ok" or not profile.exists():
        raise RuntimeError(f"{run.name}: {done.status}; see {work / f'{run.name}.log'}")
    figures = json.loads(profile.read_text())
    runs.fresh(save)
    per = figures["per_update"]
    print(f"[bench-levers] {run.name}: host syncs {per['host_syncs_gpu_path']:g} (GPU path), "
          f"ops {per['ops_launched']:,.0f}", flush=True)  # fmt: skip
    return {
        "levers": run.speed.asked(),
        "per_update": per,
        "host_sync_sites": figures["host_sync_sites"],
    }


def compute(args: Any) -> dict[str, Any]:
    started, load = time.time(), os.getloadavg()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    measured = {
        r.name: measure(r, args.data, args.work_dir) for r in variants(args.preset, args.singles)
    }
    base, every = (measured[n]["per_update"] for n in ("defaults", "all"))
    return {
        "preset": args.preset,
        "variants": measured,
        "figures": {
            "host_syncs_all_levers": every["host_syncs_gpu_path"],
            "host_syncs_defaults": base["host_syncs_gpu_path"],
            "fewer_ops_all_levers": round(1 - every["ops_launched"] / base["ops_launched"], 3),
        },
        "goals": {"host_syncs_all_levers": GOAL_SYNCS, "fewer_ops_all_levers": GOAL_FEWER_OPS},
        **report.provenance(started, load, {"cpus": os.cpu_count()}),
    }


def rows(result: dict[str, Any]) -> report.Rows:
    f = result["figures"]
    return [
        ("host syncs / update, defaults (GPU path)", f"{f['host_syncs_defaults']:g}", "-"),
        ("host syncs / update, every lever", f"{f['host_syncs_all_levers']:g}", f"<= {GOAL_SYNCS:g}"),
        ("ops / update, every lever vs defaults", f"{f['fewer_ops_all_levers']:.0%} fewer",
         f">= {GOAL_FEWER_OPS:.0%} fewer"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = report.parser("levers_cpu", __doc__)
    p.add_argument(
        "--preset", default="roberta-base", help="the model's dimensions (default: roberta-base)"
    )
    p.add_argument("--singles", action=argparse.BooleanOptionalAction, default=True,
                   help="each lever alone on top of the defaults (default: yes)")  # fmt: skip
    args = report.parse(p, argv, "levers_cpu", SMOKE)
    if not (args.data / "dict.txt").is_file():
        p.error(f"--data {args.data}: not a binarized corpus (make demo-data)")
    args.work_dir = args.work_dir or Path(".local/bench/levers-cpu")
    result = report.run_and_write(
        "bench-levers", args.out, lambda: compute(args), rows, (RuntimeError,)
    )
    return 0 if result is not None else 1


if __name__ == "__main__":
    sys.exit(main())
