"""GPU benchmark (issue 12): ``make bench-gpu``. Needs one visible NVIDIA GPU; without one it
says so and exits 0.

    python -m benchmarks.gpu --data .local/data/demo-bin --out benchmarks/results/gpu.json
    python -m benchmarks.gpu probe --data .local/data/demo-bin --out benchmarks/results/gpu-probe.json

For each preset (roberta-base, roberta-large), four trainings on one GPU, one after the other in
one run, all with the same global batch (``LENGTHS``) so every update sees as many sequences:

1. **bare_seed** - bare ``fairseq-train`` (``python -m fairseq_cli.train``) with the seed
   recipe's settings (``ray_train.sh``): ``--fp16``, ``--optimizer adam``, ``--ddp-backend
   no_c10d``, ``--max-sentences`` 16 (base) / 8 (large: the preset's former value);
2. **bare_same** - the same bare fairseq with the toolkit's per-GPU batch (fp16, adam);
3. **toolkit_same** - the toolkit (``torchrun -m hpc_train.worker.train`` with the arguments the
   launcher builds) forced to bare_same's settings: ``--precision fp16``, ``--optimizer adam``;
4. **toolkit** - the toolkit as it runs on a p5 (H100): its table's batch, bf16, ``fused_adamw``.

Figures (ratios taken in the same run): ``speedup_vs_seed`` = toolkit / bare_seed words/s
(goal >= 2; also the file's ``figures.toolkit_over_bare``, ``benchmarks.gpu_results``);
``toolkit_over_bare_same_settings`` = toolkit_same / bare_same (goal >= 0.98, the toolkit's own
overhead); ``save_ratio`` = the toolkit's atomic checkpoint write / fairseq's own, in seconds.
Words/s is fairseq's ``wps`` (non-padding tokens per second), the median over its log intervals
after the first (warm-up). MFU = 6 x parameters x words/s / the GPU's dense bf16/fp16 peak
(``gpu_results.PEAKS``, datasheet figures); the attention's own FLOPs are not counted, so MFU is
a floor. The file's schema: ``benchmarks.gpu_results``.

The corpus is the offline demo corpus with its train split repeated ``--repeat`` times (the same
sentences again: fine for throughput, meaningless for loss), so no run reaches an epoch's end.
The train loss is recorded but not compared: the runs' batches differ in order.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import gpu_measure, gpu_results, report
from benchmarks.gpu_results import Peak, mfu, peak_for
from benchmarks.report import write_json
from hpc_train import cli
from hpc_train.job import batch, command_lines, devices, presets
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Training
from hpc_train.runs import logparse

GOAL_SPEEDUP = 2.0
GOAL_OVERHEAD = 0.98
JOB = "4242"  # the worker's rendezvous id; round r of gpu_restart's restarts is "4242.r"
INSTANCE_TYPE = "p5.48xlarge"  # the toolkit's table row for one H100
RUNS = ("bare_seed", "bare_same", "toolkit_same", "toolkit")
SEED_BATCH = {"roberta-base": 16, "roberta-large": 8}  # ray_train.sh MAX_SENTENCES; large: former
STAMP_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \|")
PARAMS_RE = re.compile(r"num\. shared model params: ([\d,]+)")
SAVE_RE = re.compile(r"writing took ([\d.]+) seconds")
DONE = "| done training in"
FLUSHED = "in the background in"  # worker.async_save: a background write ended


@dataclass(frozen=True)
class Lengths:
    global_batch: int  # sequences per update, every run
    max_update: int
    log_interval: int


LENGTHS = {"roberta-base": Lengths(512, 30, 3), "roberta-large": Lengths(256, 20, 2)}
# --smoke: the same four runs of roberta-base (unless --preset), 6 updates each, each logged
SMOKE_LENGTHS = {"roberta-base": Lengths(512, 6, 1), "roberta-large": Lengths(256, 6, 1)}
SMOKE = {"repeat": 20}  # 6 x 512 sequences: inside one epoch of 20 copies (224 blocks each)
WARMUP_INTERVALS = 2  # log intervals left out of words/s: CUDA start-up, allocator, loader fill


# --- pure ---------------------------------------------------------------------------------------


def steady(values: list[float], skip: int = WARMUP_INTERVALS) -> float:
    """Median after the first ``skip`` values (warm-up); ValueError when nothing is left."""
    if len(values) <= skip:
        raise ValueError(f"{len(values)} log interval(s): need more than {skip}")
    return statistics.median(values[skip:])


def seed_argv(
    preset: str, data: Path, save_dir: Path, per_gpu: int, lengths: Lengths, workers: int | None
) -> list[str]:
    """Bare fairseq-train as the seed's ray_train.sh (fairseq's README recipe) runs it, on one GPU
    (``workers`` None: fairseq's default data loader, as the seed); the preset's model."""
    recipe = presets.get(preset)
    update_freq = batch.keep_global_batch(lengths.global_batch, per_gpu, 1).update_freq
    return [
        str(data), "--fp16",
        "--task", "masked_lm", "--criterion", "masked_lm",
        "--arch", recipe.arch, *recipe.arch_args, "--sample-break-mode", "complete",
        "--tokens-per-sample", str(recipe.tokens_per_sample),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-6",
        "--clip-norm", "0.0",
        "--lr-scheduler", "polynomial_decay", "--lr", "0.0005", "--warmup-updates", "10000",
        "--total-num-update", "125000",
        "--dropout", "0.1", "--attention-dropout", "0.1", "--weight-decay", "0.01",
        "--max-sentences", str(per_gpu), "--update-freq", str(update_freq),
        "--max-update", str(lengths.max_update),
        "--log-format", "json", "--log-interval", str(lengths.log_interval),
        "--save-interval-updates", "1000", "--save-dir", str(save_dir), "--ddp-backend", "no_c10d",
        *(["--num-workers", str(workers)] if workers is not None else []),
    ]  # fmt: skip


def toolkit_spec(
    preset: str,
    data: Path,
    save_dir: Path,
    lengths: Lengths,
    precision: str | None = None,
    per_gpu: int | None = None,
    extra: tuple[str, ...] = (),
) -> JobSpec:
    """The job the toolkit would run on one GPU of a p5 (``per_gpu`` None: its table's)."""
    extra_args = ("--log-interval", str(lengths.log_interval), *extra)
    return JobSpec(
        Training(preset, data, save_dir, max_update=lengths.max_update, extra_args=extra_args),
        Sizing(gpus_per_node=1, instance_type=INSTANCE_TYPE, global_batch=lengths.global_batch,
               batch_per_device=per_gpu, precision=precision),
    )  # fmt: skip


def toolkit_argv(
    spec: JobSpec,
    python: str,
    gpu: bool = True,
    after: tuple[str, ...] = (),
    round_: int = 0,
    job: str = JOB,
) -> list[str]:
    """The toolkit's worker on one device (GPU, or with ``gpu`` False one CPU rank, gloo) as the
    launcher starts it: torchrun (run as ``python -m torch.distributed.run``) with
    ``command_lines.fairseq_args``, as job ``job``'s round ``round_`` (its rendezvous, as the
    launcher's ``41.1`` for an in-job restart); ``after``: the launcher's resume arguments
    (``worker.checkpoints.ResumePoint.fairseq_args``)."""
    args, _ = command_lines.fairseq_args(spec, world_size=1, gpu=gpu)
    argv = command_lines.torchrun_argv("torchrun", 1, 1, "127.0.0.1", job, [*args, *after], round_)
    return [python, "-m", "torch.distributed.run", *argv[1:]]


def run_argvs(
    preset: str, data: Path, work: Path, python: str, lengths: Lengths | None = None
) -> dict[str, list[str]]:
    """The command line of each run (``RUNS``), save dirs ``work/<preset>-<run>``; ``lengths``
    the preset's ``LENGTHS`` unless given."""
    lengths = lengths or LENGTHS[preset]
    per_gpu = toolkit_spec(preset, data, work, lengths).device_batch(True, 1)

    def save(name: str) -> Path:
        return work / f"{preset}-{name}"

    def bare(name: str, batch_size: int, workers: int | None) -> list[str]:
        argv = seed_argv(preset, data, save(name), batch_size, lengths, workers)
        return [python, "-m", "fairseq_cli.train", *argv]

    def toolkit(name: str, **kw: Any) -> list[str]:
        return toolkit_argv(toolkit_spec(preset, data, save(name), lengths, **kw), python)

    same = {"precision": "fp16", "per_gpu": per_gpu, "extra": ("--optimizer", "adam")}
    return {
        "bare_seed": bare("bare_seed", SEED_BATCH[preset], None),
        "bare_same": bare("bare_same", per_gpu, devices.LOADER_WORKERS),
        "toolkit_same": toolkit("toolkit_same", **same),
        "toolkit": toolkit("toolkit"),
    }


def parse_log(lines: Iterable[str]) -> dict[str, Any]:
    """What a run printed: parameters, per-interval wps, peak memory, the last save, times."""
    out: dict[str, Any] = {"params": None, "wps": [], "gb_free_min": None, "save_s": None}
    out |= {"loss": None, "first_s": None, "last_s": None, "done_s": None, "flushed_s": None}
    for line in lines:
        if m := PARAMS_RE.search(line):
            out["params"] = int(m.group(1).replace(",", ""))
        if m := SAVE_RE.search(line):
            out["save_s"] = float(m.group(1))
        if DONE in line and (stamp := STAMP_RE.match(line)):
            out["done_s"] = _epoch(stamp.group(1))
        if out["done_s"] and FLUSHED in line and (stamp := STAMP_RE.match(line)):
            out["flushed_s"] = _epoch(stamp.group(1))  # the last save's background write ended
        if "| train_inner |" not in line or (metrics := logparse.parse_metrics(line)) is None:
            continue
        out["wps"].append(metrics.get("wps", 0.0))
        out["loss"] = metrics.get("loss")
        if "gb_free" in metrics:
            free = metrics["gb_free"]
            out["gb_free_min"] = (
                free if out["gb_free_min"] is None else min(out["gb_free_min"], free)
            )
        if stamp := STAMP_RE.match(line):
            out["first_s"] = out["first_s"] or _epoch(stamp.group(1))
            out["last_s"] = _epoch(stamp.group(1))
    return out


def _epoch(stamp: str) -> float:
    """fairseq's log time (local, whole seconds) as epoch seconds."""
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp()


def figures(runs: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """The ratios of one preset's runs (see the module docstring)."""

    def wps(name: str) -> float:
        return float(runs[name]["words_per_s"])

    return {
        "speedup_vs_seed": round(wps("toolkit") / wps("bare_seed"), 3),
        "toolkit_over_bare_same_settings": round(wps("toolkit_same") / wps("bare_same"), 3),
        "bf16_fused_over_fp16_adam": round(wps("toolkit") / wps("toolkit_same"), 3),
        "save_ratio": round(runs["toolkit"]["save_s"] / runs["bare_same"]["save_s"], 3)
        if runs["toolkit"]["save_s"] and runs["bare_same"]["save_s"]
        else None,
    }


def markdown(result: dict[str, Any]) -> str:
    """The table in docs/gpu.md: one row per preset and run."""
    rows = [
        "| preset | run | batch/GPU x update_freq | precision, optimizer | words/s | MFU | "
        "peak GiB (torch / nvidia-smi) | checkpoint GB, save s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for preset, section in result["presets"].items():
        for name in RUNS:
            r = section["runs"][name]
            rows.append(
                f"| {preset} | {name} | {r['batch']} x {r['update_freq']} | {r['precision']}, "
                f"{r['optimizer']} | {r['words_per_s']:,.0f} | {r['mfu']:.1%} | "
                f"{r['peak_mem_gib']} / {r['smi_peak_gib']} | "
                f"{r['checkpoint_bytes'] / 1e9:.2f}, {r['save_s']:.1f} |"
            )
    return "\n".join(rows)


def arg_after(argv: list[str], *flags: str) -> str | None:
    """The value after the last of ``flags`` in an argument list."""
    found = None
    for i, a in enumerate(argv[:-1]):
        if a in flags:
            found = argv[i + 1]
    return found


def summarize_run(argv: list[str], raw: dict[str, Any], total_gib: float) -> dict[str, Any]:
    """One run's figures from what ``gpu_measure.run_one`` recorded (its log lines, nvidia-smi
    samples as (time, MiB used, % busy), checkpoint size, wall clock)."""
    parsed = parse_log(raw["lines"])
    samples = raw["samples"]
    first, last = parsed["first_s"], parsed["last_s"]
    window = [s for s in samples if first is not None and first <= s[0] <= last + 1]
    free = parsed["gb_free_min"]
    done, flushed = parsed["done_s"], parsed["flushed_s"]
    return gpu_results.run_record(
        "ok",
        argv=argv,
        batch=int(arg_after(argv, "--batch-size", "--max-sentences") or 0),
        update_freq=int(arg_after(argv, "--update-freq") or 1),
        precision="bf16" if "--bf16" in argv else "fp16" if "--fp16" in argv else "fp32",
        optimizer=arg_after(argv, "--optimizer"),
        words_per_s=steady(parsed["wps"]),
        wps_intervals=parsed["wps"],
        params=parsed["params"],
        peak_mem_gib=round(total_gib - free, 1) if free is not None else None,
        smi_peak_gib=round(max(s[1] for s in samples) / 1024, 1) if samples else None,
        gpu_util_pct=round(statistics.mean(s[2] for s in window), 1) if window else None,
        checkpoint_bytes=raw["checkpoint_bytes"],
        save_s=parsed["save_s"],
        loss_last=parsed["loss"],
        wall_s=round(raw["wall_s"], 1),
        # "done training" -> the exit, less the last save's flush (log stamps: whole seconds)
        exit_s=round(raw["ended"] - max(done, flushed or done), 1) if done else None,
        flush_s=round(max(0.0, flushed - done), 1) if done and flushed else None,
    )


# --- measuring (one visible GPU; helpers in benchmarks.gpu_measure) -----------------------------


def bench_preset(
    preset: str,
    argvs: dict[str, list[str]],
    lengths: Lengths,
    work: Path,
    total_gib: float,
    peak: Peak | None,
) -> dict[str, Any]:
    """The four runs of one preset (``run_argvs``), one after the other; a failed run is
    recorded, not fatal."""
    runs: dict[str, dict[str, Any]] = {}
    for name, argv in argvs.items():
        save = work / f"{preset}-{name}"
        try:
            raw = gpu_measure.run_one(name, argv, save, work / f"{preset}-{name}.log")
            runs[name] = summarize_run(argv, raw, total_gib)
        except (RuntimeError, ValueError) as err:
            runs[name] = {"error": str(err)}
            print(f"[bench-gpu] {preset} {name}: FAILED: {err}", flush=True)
            continue
        finally:
            shutil.rmtree(save, ignore_errors=True)  # checkpoints are GBs
        r = runs[name]
        r["mfu"] = round(mfu(r["params"], r["words_per_s"], peak.tflops), 4) if peak else None
        print(f"[bench-gpu] {preset} {name}: {r['words_per_s']:,.0f} words/s", flush=True)
    complete = all("error" not in r for r in runs.values())
    return {
        "lengths": lengths.__dict__,
        "figures": figures(runs) if complete else None,
        "runs": runs,
    }


def run(args: argparse.Namespace) -> int:
    import torch

    lengths = SMOKE_LENGTHS if args.smoke else LENGTHS
    work = args.work_dir
    data = work / f"corpus-x{args.repeat}"
    # the command lines first (no GPU needed): a machine without one still builds every run's
    plans = {p: run_argvs(p, data, work, sys.executable, lengths[p]) for p in args.preset}
    planned = "; ".join(f"{p}: {', '.join(argvs)}" for p, argvs in plans.items())
    if not torch.cuda.is_available():
        print("bench-gpu: no GPU visible here: nothing measured (run it on a GPU node); "
              f"the runs planned: {planned}")  # fmt: skip
        return 0
    env = gpu_measure.environment()
    peak = peak_for(env["gpu"])
    work.mkdir(parents=True, exist_ok=True)
    gpu_measure.build_corpus(args.data, data, args.repeat)
    result = gpu_results.document(
        env,
        peak,
        matmul_bf16_tflops=gpu_measure.matmul_tflops(),
        corpus=f"{args.data.name}: the offline demo corpus, train split repeated {args.repeat}x",
        goals={"speedup_vs_seed": GOAL_SPEEDUP, "toolkit_over_bare_same_settings": GOAL_OVERHEAD},
        smoke=args.smoke,
    )
    for p, argvs in plans.items():
        section = bench_preset(p, argvs, lengths[p], work, env["gpu_memory_gib"], peak)
        result["presets"][p] = section
        if section["figures"]:  # the toolkit's defaults over bare fairseq, the seed's settings
            result["figures"]["toolkit_over_bare"][p] = section["figures"]["speedup_vs_seed"]
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    merged = gpu_results.merge(old, result)
    write_json(args.out, merged)
    print(markdown(merged))
    for preset, section in result["presets"].items():
        print(f"{preset}: {section['figures']}")
    return 0


def probe(args: argparse.Namespace) -> int:
    import torch

    from benchmarks import gpu_probe

    if not torch.cuda.is_available():
        print("bench-gpu probe: no GPU visible here: nothing measured")
        return 0
    sizes = {"roberta-base": [32, 64, 128, 256], "roberta-large": [16, 32, 64, 128]}
    result = {
        "environment": gpu_measure.environment(),
        "presets": {p: gpu_probe.sweep(p, args.data, sizes[p]) for p in args.preset},
    }
    write_json(args.out, result)
    print(json.dumps(result["presets"], indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(prog="python -m benchmarks.gpu", description=__doc__)
    p.add_argument(
        "what",
        nargs="?",
        choices=("run", "probe"),
        default="run",
        help="run: the benchmark; probe: memory and speed per batch size (default: run)",
    )
    p.add_argument(
        "--data", type=Path, default=Path(".local/data/demo-bin"), help="binarized demo corpus"
    )
    p.add_argument(
        "--out",
        type=Path,
        help="JSON; presets already in it are kept "
        "(default: benchmarks/results/gpu.json, or gpu-probe.json for probe)",
    )
    p.add_argument(
        "--preset", action="append", choices=tuple(LENGTHS), help="repeatable (default: both)"
    )
    p.add_argument("--repeat", type=int, default=100, help="train split repeats")
    p.add_argument(
        "--work-dir", type=Path, default=Path(".local/bench/gpu"), help="corpus, save dirs, logs"
    )
    args = report.parse(p, argv, "gpu", SMOKE)
    if not (args.data / "dict.txt").is_file():
        p.error(f"--data {args.data}: not a binarized corpus (make demo-data)")
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    args.preset = args.preset or (["roberta-base"] if args.smoke else list(LENGTHS))
    name = "gpu-probe.json" if args.what == "probe" else "gpu.json"
    args.out = args.out or Path("benchmarks/results") / name
    return probe(args) if args.what == "probe" else run(args)


if __name__ == "__main__":
    sys.exit(main())
