"""Preemption benchmark (issue 3): ``make bench-preempt``.

    python -m benchmarks.preemption --data .local/data/demo-bin --out benchmarks/results/preemption.json

One run on the local Slurm cluster (SLURM_CONF exported), everything measured as ratios of
figures taken in that same run, because the machine is shared and noisy:

1. **sleep** - a bare ``sbatch --requeue --exclusive -N2 -p low --wrap`` job that appends the time
   to a file on every start, preempted through the ``high`` partition (``chaos.preempt``).
2. **save_on_notice** - tiny RoBERTa on 2 nodes (``--log-interval 1``: one metrics line per
   update), preempted the same way at update ``--at-update``: USR2, the workers save at the next
   update, submitit requeues; then trained to ``--max-update``.
3. **without_notice** - the same run with ``--save-interval-updates 50``, requeued without any
   notice (``scontrol requeue``): it resumes from the last interval checkpoint, so the loss is
   bounded by that interval (interval/2 on average for a preemption at a random moment). Both
   runs are interrupted once update 60 is logged, 10 after the interval checkpoint at 50, so the
   kill lands between two interval checkpoints even when it takes a few seconds (~15 updates/s);
   with an interval of 10 it often fell just after a checkpoint and measured 0.
4. **save** - the checkpoint of run 2 written again in this process, alternately with
   ``checkpoints.atomic_save`` (temp + fsync + rename + dir fsync) and plain ``torch.save`` to the
   same directory; ``os.sync()`` before each timed write so neither pays for the other's pages.

Figures (keys of the JSON):
- ``updates_recomputed_per_preemption`` / ``updates_recomputed_without_notice``: update numbers
  logged more than once, per preemption (goal 0 with save on notice);
- ``recovery_ratio``: recovery time of the training job / of the sleep job (goal <= 1.5). Both are
  measured from the same reference point, the moment just before the preemptor is submitted: to
  the first update logged after the resume ("Loaded checkpoint" line) for training, to the
  job's second start for sleep;
- ``save_ratio``: median atomic_save time / median torch.save time of the same state.

Where recovery time goes is in ``runs.*.phases_s`` (from the train log, submitit's task log and
the notice lines). The training job gives its nodes back a few seconds after the preemptor is
submitted (save on notice, then submitit requeues it); the bare sleep job does nothing on the
preemption and keeps them until Slurm kills it at the end of the partition's GraceTime. Both then
wait for the preemptor and for Slurm to restart the requeued job; the training job then starts
Python, torch and fairseq on every node and loads the checkpoint before its first update.

Other jobs in the queue take the nodes a requeued job waits for: each run waits first for a
quiet queue (``--quiet-timeout``) and the JSON lists under ``interference`` any other job seen
while a recovery was timed (a warning is printed; rerun then).

Log lines carry the node's local time with milliseconds; the emulated nodes share this host's
clock, so they compare directly with ``time.time()`` here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import logging
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from benchmarks import report
from benchmarks.report import fmt, provenance, ratio, run_and_write
from hpc_core import slurm, wait
from hpc_core.rundir import RunDir
from hpc_train import chaos, testing
from hpc_train.runs import logparse
from hpc_train.worker import checkpoints

T = TypeVar("T")
GOAL_RECOMPUTED = 0
GOAL_RECOVERY_RATIO = 1.5
PER_UPDATE = ("--log-interval", "1")
REFERENCE = "the preemptor's submission (time.time() just before its sbatch)"
STAMP_RE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
SAVED_RE = re.compile(r"saved on notice at update (\d+) in ([\d.]+) s")
SUBMITIT_START = "Starting with JobEnvironment"  # submitit's first line in a task, every start
# --smoke: the same three runs, short (the interrupt between the interval saves at 8 and 16), each
# update paced to >= 0.1 s (chaos pace): unpaced, a quiet machine trained the 30 updates after the
# interrupt in about a second and the job ended before the notice came (a fresh clone, 2026-11-27
# night); paced, the 70 updates after the interrupt take 7 s: a notice lands 1-4 s after its
# preemptor
SMOKE = {"max_update": 80, "at_update": 10, "save_interval_updates": 8, "save_repeats": 2,
         "quiet_timeout": 30, "pace_s": 0.1}  # fmt: skip


class BenchError(RuntimeError):
    """The benchmark could not measure what it set out to."""


# --- pure arithmetic ---------------------------------------------------------------------------


def recomputed_updates(updates: Sequence[int]) -> int:
    """Updates trained more than once: every occurrence of an update number after its first."""
    return len(updates) - len(set(updates))


def missing_updates(updates: Iterable[int], max_update: int) -> list[int]:
    """Update numbers in 1..max_update never logged (a resume must not skip any)."""
    return sorted(set(range(1, max_update + 1)) - set(updates))


def log_time(line: str) -> float | None:
    """Epoch seconds of the first ``YYYY-MM-DD HH:MM:SS,mmm`` stamp on a line (local time)."""
    match = STAMP_RE.search(line)
    if match is None:
        return None
    stamp = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
    return stamp.timestamp() + int(match.group(2)) / 1000


def first_time(lines: Iterable[str], needle: str, after: float) -> float | None:
    """Time of the first stamped line containing ``needle`` logged at or after ``after``."""
    for line in lines:
        if needle in line and (t := log_time(line)) is not None and t >= after:
            return t
    return None


def resumed_update(lines: Iterable[str], after: float) -> tuple[float, int] | None:
    """(time, update) of the first per-update line after the first resume logged at or after
    ``after``; lines the interrupted run still wrote before it stopped do not count."""
    resumed = False
    for line in lines:
        t = log_time(line)
        if t is None or t < after:
            continue
        if not resumed:
            resumed = logparse.RESUME_RE.search(line) is not None
            continue
        metrics = logparse.parse_metrics(line)
        if metrics and "loss" in metrics and "num_updates" in metrics:
            return t, int(metrics["num_updates"])
    return None


def first_after(times: Iterable[float], after: float) -> float | None:
    return min((t for t in times if t >= after), default=None)


def phases(marks: Sequence[tuple[str, float | None]]) -> dict[str, float]:
    """Seconds between consecutive named moments (``"a->b"``); missing moments are skipped."""
    present = [(name, t) for name, t in marks if t is not None]
    return {f"{a}->{b}": round(tb - ta, 3) for (a, ta), (b, tb) in itertools.pairwise(present)}


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, measured, goal) rows of the printed table."""
    rec, save, notice = result["recovery_s"], result["save_s"], result["runs"]["save_on_notice"]
    return [
        ("updates recomputed per preemption, save on notice",
         fmt(result["updates_recomputed_per_preemption"], "g"), f"{GOAL_RECOMPUTED}"),
        ("updates recomputed per preemption, without notice",
         fmt(result["updates_recomputed_without_notice"], "g"),
         f"<= {result['settings']['save_interval_updates']} (interval)"),
        ("recovery: training job (s)", fmt(rec["training"]), ""),
        ("  of which until the job restarted (s)", fmt(notice["restart_s"]), ""),
        ("  of which restart to first update (s)", fmt(notice["startup_s"]), ""),
        ("recovery: bare sleep job (s)", fmt(rec["sleep"]), ""),
        ("recovery ratio training / sleep", fmt(result["recovery_ratio"]), f"<= {GOAL_RECOVERY_RATIO}"),
        ("save: atomic_save, median (s)", fmt(save["atomic_median"], ".4f"), ""),
        ("save: torch.save, median (s)", fmt(save["plain_median"], ".4f"), ""),
        ("save ratio atomic / plain", fmt(result["save_ratio"]), ""),
    ]  # fmt: skip


# --- on the cluster ----------------------------------------------------------------------------


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait_until(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    poll: float = 0.5,
    tick: Callable[[], object] | None = None,
) -> T:
    """``hpc_core.wait.wait_until`` at a steady ``poll``, calling ``tick`` before each probe."""

    def check() -> T | None:
        if tick:
            tick()
        return probe() or None

    try:
        return wait.wait_until(check, what, timeout, wait.Backoff(poll, 1.0, poll))
    except TimeoutError as err:
        raise BenchError(str(err)) from None


def read_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def trained(save: Path) -> list[int]:
    """Update numbers of the per-update metrics lines, in log order."""
    return [n for n, _ in logparse.summarize(read_lines(RunDir(save).train_log)).losses]


class Jobs:
    """Job ids this benchmark submitted (cancelled by id if it stops half-way), and the other
    jobs seen in the queue while a recovery was being timed (they compete for nodes and CPU)."""

    def __init__(self, quiet_timeout: float) -> None:
        self.ids: list[str] = []
        self.seen: set[str] = set()
        self.quiet_timeout = quiet_timeout

    def add(self, job_id: str) -> str:
        self.ids.append(job_id)
        return job_id

    def others(self) -> set[str]:
        out = slurm.run(["squeue", "-h", "-o", "%i"], check=False)
        return set(out.split()) - set(self.ids)

    def sample(self) -> None:
        self.seen |= self.others()

    def take_seen(self) -> list[str]:
        seen, self.seen = sorted(self.seen, key=int), set()
        return seen

    def wait_quiet(self) -> float:
        """Wait (up to quiet_timeout) until no other job is queued; the seconds waited."""
        started = time.monotonic()
        if self.others():
            say(f"waiting up to {self.quiet_timeout:.0f} s for other jobs to leave the queue")
            try:
                wait_until("a quiet queue", lambda: not self.others(), self.quiet_timeout, 2)
            except BenchError:
                say("the queue is still busy: measuring anyway (recorded as interference)")
        return round(time.monotonic() - started, 1)

    def cancel_unfinished(self) -> None:
        for job_id in self.ids:
            if not slurm.job_state(job_id).finished:
                slurm.cancel(job_id, check=False)

    @classmethod
    @contextlib.contextmanager
    def session(cls, args: argparse.Namespace) -> Iterator[Jobs]:
        """A benchmark's Slurm session: the controller answers, ``--work-dir`` exists, and every
        job it submitted that has not finished is cancelled when the session ends, however."""
        slurm.ensure_reachable()
        args.work_dir.mkdir(parents=True, exist_ok=True)
        jobs = cls(args.quiet_timeout)
        try:
            yield jobs
        finally:
            jobs.cancel_unfinished()


def submit_training(
    name: str, data: Path, save: Path, max_update: int, extra: Sequence[str], pace_s: float = 0.0
) -> str:
    try:
        return testing.submit_tiny(data, save, max_update, name, fairseq=extra, pace_s=pace_s)
    except RuntimeError as err:
        raise BenchError(str(err)) from None


def recovery_figures(
    save: Path, job: str, t0: float, resumed_s: float, max_update: int
) -> dict[str, Any]:
    """What a finished run's logs say of its interrupt at ``t0`` and its first update after the
    resume at ``resumed_s``: updates recomputed and missing, the recovery and its phases, the
    save on notice."""
    lines = read_lines(RunDir(save).train_log)
    updates = trained(save)
    saved = [float(s) for _, s in SAVED_RE.findall("\n".join(lines))]
    task0 = read_lines(RunDir(save).task_log(job, 0))
    marks = [
        ("interrupt", t0),
        ("notice", first_time(lines, "saving at update", t0)),
        ("saved", first_time(lines, "saved on notice", t0)),
        ("restart", first_time(task0, SUBMITIT_START, t0)),
        ("checkpoint_loaded", first_time(lines, "Loaded checkpoint", t0)),
        ("first_update", resumed_s),
    ]
    restart = dict(marks)["restart"]
    return {
        "updates_recomputed": recomputed_updates(updates),
        "updates_missing": missing_updates(updates, max_update)[:20],
        "recovery_s": round(resumed_s - t0, 3),
        "phases_s": phases(marks),
        "restart_s": round(restart - t0, 3) if restart else None,  # Slurm's part of recovery_s
        "startup_s": round(resumed_s - restart, 3) if restart else None,  # the job's part
        "save_on_notice_s": saved[-1] if saved else None,
    }


def training_run(
    name: str,
    interrupt: Callable[[str], object],
    args: argparse.Namespace,
    jobs: Jobs,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """Submit, interrupt at ``args.at_update``, train to the end; figures from the logs."""
    save = args.work_dir / name
    quiet_wait = jobs.wait_quiet()
    job = jobs.add(
        submit_training(name, args.data, save, args.max_update, [*PER_UPDATE, *extra], args.pace_s)
    )
    say(f"{name}: job {job} submitted, waiting for update {args.at_update}")
    wait_until(f"update {args.at_update} of job {job}",
               lambda: max(trained(save), default=0) >= args.at_update, 600)  # fmt: skip
    at = max(trained(save))
    jobs.take_seen()
    t0 = time.time()
    interrupt(job)
    say(f"{name}: interrupted at update ~{at}, waiting for the first update after the resume")

    def resumed_or_gone() -> tuple[float, int] | None:
        found = resumed_update(read_lines(RunDir(save).train_log), t0)
        if found is None and slurm.job_state(job).finished:
            raise BenchError(f"job {job} ended without a resume after the interrupt")
        return found

    resumed = wait_until(f"job {job} to resume", resumed_or_gone, 600, tick=jobs.sample)
    interference = jobs.take_seen()
    say(f"{name}: resumed at update {resumed[1]} {resumed[0] - t0:.1f} s after the interrupt")
    final = slurm.wait_for_job(job, timeout=900)
    return {
        "job_id": job,
        "state": final.state,
        "restarts": final.restarts,
        "interrupted_near_update": at,
        "resumed_at_update": resumed[1],
        **recovery_figures(save, job, t0, resumed[0], args.max_update),
        "quiet_wait_s": quiet_wait,
        "other_jobs_during_recovery": interference,
        "save_dir": str(save),
    }


def sleep_run(args: argparse.Namespace, jobs: Jobs) -> dict[str, Any]:
    """A bare requeueable 2-node sleep job, preempted like the training job."""
    starts = args.work_dir / "sleep-starts.txt"
    wrap = f"date +%s.%N >> {shlex.quote(str(starts))}; exec sleep 600"
    quiet_wait = jobs.wait_quiet()
    job = jobs.add(slurm.sbatch([
        "--requeue", "--exclusive", "-N2", f"--partition={args.low}", "--time=10",
        "--job-name=bench-sleep", "--output=/dev/null", f"--wrap={wrap}",
    ]))  # fmt: skip

    def times() -> list[float]:
        return [float(x) for x in read_lines(starts) if x.strip()]

    say(f"sleep: job {job} submitted, waiting for its start")
    wait_until(f"sleep job {job} to start", times, 600)
    jobs.take_seen()
    t0 = time.time()
    jobs.add(chaos.preempt(job, args.partition, args.hold))
    say("sleep: preempted, waiting for its second start")
    second = wait_until(f"sleep job {job} to start again", lambda: first_after(times(), t0), 600,
                        tick=jobs.sample)  # fmt: skip
    slurm.cancel(job)
    say(f"sleep: started again {second - t0:.1f} s after the preemptor")
    return {
        "job_id": job,
        "starts": times(),
        "recovery_s": round(second - t0, 3),
        "quiet_wait_s": quiet_wait,
        "other_jobs_during_recovery": jobs.take_seen(),
    }


def save_timings(checkpoint: Path, repeats: int) -> dict[str, Any]:
    """atomic_save vs torch.save of the same loaded state, alternating which goes first."""
    import torch

    logging.getLogger("fairseq").setLevel(logging.WARNING)  # its import-time notices
    state = checkpoints.load(checkpoint)
    targets = {"atomic": checkpoint.with_name("bench-atomic.pt"),
               "plain": checkpoint.with_name("bench-plain.pt")}  # fmt: skip
    writers: dict[str, Callable[[Any, Path], object]] = {
        "atomic": checkpoints.atomic_save,
        "plain": lambda obj, path: torch.save(obj, path),
    }
    times: dict[str, list[float]] = {"atomic": [], "plain": []}
    for i in range(repeats):
        for kind in ("atomic", "plain") if i % 2 else ("plain", "atomic"):
            os.sync()  # start from clean pages: neither write pays for the other's
            started = time.perf_counter()
            writers[kind](state, targets[kind])
            times[kind].append(round(time.perf_counter() - started, 5))
    size = targets["plain"].stat().st_size
    for path in targets.values():
        path.unlink(missing_ok=True)
    return {
        "bytes": size,
        "repeats": repeats,
        "atomic": times["atomic"],
        "plain": times["plain"],
        "atomic_median": statistics.median(times["atomic"]),
        "plain_median": statistics.median(times["plain"]),
    }


def machine() -> dict[str, Any]:
    import torch

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": model.group(1).strip() if model else platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "slurm": slurm.run(["sinfo", "--version"]).strip(),
        "nodes": "local emulated Slurm cluster (slurm/local/cluster.sh), 2 of 4 nodes per job",
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    with Jobs.session(args) as jobs:
        sleep = sleep_run(args, jobs)
        notice = training_run(
            "bench-notice", lambda j: jobs.add(chaos.preempt(j, args.partition, args.hold)),
            args, jobs,
        )  # fmt: skip
        no_notice = training_run(
            "bench-no-notice", slurm.requeue, args, jobs,
            extra=("--save-interval-updates", str(args.save_interval_updates)),
        )  # fmt: skip
    say("save: atomic_save vs torch.save")
    save = save_timings(Path(notice["save_dir"]) / checkpoints.LAST, args.save_repeats)
    runs = {"sleep": sleep, "save_on_notice": notice, "without_notice": no_notice}
    return {
        "updates_recomputed_per_preemption": notice["updates_recomputed"] / notice["restarts"],
        "updates_recomputed_without_notice": no_notice["updates_recomputed"] / no_notice["restarts"],
        "recovery_ratio": ratio(notice["recovery_s"], sleep["recovery_s"]),
        "save_ratio": ratio(save["atomic_median"], save["plain_median"]),
        "recovery_s": {"training": notice["recovery_s"], "sleep": sleep["recovery_s"],
                       "without_notice": no_notice["recovery_s"], "from": REFERENCE},
        "save_s": save,
        "runs": runs,
        # other jobs in the queue while a recovery was timed (they take nodes and CPU)
        "interference": {name: r["other_jobs_during_recovery"] for name, r in runs.items()
                         if r["other_jobs_during_recovery"]},
        "goals": {"updates_recomputed_per_preemption": GOAL_RECOMPUTED,
                  "recovery_ratio_max": GOAL_RECOVERY_RATIO},
        "settings": {"max_update": args.max_update, "at_update": args.at_update,
                     "save_interval_updates": args.save_interval_updates, "hold_s": args.hold,
                     "pace_s": args.pace_s,
                     "preemptor_partition": args.partition, "preset": "tiny", "nodes": 2},
        **provenance(started, load_before, machine()),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = report.parser("preemption", __doc__)
    p.add_argument("--max-update", type=int, default=200)
    p.add_argument("--at-update", type=int, default=60, help="interrupt once this update is logged")
    p.add_argument("--save-interval-updates", type=int, default=50, help="without-notice run")
    p.add_argument("--hold", type=int, default=2, help="seconds the preemptor holds the nodes")
    p.add_argument("--pace-s", type=float, default=0.0,
                   help="each training update's least seconds (hpc-train chaos pace)")  # fmt: skip
    p.add_argument("--partition", default="high", help="preemptor's partition")
    p.add_argument("--low", default="low", help="the sleep job's (preemptible) partition")
    p.add_argument("--save-repeats", type=int, default=20)
    p.add_argument("--quiet-timeout", type=float, default=900,
                   help="seconds to wait for other jobs to leave the queue before each run")  # fmt: skip
    args = report.parse(p, argv, "preemption", SMOKE)
    args.data = args.data.resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.work_dir = (args.work_dir or Path(".local/bench") / f"preemption-{stamp}").resolve()
    errors = (BenchError, slurm.SlurmError)
    result = run_and_write("bench-preempt", args.out, lambda: run(args), summary_rows, errors)
    if result is None:
        return 1
    if result["interference"]:
        print(f"warning: other jobs ran during the timed recoveries {result['interference']}: "
              "recovery figures are suspect, rerun on a quiet cluster", file=sys.stderr)  # fmt: skip
    print(f"its runs: {args.work_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
