"""The issue-29 comparison on one GPU, in one script of <= 8 minutes (prepared; not yet run: the
session that wrote it had no GPU). Needs one visible NVIDIA GPU; without one it says so, prints
each run's command line and exits 0.

    python -m benchmarks.gpu_levers --data .local/data/demo-bin --out benchmarks/results/gpu-levers.json

Runs, one after the other, each through the toolkit's own command line (``benchmarks.gpu``'s
toolkit_spec on a p5 row, ``command_lines.fairseq_args``), same global batch and lengths as
``make bench-gpu`` (``gpu.LENGTHS``):

1. ``large`` / ``base`` - roberta-large / roberta-base with the p5 defaults (the levers' defaults
   for sm90: flash, fused-adamw; compile off, unmeasured);
2. ``large_compile`` / ``base_compile`` - the same with ``--compile on`` (each encoder layer
   compiled; its compile time falls in the warm-up intervals, and is reported apart as
   ``first_update_s``);
3. ``large_p3dn`` - roberta-large under p3dn's limits on this GPU: the p3dn.24xlarge row's batch
   per GPU (32: an estimate from the H100 memory line, ``job.devices``, to be confirmed here),
   fp16 with fairseq's dynamic loss scale, the levers of sm70 (no flash: SDPA falls back to its
   memory-efficient kernel), and the CUDA allocator capped at 32 GiB
   (``torch.cuda.set_per_process_memory_fraction``). One process without torchrun (the cap is set
   in the rank's own process before it starts).

Per run: words/s (fairseq's wps, median after the warm-up intervals), MFU (6 x parameters x
words/s / the GPU's peak, as ``benchmarks.gpu``; all parameters, embeddings included), GPU
busy, peak memory, the first update's time, the loss at every logged update, and "done training"
-> process exit (``exit_s``; the issue's goal is <= 5 s with 4 loader processes). Figures: the
compile runs' words/s over the defaults', and their loss difference at the last update (dropout
masks differ by design: Inductor draws them from its own generator).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import gpu, gpu_measure
from benchmarks.report import write_json
from hpc_train import cli
from hpc_train.job import command_lines
from hpc_train.job.spec import JobSpec

P3DN = "p3dn.24xlarge"
P3DN_CAP_GIB = 32.0  # a V100's memory, as the cap on this GPU's allocator
RUNS = ("large", "large_compile", "large_p3dn", "base", "base_compile")
PRESET_OF = {"large": "roberta-large", "base": "roberta-base"}
CAPPED = """import runpy, sys, torch
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(min(1.0, {cap_gib} * 2**30 / total), 0)
print(f"[gpu-levers] allocator capped at {cap_gib} GiB of", round(total / 2**30, 1), flush=True)
runpy.run_module("hpc_train.worker.train", run_name="__main__")
"""


def run_spec(name: str, data: Path, work: Path) -> JobSpec:
    """The job of run ``name`` (``RUNS``) on one GPU."""
    preset = PRESET_OF[name.split("_")[0]]
    spec = gpu.toolkit_spec(preset, data, work / name, gpu.LENGTHS[preset])
    if name.endswith("_compile"):
        return dataclasses.replace(spec, compile="on")
    if name.endswith("_p3dn"):
        return dataclasses.replace(spec, instance_type=P3DN)
    return spec


def run_argv(name: str, spec: JobSpec, python: str) -> list[str]:
    """torchrun as the launcher starts the rank; the p3dn run: the rank alone, capped."""
    if not name.endswith("_p3dn"):
        return gpu.toolkit_argv(spec, python)
    args, _ = command_lines.fairseq_args(spec, world_size=1, gpu=True)
    return [python, "-c", CAPPED.format(cap_gib=P3DN_CAP_GIB), *args]


def losses(lines: list[str]) -> dict[int, float]:
    """The train loss at each logged update."""
    out = {}
    for line in lines:
        if "| train_inner |" in line:
            record = json.loads(line.split("| train_inner | ", 1)[1])
            out[int(record["num_updates"])] = float(record["loss"])
    return out


def first_update_s(lines: list[str]) -> float | None:
    """Seconds from fairseq's "begin training" stamp (whole seconds) to the first logged update."""
    begin = next((ln for ln in lines if "Start iterating over samples" in ln), None)
    first = next((ln for ln in lines if "| train_inner |" in ln), None)
    if begin is None or first is None:
        return None
    stamps = [gpu.STAMP_RE.match(ln) for ln in (begin, first)]
    if not all(stamps):
        return None
    return gpu._epoch(stamps[1].group(1)) - gpu._epoch(stamps[0].group(1))  # type: ignore[union-attr]


def measure(name: str, data: Path, work: Path, env: dict[str, Any], peak: Any) -> dict[str, Any]:
    spec = run_spec(name, data, work)
    argv = run_argv(name, spec, sys.executable)
    try:
        raw = gpu_measure.run_one(name, argv, spec.save_dir, work / f"{name}.log")
    finally:
        shutil.rmtree(spec.save_dir, ignore_errors=True)
    result = gpu.summarize_run(argv, raw, env["gpu_memory_gib"])
    result["levers"] = [c.line() for c in spec.lever_choices(True)]
    result["losses"] = losses(raw["lines"])
    result["first_update_s"] = first_update_s(raw["lines"])
    if peak is not None and result["params"]:
        result["mfu"] = round(gpu.mfu(result["params"], result["words_per_s"], peak.tflops), 4)
    return result


def figures(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """compile / defaults, in words/s and in the last update's loss, per preset."""
    out: dict[str, Any] = {}
    for short in PRESET_OF:
        base, comp = runs.get(short, {}), runs.get(f"{short}_compile", {})
        if "words_per_s" in base and "words_per_s" in comp:
            last = max(set(base["losses"]) & set(comp["losses"]), default=None)
            out[f"{short}_compile_speedup"] = round(comp["words_per_s"] / base["words_per_s"], 3)
            out[f"{short}_compile_loss_diff_at_{last}"] = (
                round(comp["losses"][last] - base["losses"][last], 4) if last else None
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(prog="python -m benchmarks.gpu_levers", description=__doc__)
    p.add_argument("--data", type=Path, default=Path(".local/data/demo-bin"))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-levers.json"))
    p.add_argument("--run", action="append", choices=RUNS, help="repeatable (default: all)")
    p.add_argument("--repeat", type=int, default=100, help="train split repeats")
    p.add_argument("--work-dir", type=Path, default=Path(".local/bench/gpu-levers"))
    args = p.parse_args(argv)
    if not (args.data / "dict.txt").is_file():
        p.error(f"--data {args.data}: not a binarized corpus (make demo-data)")
    names = args.run or list(RUNS)
    import torch

    if not torch.cuda.is_available():
        print("gpu-levers: no GPU visible here: nothing measured. The runs would be:")
        for name in names:
            spec = run_spec(name, args.data, args.work_dir)
            print(f"{name}: {command_lines.shell(run_argv(name, spec, sys.executable))}")
        return 0
    began = time.monotonic()
    env = gpu_measure.environment()
    peak = gpu.peak_for(env["gpu"])
    args.work_dir.mkdir(parents=True, exist_ok=True)
    data = gpu_measure.build_corpus(
        args.data, args.work_dir / f"corpus-x{args.repeat}", args.repeat
    )
    runs: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            runs[name] = measure(name, data, args.work_dir, env, peak)
        except (RuntimeError, ValueError) as err:
            runs[name] = {"error": str(err)}
        print(f"[gpu-levers] {name}: {json.dumps(runs[name].get('words_per_s'))} words/s, "
              f"exit {runs[name].get('exit_s')} s ({time.monotonic() - began:.0f} s in)", flush=True)  # fmt: skip
    result = {"environment": env, "peak": peak.__dict__ if peak else None, "runs": runs,
              "figures": figures(runs), "wall_s": round(time.monotonic() - began, 1)}  # fmt: skip
    write_json(args.out, result)
    print(json.dumps(result["figures"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
