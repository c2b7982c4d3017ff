"""The GPU session (issue 36): one command that makes a lent GPU count, with partial results.

On the GPU test machine (the device tool: Python 3.12, its own torch, no network), from the
repository's root, with the device kit carried (``make device-kit``; ``carry: .local/device-kit``)::

    python3 -m benchmarks.gpu_session --kit .local/device-kit --out $OUT/gpu.json

Here, on the CPU, the same stages on the tiny preset, the same output schema (the suite runs it)::

    python -m benchmarks.gpu_session --rehearse --out /tmp/gpu-rehearsal.json

Stages, in the order of what a short lease is worth (``--stage`` picks some):
1. ``setup``: the kit's wheels installed with no index into a target folder (when fairseq is
   not importable), the device, the corpus (the demo train split repeated);
2. ``profile``: roberta-large with the p5 defaults and with every lever that keeps fairseq's
   samples (``gpu_session_runs.EXACT_LEVERS``), each profiled (``HPC_TRAIN_PROFILE``): time by
   kind, device idle, host syncs, ops launched, before and after;
3. ``levers``: those levers with ``pack``, then with 128 sequences per GPU (with ``pack`` and
   without: the masked path's launches do twice the work), each lever alone, then with
   ``compile`` (the compile's time falls in the warm-up intervals);
4. ``bare``: bare ``fairseq-train`` with fairseq's README settings at the same global batch
   (``figures.toolkit_over_bare``: the defaults over it);
5. ``p3dn``: roberta-large under p3dn.24xlarge's limits (its batch, fp16, no flash, the
   allocator capped at 32 GiB), stopped at its first out-of-memory line;
6. ``base``: roberta-base, the defaults, the levers with pack, bare.

A global deadline (``--deadline-s``, default 5 minutes: a lease of 15 minutes, start-up and
transfers included, keeps room for a second call for what the first one left or showed: with
``--after`` the first call's results file, carried, whose finished runs it keeps and does not
run again, ``--run`` to name the very runs it wants, bounded by the deadline alone, and
``--again`` for a run to measure again although ``--after`` holds it;
stages always run in the order above, whatever order ``--stage`` names them in), a
time box per stage (``STAGE_S``) and a timeout per run (its process group killed): a run is
not started with less than ``MIN_RUN_S`` left. The results file (``benchmarks.gpu_results``'
schema, with ``stages``) is written after every run, so a session cut short still returns what
it did. Without a GPU and without ``--rehearse`` it says so, prints the plan and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import gpu, gpu_measure, gpu_results, report
from benchmarks import gpu_session_runs as runs
from benchmarks.gpu_session_runs import EXACT_LEVERS, Run, levers_on
from hpc_core.rundir import RunDir
from hpc_train import cli, contract
from hpc_train.job.levers import LeverName

STAGES = ("setup", "profile", "levers", "bare", "p3dn", "base")
STAGE_S = {"setup": 90, "profile": 170, "levers": 240, "bare": 90, "p3dn": 90, "base": 140}
DEADLINE_S = 300.0
MIN_RUN_S = {True: 30.0, False: 8.0}  # GPU, rehearsal
# one run's timeout (roberta-base: bare fairseq's final save ran past 70 s twice on an H200)
RUN_S = {"roberta-large": 90.0, "roberta-base": 90.0, "tiny": 60.0}
COMPILE_EXTRA_S = 90.0
GPU_LENGTHS = {"roberta-large": gpu.Lengths(256, 16, 2), "roberta-base": gpu.Lengths(512, 16, 2)}
CPU_LENGTHS = {"tiny": gpu.Lengths(16, 10, 1)}
PROFILE = {True: (9, 3), False: (4, 3)}  # (warm-up, profiled) updates
BIG_BATCH = {"roberta-large": 128, "roberta-base": 512, "tiny": 16}
REPO = Path(__file__).resolve().parents[1]


def names_of(run: Run) -> set[str]:
    """How ``--run`` and ``--again`` may name ``run``."""
    return {run.name, f"{run.preset}/{run.name}"}


@dataclass
class Session:
    gpu_run: bool
    out: Path
    work: Path
    deadline: float  # time.monotonic() value
    runs_per_stage: int | None
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    data: Path = Path()
    total_gib: float = 0.0
    peak: gpu_results.Peak | None = None
    result: dict[str, Any] = field(default_factory=dict)
    only: frozenset[str] = frozenset()  # --run and --again: "preset/name" or "name"; empty: all
    again: frozenset[str] = frozenset()  # --again: run, whatever --after holds of them
    ran: set[str] = field(default_factory=set)  # "preset/name" of the runs this call measured

    def wanted(self, run: Run) -> bool:
        return not self.only or bool(names_of(run) & self.only)

    def kept(self, run: Run, section: dict[str, Any]) -> bool:
        """Whether ``run`` was measured already (an earlier stage, ``--after``) and is not asked
        for again."""
        done = run.name in section["runs"] and section["runs"][run.name]["status"] == "ok"
        again = bool(names_of(run) & self.again) and f"{run.preset}/{run.name}" not in self.ran
        return done and not again

    @property
    def main(self) -> str:
        return "roberta-large" if self.gpu_run else "tiny"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def write(self) -> None:
        report.write_json(self.out, self.result)


def stage_runs(stage: str, s: Session) -> list[Run]:
    """The runs of ``stage``, most valuable first."""
    main, window = s.main, PROFILE[s.gpu_run]
    exact = levers_on(*EXACT_LEVERS)
    if stage == "profile":
        return [
            Run("defaults", main, profile=window),
            Run("levers", main, speed=exact, profile=window),
        ]
    if stage == "levers":
        pack = levers_on(*EXACT_LEVERS, LeverName.PACK)
        singles = [Run(f"only_{name}", main, speed=levers_on(name)) for name in EXACT_LEVERS]
        compiled = [
            Run(
                "levers_pack_compile",
                main,
                speed=levers_on(*EXACT_LEVERS, LeverName.PACK, LeverName.COMPILE),
            )
        ]
        big = Run("levers_pack_b128", main, speed=pack, per_gpu=BIG_BATCH[main])
        # the masked path at twice the batch, the same launches: is its device waiting on them?
        big_masked = Run("levers_b128", main, speed=exact, per_gpu=BIG_BATCH[main])
        # Inductor's C++ compile takes minutes on a CPU: the rehearsal leaves compile out
        return [
            Run("levers_pack", main, speed=pack),
            big,
            big_masked,
            *singles,
            *(compiled if s.gpu_run else []),
        ]
    if stage == "bare":
        return [Run("bare_readme", main, kind="bare"), Run("defaults", main)]
    if stage == "p3dn":
        return [Run("p3dn_limits", main, kind="p3dn", stop_on_oom=True)]
    if stage == "base" and s.gpu_run:
        pack = levers_on(*EXACT_LEVERS, LeverName.PACK)
        base = "roberta-base"
        return [
            Run("defaults", base),
            Run("levers_pack", base, speed=pack),
            Run("bare_readme", base, kind="bare"),
        ]
    return []


def measure(run: Run, s: Session, timeout_s: float) -> dict[str, Any]:
    """One run, to its record (``gpu_results.run_record``)."""
    lengths = (GPU_LENGTHS if s.gpu_run else CPU_LENGTHS)[run.preset]
    save = runs.fresh(s.work / f"{run.preset}-{run.name}")
    argv = runs.argv_of(run, s.data, save, lengths, s.gpu_run)
    env = dict(s.env)
    if run.profile:
        env[contract.PROFILE] = f"{run.profile[0]}:{run.profile[1]}"
    print(f"[gpu-session] {run.preset} {run.name} (timeout {timeout_s:.0f} s)", flush=True)
    done = runs.execute(argv, env, s.work / f"{run.preset}-{run.name}.log", timeout_s,
                        run.stop_on_oom, s.gpu_run)  # fmt: skip
    extra = {"speed": run.speed.asked(), "kind": run.kind, "oom_line": done.oom_line,
             "log_tail": done.lines[-12:] if done.status != "ok" else []}  # fmt: skip
    ckpt = RunDir(save).checkpoint_last
    raw = {"lines": done.lines, "samples": done.samples, "wall_s": done.wall_s, "ended": done.ended,
           "checkpoint_bytes": ckpt.stat().st_size if ckpt.exists() else None}  # fmt: skip
    try:
        record = gpu.summarize_run(argv, raw, s.total_gib)
        record.update(status=done.status, **extra)
    except ValueError as err:  # too few log intervals (cut short): what is known, said so
        record = gpu_results.run_record(done.status, argv=argv, error=str(err), **extra)
    if s.peak and record.get("params") and record.get("words_per_s"):
        record["mfu"] = round(
            gpu_results.mfu(record["params"], record["words_per_s"], s.peak.tflops), 4
        )
    if RunDir(save).profile.exists():
        record["profile"] = json.loads(RunDir(save).profile.read_text())
        record["profile_table"] = [
            ln.split("| ", 3)[-1] for ln in done.lines if "worker.profile |" in ln
        ]
    runs.fresh(save)  # checkpoints are GBs
    return record


def run_stage(stage: str, s: Session) -> None:
    """Every run of ``stage`` that fits its time box and the deadline; results after each."""
    began = time.monotonic()
    # runs named with --run are the whole plan: the deadline alone bounds them
    end = s.deadline if s.only else min(began + STAGE_S[stage], s.deadline)
    status = "done"
    planned = [run for run in stage_runs(stage, s) if s.wanted(run)][: s.runs_per_stage]
    for run in planned:
        section = s.result["presets"].setdefault(run.preset, {"runs": {}, "figures": {}})
        if s.kept(run, section):
            continue  # measured in an earlier stage (the defaults) or an earlier call
        compiles = LeverName.COMPILE in run.speed.asked()
        timeout = min(RUN_S[run.preset] + COMPILE_EXTRA_S * compiles,
                      end - time.monotonic(), s.left() - 5)  # fmt: skip
        if timeout < MIN_RUN_S[s.gpu_run]:
            section["runs"][run.name] = gpu_results.run_record(
                "skipped: no time left", kind=run.kind
            )
            status = "cut short: its time box or the deadline"
            continue
        section["runs"][run.name] = measure(run, s, timeout)
        s.ran.add(f"{run.preset}/{run.name}")
        figures(s)
        s.write()
    s.result["stages"][stage] = {"status": status if planned else "nothing to run here",
                                 "seconds": round(time.monotonic() - began, 1)}  # fmt: skip
    s.write()


def figures(s: Session) -> None:
    """Each preset's ratios over its defaults, and the toolkit over bare fairseq."""
    for preset, section in s.result["presets"].items():
        wps = {n: r.get("words_per_s") for n, r in section["runs"].items() if r.get("words_per_s")}
        if "defaults" not in wps:
            continue
        section["figures"] = {
            "over_defaults": {n: round(v / wps["defaults"], 3) for n, v in wps.items()}
        }
        if "bare_readme" in wps:
            ratio = round(wps["defaults"] / wps["bare_readme"], 3)
            s.result["figures"]["toolkit_over_bare"][preset] = ratio


class SessionError(RuntimeError):
    """The session cannot start (one line, exit 2)."""


def setup(s: Session, kit: Path | None, data: Path, repeat: int) -> None:
    """The kit installed if needed, the device, the corpus; ``s.result`` started."""
    from benchmarks import device_kit

    paths = [str(REPO)]
    try:
        import fairseq  # noqa: F401 - present: nothing to install
    except ImportError:
        if kit is None:
            raise SessionError("fairseq is not importable here and no --kit was given") from None
        target = s.work / "site"
        device_kit.install(kit, target)
        sys.path.append(str(target))  # after the repository: its hpc_train, not the kit's wheel
        paths.append(str(target))
    s.env["PYTHONPATH"] = os.pathsep.join([*paths, s.env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    device = gpu_measure.environment() if s.gpu_run else gpu_measure.cpu_environment()
    s.peak = gpu_results.peak_for(device.get("gpu", "")) if s.gpu_run else None
    s.total_gib = float(device.get("gpu_memory_gib") or 0.0)
    s.result.update(
        {k: v for k, v in gpu_results.document(device, s.peak).items() if k != "presets"}
    )
    if s.gpu_run:
        s.result["matmul_bf16_tflops"] = gpu_measure.matmul_tflops()
    s.data = gpu_measure.build_corpus(data, s.work / f"corpus-x{repeat}", repeat)
    s.result["corpus"] = f"{data}: the demo corpus, train split repeated {repeat}x"


def plan_text(s: Session, stages: list[str]) -> str:
    return "; ".join(
        f"{stage}: {', '.join(r.name for r in stage_runs(stage, s) if s.wanted(r)) or '-'}"
        for stage in stages
    )


def run_names(s: Session) -> list[str]:
    """Every run of this session (GPU or rehearsal) as ``--run`` names it, in the stages' order."""
    return list(dict.fromkeys(f"{r.preset}/{r.name}" for st in STAGES for r in stage_runs(st, s)))


def unknown_runs(s: Session) -> list[str]:
    """The names ``--run`` gave that no stage of this session has."""
    known = set(run_names(s)) | {name.split("/", 1)[1] for name in run_names(s)}
    return sorted(s.only - known)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = cli.Parser(prog="python -m benchmarks.gpu_session", description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--kit", type=Path, help="the device kit (make device-kit): wheels and data")
    p.add_argument(
        "--data", type=Path, help="binarized corpus (default: the kit's, else .local/data/demo-bin)"
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-session.json"))
    p.add_argument(
        "--deadline-s",
        type=float,
        default=DEADLINE_S,
        help=f"the whole session (default: {DEADLINE_S:.0f})",
    )
    p.add_argument(
        "--stage", action="append", choices=STAGES, help="repeatable (default: all, in order)"
    )
    p.add_argument(
        "--rehearse", action="store_true", help="the CPU rehearsal: tiny preset, same stages"
    )
    p.add_argument("--runs-per-stage", type=int, help="at most this many runs of each stage")
    p.add_argument(
        "--repeat", type=int, help="train split repeats (default: 100 on a GPU, 20 rehearsing)"
    )
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/hpc-train-gpu-session"))
    p.add_argument(
        "--after",
        type=Path,
        help="an earlier call's results (its --out, carried): its finished runs are kept, not run "
        "again, whatever --stage says",
    )
    p.add_argument(
        "--run",
        action="append",
        metavar="[PRESET/]NAME",
        help="repeatable: only these runs (e.g. levers_pack_compile, roberta-base/defaults), in "
        "the stages' order, bounded by the deadline alone (no stage's time box)",
    )
    p.add_argument(
        "--again",
        action="append",
        metavar="[PRESET/]NAME",
        help="repeatable: as --run, and run even where --after holds it finished",
    )
    args = p.parse_args(argv)
    if args.deadline_s <= 0 or (args.runs_per_stage is not None and args.runs_per_stage < 1):
        p.error("--deadline-s must be > 0 and --runs-per-stage >= 1")
    if args.kit is not None and not (args.kit / "MANIFEST.json").is_file():
        p.error(f"--kit {args.kit}: not a device kit (make device-kit)")
    args.data = args.data or (
        args.kit / "data" / "demo-bin" if args.kit else Path(".local/data/demo-bin")
    )
    if not (args.data / "dict.txt").is_file():
        p.error(f"--data {args.data}: not a binarized corpus (make demo-data)")
    args.earlier = earlier_runs(args.after, p) if args.after else {}
    return args


def earlier_runs(path: Path, p: argparse.ArgumentParser) -> dict[str, Any]:
    """The presets of an earlier call's results file (``--after``); exit 2 if it is not one."""
    try:
        presets = json.loads(path.read_text())["presets"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        p.error(f"--after {path}: not a GPU session's results ({type(err).__name__})")
    if not isinstance(presets, dict):
        p.error(f"--after {path}: not a GPU session's results (no presets)")
    return presets


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    gpu_run = torch.cuda.is_available() and not args.rehearse
    # a GPU session's plan (its runs, --run's names) even where no GPU is visible: it is said
    s = Session(not args.rehearse, args.out, args.work_dir,
                time.monotonic() + args.deadline_s, args.runs_per_stage)  # fmt: skip
    s.again = frozenset(args.again or ())
    s.only = frozenset(args.run or ()) | s.again
    if unknown := unknown_runs(s):
        print(f"gpu-session: --run {', '.join(unknown)}: no such run here (the runs: "
              f"{', '.join(run_names(s))})", file=sys.stderr)  # fmt: skip
        return 2
    stages = [st for st in STAGES if st in (args.stage or STAGES)]
    if not gpu_run and not args.rehearse:
        print(f"gpu-session: no GPU visible here: nothing measured (--rehearse: the CPU rehearsal). "
              f"The plan: {plan_text(s, stages)}")  # fmt: skip
        return 0
    s.work.mkdir(parents=True, exist_ok=True)
    s.result = {
        "presets": {},
        "stages": {},
        "rehearsal": not gpu_run,
        "deadline_s": args.deadline_s,
    }
    if args.after:  # run_stage skips each run already "ok" here
        s.result.update(presets=args.earlier, after=str(args.after))
    repeat = args.repeat or (100 if gpu_run else 20)
    try:
        began = time.monotonic()
        setup(s, args.kit, args.data, repeat)
        s.result["stages"]["setup"] = {
            "status": "done",
            "seconds": round(time.monotonic() - began, 1),
        }
    except SessionError as err:
        print(f"gpu-session: {err}", file=sys.stderr)
        return 2
    figures(s)
    s.write()
    for stage in stages:
        if stage == "setup":
            continue
        if s.left() - 5 < MIN_RUN_S[gpu_run]:  # no run of it could start (run_stage's rule)
            s.result["stages"][stage] = {"status": "skipped: the deadline", "seconds": 0.0}
            s.write()
            continue
        run_stage(stage, s)
    print(json.dumps({"stages": s.result["stages"], "figures": s.result["figures"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
