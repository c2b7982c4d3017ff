"""Hang benchmark (issue 10): ``make bench-hang``.

    python -m benchmarks.hang --data .local/data/demo-bin --out benchmarks/results/hang.json
    python -m benchmarks.hang --data .local/data/demo-bin --fault-free-minutes 20

Two runs of the tiny preset on 2 emulated nodes of the local Slurm cluster (SLURM_CONF
exported), with short watchdog allowances (``--hang-timeout-floor``, ``--hang-factor`` ...) so a
hang shows in seconds:

1. **hang** - ``--save-interval-updates 10``; once update ``--at-update`` is logged, one rank
   on the job's last node is stopped (``chaos.hang``: SIGSTOP through ``srun --overlap``). The
   watchdog declares the hang (``hang.json`` in the start's incident dir: when, and the
   allowance T it applied, ``watchdog.allowance``), saves the stacks, task 0 blames and drains
   the node, requeues the job without it (ledger ``stopped``/``requeued``), and the job resumes
   elsewhere from the last checkpoint (ledger ``first_update`` of the next start) and completes.
   The drained node is resumed afterwards.
2. **fault_free** - validation and a checkpoint at every update (``--save-interval-updates 1``),
   the same allowances, for ``--fault-free-minutes`` of training (the issue's figure is 20), then
   cancelled: the hangs declared must be 0.

Figures (keys of the JSON): ``detect_over_T`` (SIGSTOP -> hang declared, in units of T),
``requeue_over_T`` (SIGSTOP -> requeue issued), ``resume_s`` (SIGSTOP -> first update of the
next start), ``false_positives``. Without the watchdog the stopped job holds its nodes until its
time limit: that figure is stated (the job's ``--time``), not run.

The SIGSTOP lands inside ``chaos.hang`` (an ``srun --overlap`` step: its start-up first, the
signal at its end); the reference is the moment that call returns, and the JSON keeps how long
the call took. The watchdog counts T from the stopped rank's last update, which precedes the
SIGSTOP by up to one update, and reads the heartbeats every ``hang_monitor.POLL_S``: detection is
T - (part of an update) + up to one poll. The requeue then waits for the stacks
(``hang_monitor.STACK_WAIT_S``: the stopped rank never writes one) and every node's report, a fixed
cost of seconds whatever T is (T is 300 s by default, 10 s here).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.preemption import PER_UPDATE, BenchError, Jobs, machine, phases, say
from benchmarks.report import fmt, provenance, ratio, run_and_write
from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train import chaos, testing
from hpc_train.contract import Cause
from hpc_train.runs import follow
from hpc_train.watch import hang_monitor

GOAL_FALSE_POSITIVES = 0
ALLOWED_RE = re.compile(r"allowed (\d+(?:\.\d+)?) s")  # in hang.json's why, before allowance_s
PHASE_RE = re.compile(r"\((\w+); allowed")  # the declaring rank's phase, in hang.json's why
# --smoke: the same two runs, short: a hang after the first interval save, 12 s fault-free; the
# hang run paced to >= 0.1 s an update (chaos pace), so that its 48 updates after update 12 last
# longer than the SIGSTOP takes to land (unpaced, a quiet machine trains them in about a second,
# as bench-preempt's smoke run did before the notice came: a fresh clone, 2026-11-27 night)
SMOKE = {"max_update": 60, "at_update": 12, "save_interval_updates": 8,
         "fault_free_minutes": 0.2, "quiet_timeout": 30, "pace_s": 0.1}  # fmt: skip


# --- pure arithmetic ---------------------------------------------------------------------------


def allowance_of(declared: dict[str, Any]) -> float | None:
    """T, the allowance the watchdog applied, from a ``hang.json`` record."""
    if isinstance(declared.get("allowance_s"), int | float):
        return float(declared["allowance_s"])
    found = ALLOWED_RE.search(str(declared.get("why", "")))
    return float(found.group(1)) if found else None


def phase_of(declared: dict[str, Any]) -> str | None:
    """The phase of the rank that set off the hang (``train``, ``checkpoint`` ...): it chose T."""
    found = PHASE_RE.search(str(declared.get("why", "")))
    return found.group(1) if found else None


def _first(
    events: Sequence[ledger.Event], kind: Kind, after: float, restart: int | None = None
) -> ledger.Event | None:
    return next(
        (
            e
            for e in events
            if e.kind == kind and e.time >= after and (restart is None or e.restart == restart)
        ),
        None,
    )


def hang_figures(
    events: Sequence[ledger.Event], stopped_at: float, declared: dict[str, Any]
) -> dict[str, Any]:
    """The hang's timeline from the ledger, measured from ``stopped_at`` (the SIGSTOP), and as
    multiples of T (``declared``: the ``hang.json`` record). Missing moments are None.

    The hang's start is the one whose ``stopped`` event follows the SIGSTOP (its ``cause``,
    ``hang`` expected, is returned too);
    the requeue is that start's ``requeued``; the resume is the first ``first_update`` of a
    later start."""
    allowance = allowance_of(declared)
    stop = _first(events, Kind.STOPPED, stopped_at)
    hang_start = stop.restart if stop is not None else None
    requeued = _first(events, Kind.REQUEUED, stopped_at, hang_start)
    resumed = next(
        (
            e
            for e in events
            if e.kind == Kind.FIRST_UPDATE
            and e.time >= stopped_at
            and hang_start is not None
            and e.restart > hang_start
        ),
        None,
    )
    started = _first(events, Kind.STARTED, stopped_at)
    declared_at = declared.get("time")

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - stopped_at, 3)

    detect = since(declared_at if isinstance(declared_at, int | float) else None)
    requeue = since(requeued.time if requeued else None)
    resume = since(resumed.time if resumed else None)
    marks = [
        ("sigstop", 0.0),
        ("declared", detect),
        ("stopped", since(stop.time if stop else None)),
        ("requeued", requeue),
        ("started", since(started.time if started else None)),
        ("first_update", resume),
    ]
    return {
        "allowance_s": allowance,
        "phase": phase_of(declared),
        "detect_s": detect,
        "detect_over_T": ratio(detect, allowance),
        "requeue_s": requeue,
        "requeue_over_T": ratio(requeue, allowance),
        "resume_s": resume,
        "resume_over_T": ratio(resume, allowance),
        "phases_s": phases(marks),
        "cause": stop.get("cause") if stop else None,
        "resumed_at_update": int(resumed.get("update")) if resumed else None,
    }


def hangs_declared(events: Sequence[ledger.Event], job: str) -> int:
    """Starts of ``job`` the launcher stopped for a hang."""
    return sum(
        1
        for e in events
        if e.kind == Kind.STOPPED and e.job == job and e.get("cause") == Cause.HANG
    )


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, measured, goal) rows of the printed table."""
    hang, free = result["hang"], result["fault_free"]
    settings = result["settings"]
    limit_s, poll = settings["time_limit_s"], settings["poll_s"]
    allowance = hang["allowance_s"]
    detect_goal = f"<= {1 + poll / allowance:.2f} (T + {poll:g} s poll)" if allowance else ""
    return [
        (f"T, the allowance applied (s), phase {hang['phase']}", fmt(allowance, "g"),
         f"train, validate: max({settings['factor']:g} x slowest update, "
         f"{settings['floor_s']:g} s); a save: {settings['save_timeout_s']:g} s"),
        ("SIGSTOP -> hang declared (s)", fmt(hang["detect_s"]), ""),
        ("  as a multiple of T", fmt(hang["detect_over_T"]), detect_goal),
        ("SIGSTOP -> requeue issued (s)", fmt(hang["requeue_s"]), ""),
        ("  as a multiple of T", fmt(hang["requeue_over_T"]), ""),
        ("SIGSTOP -> first resumed update (s)", fmt(hang["resume_s"]), ""),
        ("without the watchdog: held until the time limit (s)", f"{limit_s:.0f} (stated)",
         f"= --time ({limit_s / 60:.0f} min here, 24 h by default)"),
        ("  as a multiple of T", fmt(ratio(limit_s, allowance), ".0f"), ""),
        (f"hangs declared in {free['minutes']:g} min fault-free, save+valid every update",
         str(free["false_positives"]), f"{GOAL_FALSE_POSITIVES}"),
        ("  updates / checkpoints / validations in it",
         f"{free['updates']} / {free['checkpoints']} / {free['validations']}", ""),
    ]  # fmt: skip


# --- on the cluster ----------------------------------------------------------------------------


def watchdog_options(args: argparse.Namespace) -> list[str]:
    return [
        "--hang-timeout-floor", f"{args.floor:g}", "--hang-factor", f"{args.factor:g}",
        "--hang-save-timeout", f"{args.save_timeout:g}",
        "--hang-startup-timeout", f"{args.startup_timeout:g}",
    ]  # fmt: skip


def running(job: str) -> list[str]:
    """Wait until the job runs; its nodes."""
    state = slurm.wait_for_job(job, lambda s: s.state == "RUNNING", 600, testing.STEADY)
    return slurm.hostnames(state.nodes)


def hang_run(args: argparse.Namespace, jobs: Jobs) -> dict[str, Any]:
    save = args.work_dir / "bench-hang"
    run = RunDir(save)
    quiet_wait = jobs.wait_quiet()
    fairseq = (*PER_UPDATE, "--save-interval-updates", str(args.save_interval_updates))
    job = jobs.add(
        testing.submit_tiny(args.data, save, args.max_update, "bench-hang", "2",
                         watchdog_options(args), fairseq, time_min=args.time, pace_s=args.pace_s)
    )  # fmt: skip
    victim = running(job)[-1]
    say(f"hang: job {job} running, waiting for update {args.at_update}")
    at = testing.wait_for_update(run, args.at_update, 600)
    jobs.take_seen()
    try:
        before = time.time()
        chaos.hang(job, victim)
        stopped_at = time.time()
        jobs.sample()
        say(f"hang: one rank on {victim} stopped near update {at}; waiting for the resume")

        def resumed_or_over(e: ledger.Event) -> bool:
            return e.job == job and (
                (e.kind == Kind.FIRST_UPDATE and e.restart > 0)
                or e.kind == Kind.FINISHED
                or (e.kind == Kind.STOPPED and e.get("cause") != Cause.HANG)
            )

        seen = testing.wait_for_event(run, f"job {job} to resume", resumed_or_over, 600)
        if seen.kind != Kind.FIRST_UPDATE:
            raise BenchError(f"job {job} ended without a resume after the hang: {seen.data}")
        jobs.sample()
        interference = jobs.take_seen()
        final = slurm.wait_for_job(job, timeout=900)
    finally:
        if "DRAIN" in slurm.node_info(victim).get("State", ""):
            slurm.resume(victim)
    events = ledger.read(run.ledger)
    stop = _first(events, Kind.STOPPED, stopped_at)
    declared = hang_monitor.declaration(run.incident(job, stop.restart if stop else 0)) or {}
    figures = hang_figures(events, stopped_at, declared)
    say(f"hang: declared {figures['detect_s']} s, resumed {figures['resume_s']} s after SIGSTOP")
    blamed = [e.get("node") for e in events if e.kind == Kind.BLAMED]
    return {
        **figures,
        "job_id": job,
        "state": final.state,
        "restarts": final.restarts,
        "stopped_node": victim,
        "blamed": blamed,
        "stopped_near_update": at,
        "chaos_call_s": round(stopped_at - before, 3),
        "declared": declared,
        "quiet_wait_s": quiet_wait,
        "other_jobs_during_recovery": interference,
        "save_dir": str(save),
    }


def fault_free_run(args: argparse.Namespace, jobs: Jobs) -> dict[str, Any]:
    save = args.work_dir / "bench-fault-free"
    run = RunDir(save)
    quiet_wait = jobs.wait_quiet()
    seconds = args.fault_free_minutes * 60
    job = jobs.add(
        testing.submit_tiny(args.data, save, 1_000_000, "bench-fault-free", "2",
                         watchdog_options(args), (*PER_UPDATE, "--save-interval-updates", "1"),
                         time_min=int(args.fault_free_minutes) + args.time)
    )  # fmt: skip
    running(job)
    first = testing.wait_for_event(
        run, f"job {job}'s first update", lambda e: e.kind == Kind.FIRST_UPDATE, 600
    )
    say(f"fault-free: job {job} training; watching it for {args.fault_free_minutes:g} min")

    def hang_or_end(e: ledger.Event) -> bool:
        return e.kind in (Kind.STOPPED, Kind.FINISHED) and e.job == job

    try:
        ended = testing.wait_for_event(run, "a stop", hang_or_end, seconds)
        say(f"fault-free: the run stopped early: {ended.kind} {ended.data}")
    except TimeoutError:
        ended = None  # trained the whole time: the expected outcome
    watched = round(time.time() - first.time, 1)
    slurm.cancel(job, check=False)
    final = slurm.wait_for_job(job, timeout=300)
    events = ledger.read(run.ledger)
    summary = follow.run_summary(run)
    return {
        "job_id": job,
        "minutes": args.fault_free_minutes,
        "watched_s": watched,
        "false_positives": hangs_declared(events, job),
        "incident_dirs": sum(run.incident(job, r).exists() for r in range(final.restarts + 1)),
        "stopped_early": ended.data if ended else None,
        "restarts": final.restarts,
        "updates": summary.updates,
        "checkpoints": sum(1 for e in events if e.kind == Kind.CHECKPOINT),
        "validations": len(summary.valid_losses),
        "quiet_wait_s": quiet_wait,
        "save_dir": str(save),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    with Jobs.session(args) as jobs:
        hang = hang_run(args, jobs)
        free = fault_free_run(args, jobs)
    return {
        "detect_over_T": hang["detect_over_T"],
        "requeue_over_T": hang["requeue_over_T"],
        "resume_s": hang["resume_s"],
        "without_watchdog_s": args.time * 60,
        "false_positives": free["false_positives"],
        "hang": hang,
        "fault_free": free,
        "interference": hang["other_jobs_during_recovery"],
        "goals": {"false_positives": GOAL_FALSE_POSITIVES},
        "settings": {
            "floor_s": args.floor, "factor": args.factor, "save_timeout_s": args.save_timeout,
            "startup_timeout_s": args.startup_timeout, "poll_s": hang_monitor.POLL_S,
            "stack_wait_s": hang_monitor.STACK_WAIT_S, "time_limit_s": args.time * 60,
            "max_update": args.max_update, "at_update": args.at_update, "pace_s": args.pace_s,
            "save_interval_updates": args.save_interval_updates, "preset": "tiny", "nodes": 2,
            "reference": "SIGSTOP: time.time() when chaos.hang returned",
        },
        **provenance(started, load_before, machine()),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = report.parser("hang", __doc__)
    p.add_argument("--max-update", type=int, default=200, help="the hang run")
    p.add_argument("--at-update", type=int, default=25, help="SIGSTOP once this update is logged")
    p.add_argument("--save-interval-updates", type=int, default=10, help="the hang run")
    p.add_argument("--time", type=int, default=10, help="the jobs' time limit (minutes)")
    p.add_argument("--pace-s", type=float, default=0.0,
                   help="the hang run's least seconds an update (hpc-train chaos pace)")  # fmt: skip
    p.add_argument("--floor", type=float, default=10, help="--hang-timeout-floor (s)")
    p.add_argument("--factor", type=float, default=10, help="--hang-factor")
    p.add_argument("--save-timeout", type=float, default=60, help="--hang-save-timeout (s)")
    p.add_argument("--startup-timeout", type=float, default=180, help="--hang-startup-timeout")
    p.add_argument("--fault-free-minutes", type=float, default=3,
                   help="training watched for false positives (the issue's figure: 20)")  # fmt: skip
    p.add_argument("--quiet-timeout", type=float, default=900,
                   help="seconds to wait for other jobs to leave the queue before each run")  # fmt: skip
    args = report.parse(p, argv, "hang", SMOKE)
    args.data = args.data.resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.work_dir = (args.work_dir or Path(".local/bench") / f"hang-{stamp}").resolve()
    errors = (BenchError, slurm.SlurmError, TimeoutError, RuntimeError)
    result = run_and_write("bench-hang", args.out, lambda: run(args), summary_rows, errors)
    if result is None:
        return 1
    if result["interference"]:
        print(f"warning: other jobs ran during the hang's recovery {result['interference']}: "
              "its figures are suspect, rerun on a quiet cluster", file=sys.stderr)  # fmt: skip
    print(f"its runs: {args.work_dir}")
    return 0 if result["false_positives"] == GOAL_FALSE_POSITIVES else 1


if __name__ == "__main__":
    sys.exit(main())
