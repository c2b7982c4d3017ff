"""Soak benchmark (issue 19 item 7): ``make bench-soak``.

    python -m benchmarks.soak --data .local/data/demo-bin --out benchmarks/results/soak.json

One fixed failure schedule on the local Slurm cluster (SLURM_CONF exported) over the tiny
preset, run three ways, one after the other, each given the same wall budget (``--budget-s``
from its submission) and measured at the end of it:

1. **bare** - what users do today without the toolkit (the ParallelCluster walkthrough): an
   ``sbatch --requeue`` script, ``srun`` -> ``torchrun`` -> the venv's ``fairseq-train`` with the
   toolkit's tiny-preset fairseq arguments (from ``hpc_train.submit --dry-run``), resuming from
   ``checkpoint_last.pt`` in ``--save-dir`` (fairseq's default), on 2 nodes;
2. **requeue** - ``hpc-train submit --nodes 2``: default recovery (every failure requeues);
3. **in_job** - ``hpc-train submit --nodes 2 --spares 1 --restart-in-job``.

(2) and (3) get the short hang allowances of the integration tests (``--hang-timeout-floor 10
--hang-factor 10 --hang-save-timeout 60 --hang-startup-timeout 180``). The schedule, offsets in
seconds from the run's first update (``SCHEDULE``): a preemption (``chaos.preempt``, the
``high`` partition), a transient crash (every training process on a training node SIGKILLed),
a hang (one rank SIGSTOPped), nodes taken and given back (a ``high`` job on 3 of the 4 nodes
that ends by itself). A failure whose offset comes while the run is not training hits when it
trains again (its first update after the previous failure, before the budget ends); one that
never finds it training is ``skipped``. The
bare job's ranks run ``fairseq-train``, which ``hpc_train.chaos`` does not look for: the
benchmark kills/stops them itself, on the node, through ``srun --overlap`` (``_here``).

Figures (keys of the JSON), per way under ``ways.<name>``:
- ``updates_reached``: the highest update logged within the budget;
- ``clean_s_per_update``: from the run's own uninterrupted stretch, first update to the first
  failure (the update lines' arrival times, polled every ``POLL_S``);
- ``goodput``: updates_reached x clean_s_per_update / budget (1 = ideal);
- ``failures``: each one's time, node, and ``to_first_resumed_update_s`` (the failure to the
  first update of the next start: the ledger's ``first_update`` for the toolkit, the first
  update line after a ``Loaded checkpoint`` line for bare) and ``updates_recomputed`` (the
  highest update before the resume minus the update it resumed from);
- ``updates_recomputed``: update numbers logged more than once in the budget;
- ``alive_at_end``: the Slurm job was RUNNING or PENDING (not dead) when the budget ended;
- ``ledger``: the toolkit runs' ledger events (kind, time, data), for the record.
Top-level ratios from this one run (the machine is shared and noisy): ``goodput_ratio_in_job_
over_bare``, ``resume_ratio_in_job_over_requeue`` (mean failure -> first resumed update).
Goals (issue 19): in_job goodput >= 0.85, >= 2x bare, its failure -> resume <= 0.5 of the
requeue way's, 0 updates recomputed after a notice (preemption, nodes taken).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.preemption import BenchError, Jobs, machine, say
from benchmarks.report import fmt, provenance, ratio, run_and_write
from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train import chaos
from hpc_train.runs import index, logparse

POLL_S = 0.25
HANG = ("--hang-timeout-floor", "10", "--hang-factor", "10", "--hang-save-timeout", "60",
        "--hang-startup-timeout", "180")  # fmt: skip
# (offset from the first update in seconds, failure): the same for every way
SCHEDULE: tuple[tuple[float, str], ...] = (
    (15, "preempt"), (60, "crash"), (105, "hang"), (160, "nodes_taken"),
)  # fmt: skip
GOAL_IDEAL = 0.85
GOAL_VS_BARE = 2.0
GOAL_RESUME_RATIO = 0.5
NOTICE_FAILURES = ("preempt", "nodes_taken")
BARE_TARGETS = ("fairseq-train", "bin/torchrun")
HERE = "_here"


# --- pure arithmetic ---------------------------------------------------------------------------


def scaled(schedule: Sequence[tuple[float, str]], factor: float) -> list[tuple[float, str]]:
    return [(round(offset * factor, 1), kind) for offset, kind in schedule]


def updates_of(lines: Sequence[tuple[float, str]]) -> list[tuple[float, int]]:
    """(arrival time, update) of every per-update metrics line."""
    out = []
    for t, line in lines:
        metrics = logparse.parse_metrics(line)
        if metrics and "loss" in metrics and "num_updates" in metrics:
            out.append((t, int(metrics["num_updates"])))
    return out


def clean_s_per_update(updates: Sequence[tuple[float, int]], until: float) -> float | None:
    """Seconds per update over the stretch before ``until`` (first to last update seen)."""
    stretch = [(t, u) for t, u in updates if t < until]
    if len(stretch) < 2 or stretch[-1][1] <= stretch[0][1]:
        return None
    return (stretch[-1][0] - stretch[0][0]) / (stretch[-1][1] - stretch[0][1])


def resume_in_log(lines: Sequence[tuple[float, str]], after: float) -> tuple[float, int] | None:
    """(time, update) of the first update line after the first resume line seen after ``after``."""
    resumed = False
    for t, line in lines:
        if t < after:
            continue
        if not resumed:
            resumed = logparse.RESUME_RE.search(line) is not None
            continue
        found = updates_of([(t, line)])
        if found:
            return found[0]
    return None


def recomputed_at(updates: Sequence[tuple[float, int]], resumed: tuple[float, int]) -> int:
    """Updates trained twice by one resume: the highest before it minus the one it resumed from."""
    before = [u for t, u in updates if t < resumed[0]]
    return max(0, max(before, default=0) - (resumed[1] - 1))


def duplicates(updates: Sequence[tuple[float, int]]) -> int:
    numbers = [u for _, u in updates]
    return len(numbers) - len(set(numbers))


def first_update_after(events: Sequence[ledger.Event], after: float) -> float | None:
    return min((e.time for e in events if e.kind == "first_update" and e.time > after),
               default=None)  # fmt: skip


def training_nodes(events: Sequence[ledger.Event]) -> list[str]:
    """The nodes of the latest start or in-job restart (the spare is not one)."""
    nodes: list[str] = []
    for e in sorted(events, key=lambda e: e.time):
        if e.kind == "started" and e.get("nodes"):
            nodes = list(e.get("nodes"))
        elif e.kind == "restarted" and e.get("members"):
            nodes = list(e.get("members"))
    return nodes


def bare_script(nodes: int, out: Path, train_sh: Path, partition: str) -> str:
    """The bare way's ``job.slurm``: sbatch --requeue, ``srun`` runs ``train.sh`` on each node."""
    return f"""#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --requeue
#SBATCH --partition={partition}
#SBATCH --open-mode=append
#SBATCH --output={out}
#SBATCH --job-name=bench-soak-bare
export MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
export PORT=$((29500 + SLURM_JOB_ID % 20000))
srun --unbuffered bash {train_sh}
"""


def bare_train_sh(nodes: int, rank_sh: Path) -> str:
    """The bare way's ``train.sh`` (one per node): torchrun, no restarts, runs ``rank.sh``."""
    bindir = Path(sys.executable).parent
    return f"""#!/bin/bash
export OMP_NUM_THREADS=1
exec {bindir}/torchrun --nnodes={nodes} --nproc_per_node=1 --rdzv_backend=c10d \\
  --rdzv_endpoint=$MASTER:$PORT --rdzv_id=$SLURM_JOB_ID --max_restarts=0 \\
  --no-python bash {rank_sh}
"""


def bare_rank_sh(fairseq_argv: Sequence[str]) -> str:
    """The bare way's ``rank.sh`` (one per rank): the venv's fairseq-train with torchrun's rank.
    On CPU fairseq takes its world size from the CUDA device count (1) unless told, so the
    rank's world is passed, as a CPU user's script must (on GPUs fairseq reads torchrun's env)."""
    bindir = Path(sys.executable).parent
    args = " ".join(shlex.quote(a) for a in fairseq_argv)
    return f"""#!/bin/bash
exec {bindir}/fairseq-train {args} --distributed-init-method env:// \\
  --distributed-world-size $WORLD_SIZE --distributed-rank $RANK --distributed-no-spawn
"""


def fairseq_args(torchrun_line: str) -> list[str]:
    """The fairseq arguments of the toolkit's torchrun line (after ``-m hpc_train.worker.train``)."""
    words = shlex.split(torchrun_line)
    return words[words.index("hpc_train.worker.train") + 1 :]


# --- on the cluster ----------------------------------------------------------------------------


@dataclass
class Way:
    name: str
    job: str
    log: Path
    save: Path
    toolkit: bool
    lines: list[tuple[float, str]] = field(default_factory=list)
    _offset: int = 0

    def poll(self) -> None:
        if not self.log.exists():
            return
        with self.log.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        now = time.time()
        self.lines += [(now, s) for s in chunk[:end].decode(errors="replace").splitlines()]

    def events(self) -> list[ledger.Event]:
        return ledger.read(RunDir(self.save).ledger) if self.toolkit else []


def here(job: str, node: str, action: str) -> int:
    """On the node: SIGKILL the bare job's torchrun and ranks, or SIGSTOP one rank."""
    procs = list(chaos._processes(job, node, BARE_TARGETS))
    if action == "kill":
        for pid, _ in procs:
            os.kill(pid, signal.SIGKILL)
        return len(procs)
    ranks = sorted(pid for pid, cmd in procs if "bin/torchrun" not in cmd)
    if ranks:
        os.kill(ranks[0], signal.SIGSTOP)
    return len(ranks[:1])


def on_bare_node(job: str, node: str, action: str) -> None:
    slurm.run(["srun", f"--jobid={job}", "--overlap", f"--nodelist={node}", "-N1", "-n1",
               sys.executable, "-m", "benchmarks.soak", HERE, job, node, action], timeout=60)  # fmt: skip


def target_node(way: Way) -> str:
    nodes = training_nodes(way.events()) if way.toolkit else []
    running = chaos.running_nodes(way.job)
    nodes = [n for n in nodes if n in running] or running
    return nodes[-1]  # not task 0's node where there is a choice


def inject(kind: str, way: Way, args: argparse.Namespace, jobs: Jobs) -> dict[str, Any]:
    t = time.time()
    node = None
    if kind == "preempt":
        jobs.add(chaos.preempt(way.job, "high", args.hold_s))
    elif kind == "nodes_taken":
        jobs.add(slurm.sbatch(["-p", "high", "-N3", "--exclusive", "-o", "/dev/null",
                               "--job-name=bench-soak-blocker", f"--wrap=sleep {args.taken_s}"]))  # fmt: skip
    else:
        node = target_node(way)
        if way.toolkit and kind == "crash":
            chaos.kill_node(way.job, node, stop_slurmd=False)
        elif way.toolkit:
            chaos.hang(way.job, node)
        else:
            on_bare_node(way.job, node, "kill" if kind == "crash" else "stop")
    return {"kind": kind, "time": t, "node": node}


def resumed_since(way: Way, last: float | None) -> bool:
    """The run trains again after the last failure (its first update after it is logged): the
    next failure must not land in a restart, where it would hit no training process."""
    if last is None:
        return True
    if way.toolkit:
        return first_update_after(way.events(), last) is not None
    return resume_in_log(way.lines, last) is not None


def is_running(job: str) -> bool:
    return slurm.job_state(job).state == "RUNNING"


def soak(way: Way, args: argparse.Namespace, jobs: Jobs, submitted: float) -> dict[str, Any]:
    """Poll the way's log for the budget, injecting the schedule; the figures."""
    deadline = submitted + args.budget_s
    schedule = scaled(SCHEDULE, args.scale)
    first: float | None = None
    done: list[dict[str, Any]] = []
    pending = list(schedule)
    errors: list[str] = []
    worker: threading.Thread | None = None
    while time.time() < deadline:
        way.poll()
        if first is None and updates_of(way.lines):
            first = updates_of(way.lines)[0][0]
            say(f"{way.name}: first update {first - submitted:.1f} s after submission")
        busy = worker is not None and worker.is_alive()
        due = first is not None and pending and not busy and time.time() >= first + pending[0][0]
        if due and resumed_since(way, done[-1]["time"] if done else None) and is_running(way.job):
            offset, kind = pending.pop(0)

            def go(kind: str = kind, offset: float = offset) -> None:
                try:
                    done.append({**inject(kind, way, args, jobs), "offset_s": offset})
                    say(f"{way.name}: {kind} injected ({done[-1]['node'] or '-'})")
                except (slurm.SlurmError, BenchError, OSError) as err:
                    errors.append(f"{kind}: {err}")
                    say(f"{way.name}: {kind} failed: {err}")

            worker = threading.Thread(target=go, daemon=True)
            worker.start()
        time.sleep(POLL_S)
    state = slurm.job_state(way.job)
    if worker is not None:
        worker.join(timeout=60)
    way.poll()
    lines = [(t, s) for t, s in way.lines if t <= deadline]
    updates = updates_of(lines)
    events = way.events()
    failures = []
    for f in sorted(done, key=lambda f: f["time"]):
        resumed_log = resume_in_log(lines, f["time"])
        resumed_at = first_update_after(events, f["time"]) if way.toolkit else None
        if resumed_at is not None and resumed_at > deadline:
            resumed_at = None
        resumed_t = resumed_at if way.toolkit else (resumed_log[0] if resumed_log else None)
        failures.append({
            **f, "time": round(f["time"], 3),
            "to_first_resumed_update_s": round(resumed_t - f["time"], 1) if resumed_t else None,
            "log_resume_s": round(resumed_log[0] - f["time"], 1) if resumed_log else None,
            "resumed_from_update": resumed_log[1] - 1 if resumed_log else None,
            "updates_recomputed": recomputed_at(updates, resumed_log) if resumed_log else None,
        })  # fmt: skip
    first_failure = min((f["time"] for f in done), default=deadline)
    clean = clean_s_per_update(updates, first_failure)
    reached = max((u for _, u in updates), default=0)
    return {
        "job_id": way.job,
        "updates_reached": reached,
        "clean_s_per_update": clean,
        "goodput": ratio(reached * clean, args.budget_s) if clean else None,
        "first_update_after_submit_s": round(first - submitted, 1) if first else None,
        "failures": failures,
        "skipped": [kind for _, kind in pending],
        "inject_errors": errors,
        "updates_recomputed": duplicates(updates),
        "state_at_end": state.state,
        "restarts": state.restarts,
        "alive_at_end": state.state in ("RUNNING", "PENDING", "REQUEUED", "CONFIGURING"),
        "ledger": [{"kind": e.kind, "time": round(e.time, 3), **e.data} for e in events],
        "save_dir": str(way.save),
    }


def toolkit_way(name: str, options: Sequence[str], args: argparse.Namespace, jobs: Jobs) -> Way:
    save = args.work_dir / name
    try:
        job = index.submit_tiny(args.data, save, args.max_update, f"bench-soak-{name}", "2",
                                options, ("--log-interval", "1"), time_min=30)  # fmt: skip
    except RuntimeError as err:
        raise BenchError(str(err)) from None
    return Way(name, jobs.add(job), RunDir(save).train_log, save, toolkit=True)


def bare_way(args: argparse.Namespace, jobs: Jobs) -> Way:
    save = args.work_dir / "bare"
    save.mkdir(parents=True, exist_ok=True)
    dry = subprocess.run(
        [sys.executable, "-m", "hpc_train.submit", "--preset", "tiny", "--gpus-per-node", "0",
         "--nodes", "2", "--data", str(args.data), "--save-dir", str(save),
         "--max-update", str(args.max_update), "--dry-run", "--", "--log-interval", "1"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    line = next(s for s in dry.stdout.splitlines() if s.startswith("torchrun "))
    log = save / "slurm.out"
    script, train_sh, rank_sh = save / "job.slurm", save / "train.sh", save / "rank.sh"
    rank_sh.write_text(bare_rank_sh(fairseq_args(line)))
    train_sh.write_text(bare_train_sh(2, rank_sh))
    script.write_text(bare_script(2, log, train_sh, "low"))
    job = slurm.run(["sbatch", "--parsable", str(script)]).strip().split(";")[0]
    return Way("bare", jobs.add(job), log, save, toolkit=False)


def cleanup(jobs: Jobs, way: Way | None) -> None:
    """Cancel everything submitted; resume any node left drained or down."""
    jobs.cancel_unfinished()
    if way is not None:
        slurm.cancel(way.job, check=False)
        deadline = time.time() + 60
        while not slurm.job_state(way.job).finished and time.time() < deadline:
            time.sleep(1)
    out = slurm.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
    states = dict(ln.split() for ln in out.splitlines() if ln.strip())  # a node per partition
    for node, st in states.items():
        if any(x in st for x in ("drain", "drng", "down")):
            try:
                slurm.resume(node)
                say(f"resumed {node} ({st})")
            except slurm.SlurmError as err:
                say(f"could not resume {node} ({st}): {err}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    ways: dict[str, Any] = {}
    makers: list[tuple[str, Callable[[Jobs], Way]]] = [
        ("in_job", lambda jobs: toolkit_way(
            "in_job", ("--spares", "1", "--restart-in-job", *HANG), args, jobs)),
        ("requeue", lambda jobs: toolkit_way("requeue", HANG, args, jobs)),
        ("bare", lambda jobs: bare_way(args, jobs)),
    ]  # fmt: skip
    with Jobs.session(args) as jobs:
        for name, make in makers:
            if args.only and name not in args.only:
                continue
            jobs.wait_quiet()
            way = None
            try:
                submitted = time.time()
                way = make(jobs)
                say(f"{name}: job {way.job} submitted, {args.budget_s} s budget")
                ways[name] = soak(way, args, jobs, submitted)
                say(f"{name}: reached update {ways[name]['updates_reached']}, "
                    f"goodput {fmt(ways[name]['goodput'])}")  # fmt: skip
            finally:
                cleanup(jobs, way)
            partial = summarize(ways, args, started, load_before)
            report.write_json(args.work_dir / "partial.json", partial)
    return summarize(ways, args, started, load_before)


def mean_resume(way: dict[str, Any] | None) -> float | None:
    values = [f["to_first_resumed_update_s"] for f in (way or {}).get("failures", [])
              if f["to_first_resumed_update_s"] is not None]  # fmt: skip
    return statistics.mean(values) if values else None


def notice_recomputed(way: dict[str, Any] | None) -> int | None:
    values = [f["updates_recomputed"] for f in (way or {}).get("failures", [])
              if f["kind"] in NOTICE_FAILURES and f["updates_recomputed"] is not None]  # fmt: skip
    return sum(values) if values else None


def summarize(
    ways: dict[str, Any], args: argparse.Namespace, started: float, load: tuple[float, ...]
) -> dict[str, Any]:
    def goodput(name: str) -> float | None:
        return ways.get(name, {}).get("goodput")

    return {
        "goodput": {name: w["goodput"] for name, w in ways.items()},
        "goodput_ratio_in_job_over_bare": ratio(goodput("in_job"), goodput("bare")),
        "mean_resume_s": {name: mean_resume(w) for name, w in ways.items()},
        "resume_ratio_in_job_over_requeue": ratio(mean_resume(ways.get("in_job")),
                                                  mean_resume(ways.get("requeue"))),
        "notice_updates_recomputed_in_job": notice_recomputed(ways.get("in_job")),
        "ways": ways,
        "goals": {"in_job_goodput_min": GOAL_IDEAL, "in_job_over_bare_min": GOAL_VS_BARE,
                  "resume_ratio_max": GOAL_RESUME_RATIO, "notice_updates_recomputed": 0},
        "settings": {"budget_s": args.budget_s, "schedule": scaled(SCHEDULE, args.scale),
                     "schedule_from": "the run's first update", "hold_s": args.hold_s,
                     "taken_s": args.taken_s, "taken_nodes": 3, "max_update": args.max_update,
                     "nodes": 2, "preset": "tiny", "toolkit_hang_options": list(HANG)},
        **provenance(started, (load[0], load[1], load[2]), machine()),
    }  # fmt: skip


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    ways = result["ways"]

    def per(key: str, spec: str = ".2f") -> str:
        return ", ".join(f"{n} {fmt(w.get(key), spec)}" for n, w in ways.items())

    return [
        ("goodput (of ideal)", per("goodput"), f"in_job >= {GOAL_IDEAL}"),
        ("updates reached", per("updates_reached", "d"), ""),
        ("clean s/update", per("clean_s_per_update", ".3f"), ""),
        ("goodput in_job / bare", fmt(result["goodput_ratio_in_job_over_bare"]),
         f">= {GOAL_VS_BARE}"),
        ("failure -> resumed update, mean (s)",
         ", ".join(f"{n} {fmt(v, '.1f')}" for n, v in result["mean_resume_s"].items()), ""),
        ("resume in_job / requeue", fmt(result["resume_ratio_in_job_over_requeue"]),
         f"<= {GOAL_RESUME_RATIO}"),
        ("updates recomputed after notices, in_job",
         fmt(result["notice_updates_recomputed_in_job"], "g"), "0"),
        ("alive at the end", ", ".join(f"{n} {w['alive_at_end']}" for n, w in ways.items()), ""),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 4 and argv[0] == HERE:
        print(f"{argv[3]}: {here(argv[1], argv[2], argv[3])} process(es)")
        return 0
    p = report.parser("soak", __doc__)
    p.add_argument("--budget-s", type=int, default=300, help="wall budget of each way")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the schedule's offsets")
    p.add_argument("--max-update", type=int, default=20000, help="more than any way reaches")
    p.add_argument("--hold-s", type=int, default=10, help="seconds the preemptor holds")
    p.add_argument("--taken-s", type=int, default=30, help="seconds 3 nodes are taken")
    p.add_argument("--only", nargs="*", help="ways to run (default: all)")
    p.add_argument("--quiet-timeout", type=float, default=300,
                   help="seconds to wait for other jobs to leave the queue before each way")  # fmt: skip
    args = p.parse_args(argv)
    args.data = args.data.resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.work_dir = (args.work_dir or Path(".local/bench") / f"soak-{stamp}").resolve()
    errors = (BenchError, slurm.SlurmError, subprocess.CalledProcessError)
    result = run_and_write("bench-soak", args.out, lambda: run(args), summary_rows, errors)
    if result is None:
        return 1
    print(f"its runs: {args.work_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
