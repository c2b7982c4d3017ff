"""Scale benchmark (issue 46): ``make bench-scale``.

    python -m benchmarks.scale --data .local/data/demo-bin --out benchmarks/results/scale.json
    python -m benchmarks.scale --data .local/data/demo-bin --real 2,4 --hollow 2,16
    python -m benchmarks.scale --data .local/data/demo-bin --smoke
    python -m benchmarks.scale --reanalyze benchmarks/results/scale.json  # from its run's files

The control plane at the mission's node counts, each figure beside the same worker kind's 2-node
value, in one run: real nodes (the tiny fairseq preset, 2, 4 and 16) and hollow ones
(``submit --hollow``: a stand-in for the model, ``hpc_train.worker.hollow``; 2, 16 and 64, or the
most that fit in memory). The benchmark brings up a local cluster of its own (``cluster.sh`` in
``--work-dir``, ports ``--port``, job ids from ``--first-job-id``, node names s1, s2 ...) with two
nodes more than the largest size (a spare, and one to replace a drained node).

First the unique memory of a node is measured (PSS: the launcher, the torchrun agent and the
rank, ``benchmarks.scale_probe.memory``) on the 2-node hollow run; hollow sizes above what
``--memory-budget-gib`` holds (the machine's memory less ``--leave-gib`` for other users) are
lowered to the most that fit, said with those figures. Then, per kind and size, two jobs:

1. **rounds** (``--nodes N --spares 1``): submit -> first update; a steady window (the unique
   memory of task 0's node and of the last node; the save dir's file operations of those two
   nodes' processes under strace, per update and per second; Slurm calls per minute); one rank
   SIGKILLed -> the in-job round -> first update, ``--kills`` times (3), each on another node
   from the last, never task 0's (one at 2 nodes), the size's figure the kill of the median
   toolkit share; one rank SIGSTOPped -> the hang declared (in
   units of its allowance T) -> the round -> first update; a notice (USR2) -> saved on notice,
   stopped, requeued by submitit -> first update -> the run completes (0 updates missing).
2. **requeue** (``--nodes N``): one rank SIGKILLed -> task 0's requeue -> first update ->
   complete.

For each event: its timeline from the ledger (task 0's ``stopped``, ``restarted``,
``requeued``; rank 0's ``first_update``), the nodes' exit records, ``hang.json`` and the
processes' own start times (/proc, ``scale_probe.Scanner``); the toolkit's own share
(``toolkit_s``: failure seen -> decision written -> next torchrun launched, its polls, timeouts
and look-ups; a requeue's leaves out its launchers starting, ``launchers_up_s``, a hang's its
nodes' torchrun agents shutting down, ``teardown_s``, and a notice's its ranks finishing the
update in flight and saving, ``ranks_save_s``, each said beside it); the Slurm
calls the job made (``scale_probe.CallLog``: Slurm's clients shadowed on the job's PATH, each
call logged then run), by kind and per node; the files created in the save dir per node; CPU
seconds per node of the start-up; each decision's own account from task 0's log (``weighed``:
reading its evidence, Slurm's answers, and its CPU, ``decision_cpu_s``: the work, where the
rest is waiting on a loaded machine). The rest of the wall time on a 2-core machine is many
processes importing torch: reported beside, not held to a goal.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from benchmarks import report
from benchmarks import scale_probe as probe
from benchmarks.preemption import BenchError, machine, missing_updates, say
from benchmarks.report import fmt, provenance, run_and_write
from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir, incident_reports
from hpc_core.slurm_env import CONF
from hpc_core.wait import Backoff, wait_until
from hpc_train import testing
from hpc_train.contract import StartFiles, read_beats
from hpc_train.launch.context import LOG_STAMP
from hpc_train.launch.recovery import Weighed
from hpc_train.runs import follow
from hpc_train.watch import hang_monitor

T = TypeVar("T")
CLUSTER_SH = Path(__file__).resolve().parents[1] / "slurm" / "local" / "cluster.sh"
POLL = Backoff(0.25, 1.0, 0.25)
PER_UPDATE = ("--log-interval", "1", "--save-interval-updates", "10")
GOAL_TOOLKIT_RATIO = 1.5  # the toolkit's share of a recovery at the largest size vs 2 nodes
GOAL_DETECT_OVER_T = 2.0
GOAL_CALLS_RATIO = 4.0  # Slurm calls per event at the largest size vs 2 nodes
LEAVE_GIB = 8.0  # memory left to the machine's other users
# on a node's measured unique memory: its slurmstepd (not measured), the page cache of the run's
# files (task 0's launcher, which holds what verifying a checkpoint imports, is counted apart)
MARGIN = 1.1
SMOKE = {"real": "", "hollow": "2", "max_update": 70, "trace_s": 4.0, "hang_floor_s": 10.0,
         "pace_s": 0.1, "after": 5}  # fmt: skip


def sizes(text: str) -> list[int]:
    return sorted({int(s) for s in text.split(",") if s.strip()})


def build_parser() -> argparse.ArgumentParser:
    p = report.parser("scale", __doc__)
    p.add_argument("--real", default="2,4,16", help="real node counts (tiny fairseq)")
    p.add_argument("--hollow", default="2,16,64", help="hollow node counts (submit --hollow)")
    p.add_argument("--max-update", type=int, default=400, help="updates of a rounds job")
    p.add_argument("--after", type=int, default=8, help="updates trained before each fault")
    p.add_argument("--kills", type=int, default=3,
                   help="kills -> in-job round per rounds job, each on another node, at most "
                        "one a node but task 0's (its figure: the median's)")  # fmt: skip
    p.add_argument(
        "--pace-s", type=float, default=0.25, help="least seconds an update (chaos pace)"
    )
    p.add_argument(
        "--hang-floor-s", type=float, default=30.0, help="the runs' --hang-timeout-floor"
    )
    p.add_argument("--trace-s", type=float, default=10.0, help="the steady window (strace)")
    p.add_argument("--memory-budget-gib", type=float, help="default: MemTotal less --leave-gib")
    p.add_argument("--leave-gib", type=float, default=LEAVE_GIB, help="for the machine's others")
    port = int(os.environ.get("HPC_TRAIN_CLUSTER_PORT") or 16817) + 500
    first = int(os.environ.get("HPC_TRAIN_CLUSTER_FIRST_JOB_ID") or 1) + 500_000
    p.add_argument("--port", type=int, default=port, help="the benchmark cluster's first port")
    p.add_argument("--first-job-id", type=int, default=first, help="its first job id")
    return p


# --- the benchmark's own cluster ----------------------------------------------------------------


@dataclass
class Cluster:
    """The local cluster this benchmark brings up in ``directory`` (``cluster.sh``), and its
    environment for every Slurm client of the benchmark and the jobs."""

    directory: Path
    port: int
    first_job_id: int
    nodes: int = 0

    def env(self) -> dict[str, str]:
        return {"HPC_TRAIN_CLUSTER_DIR": str(self.directory),
                "HPC_TRAIN_CLUSTER_PORT": str(self.port),
                "HPC_TRAIN_CLUSTER_FIRST_JOB_ID": str(self.first_job_id),
                "HPC_TRAIN_CLUSTER_NODES": str(self.nodes), "HPC_TRAIN_CLUSTER_NODE_PREFIX": "s",
                "HPC_TRAIN_CLUSTER_NODE_MB": "1",  # the benchmark sizes its runs itself
                CONF: str(self.directory / "etc" / "slurm.conf")}  # fmt: skip

    def sh(self, *args: str) -> str:
        proc = subprocess.run(["bash", str(CLUSTER_SH), *args], capture_output=True, text=True,
                              env={**os.environ, **self.env()}, timeout=600)  # fmt: skip
        if proc.returncode != 0:
            raise BenchError(f"cluster.sh {' '.join(args)}: {proc.stderr.strip()[-400:]}")
        return proc.stderr

    @contextlib.contextmanager
    def up(self, nodes: int) -> Iterator[Cluster]:
        self.nodes = nodes
        said = self.sh("up")
        os.environ.update(self.env())
        say(said.strip().splitlines()[-1] if said.strip() else f"cluster up: {nodes} nodes")
        try:
            yield self
        finally:
            self.sh("down")

    def resume_drained(self) -> None:
        for node, state in slurm.partition_nodes("low").items():
            if not slurm.node_usable(state):
                with contextlib.suppress(slurm.SlurmError):
                    slurm.resume(node)


# --- one job ------------------------------------------------------------------------------------


@dataclass
class Setup:
    args: argparse.Namespace
    calls: probe.CallLog
    scanner: probe.Scanner
    jobs: list[str] = field(default_factory=list)


@dataclass
class Job:
    """A job of this benchmark: its id, run dir, kind and size."""

    setup: Setup
    id: str
    save: Path
    nodes: int
    hollow: bool

    @property
    def run(self) -> RunDir:
        return RunDir(self.save)

    def events(self, kind: Kind, after: float = 0.0) -> list[ledger.Event]:
        """This job's events of ``kind`` since ``after`` (its rounds' too: ``41.1``)."""
        mine = (e for e in ledger.read(self.run.ledger) if e.job.split(".")[0] == self.id)
        return [e for e in mine if e.kind == kind and e.time >= after]

    def first(self, kind: Kind, after: float) -> ledger.Event | None:
        found = self.events(kind, after)
        return found[0] if found else None

    def wait(self, what: str, check: Callable[[], T | None], timeout: float) -> T:
        try:
            return wait_until(check, f"{what} (job {self.id})", timeout, POLL)
        except TimeoutError as err:
            raise BenchError(str(err)) from err

    def wait_event(self, kind: Kind, after: float, timeout: float) -> ledger.Event:
        return self.wait(str(kind), lambda: self.first(kind, after), timeout)

    def members(self) -> list[str]:
        """The nodes training now: the last round's members, else the start's nodes."""
        rounds = self.events(Kind.RESTARTED)
        starts = self.events(Kind.STARTED)
        latest = max([*rounds, *starts], key=lambda e: e.time)
        return [str(n) for n in (latest.get("members") or latest.get("nodes") or [])]

    def update(self) -> int:
        return follow.run_summary(self.run).updates

    def startup_s(self) -> float:
        return 120.0 + 6.0 * self.nodes


def save_dir(work_dir: Path, name: str, hollow: bool, nodes: int) -> Path:
    """The save dir of a benchmark job (``rounds``, ``requeue``) of one kind and size."""
    return work_dir / f"{name}-{'hollow' if hollow else 'real'}-{nodes}"


def traces_of(work_dir: Path, job: str) -> Path:
    """Where a job's steady window's strace files go (``<it>-<label>.txt``)."""
    return work_dir / f"strace-{job}"


def submit(setup: Setup, name: str, nodes: int, hollow: bool, max_update: int,
           extra: Sequence[str] = ()) -> tuple[Job, float]:  # fmt: skip
    """Submit through the real CLI, Slurm's clients shadowed on the job's PATH."""
    args = setup.args
    save = save_dir(args.work_dir, name, hollow, nodes)
    shutil.rmtree(save, ignore_errors=True)  # an earlier run's: its ledger and checkpoints
    floor = args.hang_floor_s
    options = ["--hang-timeout-floor", str(floor), "--hang-factor", "3",
               "--hang-save-timeout", str(max(60.0, 2 * floor)),
               "--hang-startup-timeout", str(600 + 10 * nodes), "--global-batch", str(8 * nodes),
               "--time", "60", *(["--hollow"] if hollow else []), *extra]  # fmt: skip
    submitted = time.time()
    job_id = testing.submit_tiny(args.data, save, max_update, name, str(nodes), options,
                                 PER_UPDATE, env=setup.calls.env(), pace_s=args.pace_s)  # fmt: skip
    setup.jobs.append(job_id)
    setup.scanner.watch(job_id)
    return Job(setup, job_id, save, nodes, hollow), submitted


# --- what each event costs ----------------------------------------------------------------------


def since(marks: dict[str, float | None], base: float) -> dict[str, float | None]:
    """Each mark as seconds after ``base`` (None where it was not seen)."""
    return {k: None if v is None else round(v - base, 2) for k, v in marks.items()}


def span(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else round(later - earlier, 2)


def launched(job: Job, after: float, kind: str = "agent") -> tuple[float | None, float | None]:
    """(first, last) start of the job's processes of ``kind`` since ``after`` (one a node)."""
    found = job.setup.scanner.of(job.id, kind, since=after)
    if not found:
        return None, None
    return found[0].started, found[-1].started


def costs(job: Job, began: float, ended: float, before: set[str]) -> dict[str, Any]:
    """What the job asked of Slurm and of the save dir between ``began`` and ``ended``:
    calls (``scale_probe.summarize_calls``), files created, per node."""
    calls = probe.summarize_calls(c for c in job.setup.calls.calls(began, ended) if c.node != "-")
    created = len(probe.files_under(job.save) - before)
    calls["per_node"] = round(calls["rpc"] / job.nodes, 2)
    return {"slurm_calls": calls, "files_created": created,
            "files_created_per_node": round(created / job.nodes, 2)}  # fmt: skip


def startup_cpu(job: Job, after: float) -> float:
    """CPU seconds per node of the processes started since ``after`` (agents, ranks,
    launchers), as far as they have run."""
    procs = job.setup.scanner.of(job.id, since=after)
    return round(sum(p.cpu_s for p in procs if p.kind != "srun") / job.nodes, 2)


def start_figures(job: Job, submitted: float) -> dict[str, Any]:
    """submit -> the launchers -> torchrun on every node -> the first update."""
    before: set[str] = set()
    first = job.wait_event(Kind.FIRST_UPDATE, submitted, job.startup_s())
    launchers, _ = launched(job, submitted, "launcher")
    first_agent, last_agent = launched(job, submitted)
    time.sleep(1.0)  # one more look at the processes' CPU seconds
    marks = {"launchers": launchers, "first_torchrun": first_agent, "last_torchrun": last_agent,
             "first_update": first.time}  # fmt: skip
    return {"at": since(marks, submitted), "total_s": span(first.time, submitted),
            "toolkit_s": span(last_agent, launchers), "startup_s": span(first.time, last_agent),
            "cpu_s_per_node": startup_cpu(job, submitted),
            **costs(job, submitted, first.time, before)}  # fmt: skip


def steady(job: Job) -> dict[str, Any]:
    """Training undisturbed: the unique memory and the save dir's file operations per update of
    task 0's node and the last one (traced at once), the Slurm calls per minute."""
    args, nodes = job.setup.args, job.members()
    chosen = {"task0": nodes[0], "last": nodes[-1]}
    out: dict[str, Any] = {"memory": {k: probe.memory(job.setup.scanner, job.id, n)
                                      for k, n in chosen.items()}}  # fmt: skip
    pids = {k: [p.pid for p in job.setup.scanner.of(job.id, node=n) if p.ended is None]
            for k, n in chosen.items()}  # fmt: skip
    beats = job.run.heartbeats(job.id, 0, nodes[-1])
    began, at = time.time(), max((b.update for b in read_beats(beats)), default=0)
    traced = probe.trace_files(
        pids, args.trace_s, job.save.resolve(), traces_of(args.work_dir, job.id)
    )
    ops = {k: probe.count_ops(v) for k, v in traced.items()}
    done = max((b.update for b in read_beats(beats)), default=0) - at
    out["file_ops_per_update"] = {
        k: {**{op: round(n / max(done, 1), 2) for op, n in counts.items()}, "updates": done}
        for k, counts in ops.items()
    }
    # the polls are paced by the clock (heartbeats, a hang's looks, the straggler watch), the
    # saves and beats by updates: an update slower on a loaded machine counts more polls
    out["file_ops_per_second"] = {
        k: {**{op: round(n / args.trace_s, 2) for op, n in counts.items()}, "seconds": args.trace_s}
        for k, counts in ops.items()
    }
    out["file_ops_by_pace"] = {
        k: by_pace(probe.count_by_pace(v), done, args.trace_s) for k, v in traced.items()
    }
    calls = job.setup.calls.calls(began, time.time())
    minutes = (time.time() - began) / 60
    out["slurm_calls_per_minute"] = round(sum(1 for c in calls if c.node != "-") / minutes, 2)
    return out


def by_pace(counts: dict[str, int], updates: int, seconds: float) -> dict[str, float | None]:
    """A node's file operations in a traced window of ``updates`` updates and ``seconds``: those
    paced by updates per update, the timed polls per second (``scale_probe.pace``)."""
    return {
        "per_update": round(counts["update"] / updates, 2) if updates else None,
        "polls_per_second": round(counts["clock"] / seconds, 2),
    }


def views(job: Job) -> dict[str, Any]:
    """``hpc-train status``, ``logs`` and ``doctor`` on the running job, as a user runs them:
    seconds, lines and the longest line of each."""
    out = {}
    for verb in ("status", "logs", "doctor"):
        began = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "hpc_train.command", verb, str(job.save)],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        lines = proc.stdout.splitlines()
        out[verb] = {"seconds": round(time.monotonic() - began, 2), "lines": len(lines),
                     "longest": max((len(ln) for ln in lines), default=0), "exit": proc.returncode}  # fmt: skip
    return out


def recovery(job: Job, fault: float, seen: float | None, before: set[str],
             round_: bool) -> dict[str, Any]:  # fmt: skip
    """After a fault at ``fault`` seen by task 0 at ``seen``: task 0's decision, the next
    torchrun on every node, the first update; the toolkit's share and what it asked."""
    timeout = job.startup_s() + 240
    stopped = job.wait_event(Kind.STOPPED, fault, timeout)
    decided = job.wait_event(Kind.RESTARTED if round_ else Kind.REQUEUED, fault, timeout)
    first = job.wait_event(Kind.FIRST_UPDATE, decided.time, timeout + 120)
    launchers, _ = launched(job, decided.time, "launcher")
    first_agent, last_agent = launched(job, decided.time)
    relaunch_from = decided.time if round_ else launchers
    marks = {"seen": seen, "stopped": stopped.time, "decided": decided.time,
             "launchers": None if round_ else launchers, "first_torchrun": first_agent,
             "last_torchrun": last_agent, "first_update": first.time}  # fmt: skip
    decide_s, relaunch_s = span(decided.time, seen), span(last_agent, relaunch_from)
    toolkit = None if decide_s is None or relaunch_s is None else round(decide_s + relaunch_s, 2)
    return {"at": since(marks, fault), "total_s": span(first.time, fault),
            "detect_s": span(seen, fault), "decide_s": decide_s, "relaunch_s": relaunch_s,
            "slurm_hold_s": None if round_ else span(launchers, decided.time),
            "startup_s": span(first.time, last_agent), "toolkit_s": toolkit,
            "cpu_s_per_node": startup_cpu(job, decided.time),
            **costs(job, fault, first.time, before)}  # fmt: skip


def weighings(size: dict[str, Any], work_dir: Path, hollow: bool, nodes: int) -> None:
    """Each decision's own account (``weighed``: ``weighing``; its CPU, ``decision_cpu_s``) in
    its event's figures, read once the size's jobs have ended (their logs whole), also by a
    reanalysis: every kill's, the hang's, the requeue's, each found by its fault's time."""
    for name, kind, events in (("rounds", Kind.RESTARTED, [*kills(size), size["rounds"]["hang"]]),
                               ("requeue", Kind.REQUEUED, [size["requeue"]["kill_requeue"]])):  # fmt: skip
        run = RunDir(save_dir(work_dir, name, hollow, nodes))
        recorded = ledger.read(run.ledger)
        for figures in events:
            decided = decision_after(recorded, kind, figures.get("fault_at"))
            if decided is not None:
                figures["weighed"] = weighing(run, str(size[name]["job"]), decided.time)
                figures["decision_cpu_s"] = (figures["weighed"] or {}).get("cpu_s")


def decision_after(
    events: Sequence[ledger.Event], kind: Kind, fault: float | None
) -> ledger.Event | None:
    """Task 0's first decision of ``kind`` in a job's ledger ``events`` after the fault at
    ``fault`` (None: not known)."""
    if fault is None:
        return None
    return next((e for e in events if e.kind == kind and e.time >= fault), None)


def kills(size: dict[str, Any]) -> list[dict[str, Any]]:
    """The rounds job's kills -> in-job round (a result from before ``--kills``: its one)."""
    return size["rounds"].get("kill_rounds") or [size["rounds"]["kill_round"]]


def median_kill(size: dict[str, Any]) -> None:
    """The kill -> round figure of a size: the kill whose toolkit share is the median (the lower
    of two), each kill's share beside it (``toolkit_s_each``): the decision waits on a Slurm
    look-up that the moment's load on 2 cores stretches 20-50x (``make bench-step-probe``), so
    one kill is a draw (0.07, 0.26, 1.72 s at 39 hollow nodes in three runs)."""
    each = kills(size)
    ranked = sorted(each, key=lambda k: (k.get("toolkit_s") is None, k.get("toolkit_s") or 0))
    chosen = {k: v for k, v in ranked[(len(ranked) - 1) // 2].items() if k != "toolkit_s_each"}
    size["rounds"]["kill_round"] = {**chosen, "toolkit_s_each": [k.get("toolkit_s") for k in each]}


def weighing(run: RunDir, job: str, decided: float) -> dict[str, Any] | None:
    """Task 0's own account of the decision recorded at ``decided`` (the last ``weighed:`` line
    of its log stamped by then, ``recovery.Weighed``): the whole, reading the evidence, Slurm's
    answers and its slowest part; the rest of ``decide_s`` is its watchers stopping and its
    ledger lines. None: no such line (a launcher from before it)."""
    found = None
    with contextlib.suppress(OSError):
        for line in run.task_log(job, 0).read_text(errors="replace").splitlines():
            stamp = line[1:].split("]", 1)[0] if line.startswith("[") else ""
            with contextlib.suppress(ValueError):
                at = dt.datetime.strptime(stamp, LOG_STAMP).replace(tzinfo=dt.UTC)
                if at.timestamp() <= decided and (got := Weighed.parsed(line)) is not None:
                    found = asdict(got)
    return found


def exit_seen(job: Job, restart: int, round_: int, after: float) -> float | None:
    """When task 0's torchrun exited (its node's exit record, written as it saw the failure)."""
    path = StartFiles(job.run, job.id, restart, round_).node_exit(0)
    with contextlib.suppress(BenchError):
        job.wait("task 0's exit record", lambda: path.exists() or None, job.startup_s())
    mtime = path.stat().st_mtime if path.exists() else None
    return mtime if mtime is not None and mtime >= after else None


def rank_on(job: Job, node: str) -> int:
    found = job.wait(
        f"a rank on {node}", lambda: job.setup.scanner.live(job.id, "rank", node) or None, 60
    )
    return found[0].pid


def wait_training(job: Job, after: float) -> None:
    """``--after`` updates past the start's first update at ``after``."""
    base = job.update()
    job.wait(f"{job.setup.args.after} updates", lambda: job.update() >= base + job.setup.args.after or None,
             job.startup_s())  # fmt: skip


def current(job: Job) -> tuple[int, int]:
    """(restart, round) of the start training now, from the ledger."""
    started = job.events(Kind.STARTED)[-1]
    rounds = [
        e for e in job.events(Kind.RESTARTED, started.time - 30) if e.restart == started.restart
    ]
    return started.restart, int(rounds[-1].get("round")) if rounds else 0


def kill_event(job: Job, round_: bool, nth: int = 0) -> dict[str, Any]:
    """SIGKILL one rank on the ``nth`` training node from the last; what follows (a round, or a
    requeue). Each kill of a job on a node of its own: a second kill's blame of a node would
    drain it (``faults.quarantine``), and the one spare is the hang's."""
    restart, rnd = current(job)
    victim = job.members()[-1 - nth]
    pid, before = rank_on(job, victim), probe.files_under(job.save)
    fault = time.time()
    os.kill(pid, signal.SIGKILL)
    seen = exit_seen(job, restart, rnd, fault)
    out = recovery(job, fault, seen, before, round_)
    if not round_:
        first = out["at"]["launchers"]
        said_apart(out, "launchers_up", launchers_up(
            StartFiles(job.run, job.id, restart + 1, 0), job.nodes,
            None if first is None else fault + first))  # fmt: skip
    shutdown_and_startup_apart(out, StartFiles(job.run, job.id, restart, rnd), job.nodes, fault,
                               round_)  # fmt: skip
    return {"node": victim, "fault_at": fault, **out}  # (a reanalysis derives from the same)


def shutdown_and_startup_apart(out: dict[str, Any], files: StartFiles, nodes: int,
                               fault: float, round_: bool) -> None:  # fmt: skip
    """A crash's other nodes going down while task 0 waits for their exit records and, before
    an in-job round (``round_``), while the round waits for them after the decision
    (``agents_down``; a requeue's relaunch is its new launchers': its old agents go down during
    Slurm's hold), and the next torchruns starting one after another (``torchruns_up``), each N
    processes on this machine's shared cores: said apart from the toolkit's share (once:
    ``said_apart``)."""
    at = {k: None if v is None else fault + v for k, v in out["at"].items()}
    decided = at.get("decided") if round_ else None
    said_apart(out, "agents_down",
               agents_down(files, nodes, at.get("seen"), at.get("stopped"), decided))  # fmt: skip
    torchruns_up_apart(out)


def torchruns_up_apart(out: dict[str, Any]) -> None:
    """The next torchruns starting: the first node's -> the last node's (/proc), N launchers each
    starting its process on this machine's cores once they read the decision (on a cluster,
    each on its own node): process start-up, said apart (``torchruns_up_s``)."""
    at = out["at"]
    said_apart(out, "torchruns_up", span(at.get("last_torchrun"), at.get("first_torchrun")))


def agents_down(
    files: StartFiles,
    nodes: int,
    seen: float | None,
    stopped: float | None,
    decided: float | None = None,
) -> float | None:
    """The other nodes' torchrun agents ending (their ranks die of the lost peer: each rank
    when the neighbour it reads from dies, one after another around gloo's ring, in the order
    the round's rendezvous gave the ranks), N on this machine's cores: task 0's exit record
    (``seen``: it saw the crash) -> the last other node's written before its decision
    (``stopped``), while task 0 waits for their records (``end_evidence``); and its decision
    (``decided``) -> the last written after it, while the next round waits for those nodes
    (each reports once its torchrun has ended). Process shutdown, as a hang's teardown is; 0
    when none came after task 0's (None: not measured)."""
    if seen is None or stopped is None:
        return None
    written = [p.stat().st_mtime for t in range(nodes) if (p := files.node_exit(t)).exists()]
    before = max((w for w in written if w <= stopped), default=seen) - seen
    after = max((w for w in written if w > decided), default=decided) - decided if decided else 0
    return round(max(0.0, before) + max(0.0, after), 2)


def hang_event(job: Job) -> dict[str, Any]:
    """SIGSTOP one rank on the last training node: the hang declared (in units of the allowance
    T it applied), then the round."""
    restart, rnd = current(job)
    victim = job.members()[-1]
    pid, before = rank_on(job, victim), probe.files_under(job.save)
    incident = StartFiles(job.run, job.id, restart, rnd).incident
    fault = time.time()
    os.kill(pid, signal.SIGSTOP)
    declared = job.wait("the hang declared", lambda: hang_monitor.declaration(incident),
                        job.startup_s())  # fmt: skip
    allowance = float(declared.get("allowance_s") or 0) or None
    detect = float(declared["time"]) - fault
    out = recovery(job, fault, float(declared["time"]), before, True)
    said_apart(out, "teardown", teardown(job, StartFiles(job.run, job.id, restart, rnd)))
    torchruns_up_apart(out)
    return {"node": victim, "fault_at": fault, "allowance_s": allowance,
            "detect_over_T": round(detect / allowance, 2) if allowance else None, **out}  # fmt: skip


def said_apart(out: dict[str, Any], name: str, seconds: float | None) -> None:
    """``seconds`` of ``out``'s toolkit share that are process start-up or shutdown, not the
    toolkit's polls, timeouts or look-ups (``name``: a hang's agents going down, a requeue's
    launchers starting): taken out of ``toolkit_s``, said beside it as ``<name>_s``, the whole
    kept as ``toolkit_with_<name>_s`` (None: not measured, nothing taken out). Once: a figure
    said apart before (a ``--reanalyze`` of a result that has it) is put back first
    (``put_back``), so the result holds the figure as it is derived now."""
    put_back(out, name)
    out[f"{name}_s"] = seconds
    if seconds is not None and out["toolkit_s"] is not None:
        out[f"toolkit_with_{name}_s"] = out["toolkit_s"]
        out["toolkit_s"] = round(out["toolkit_s"] - seconds, 2)


def put_back(out: dict[str, Any], *names: str) -> None:
    """The figures ``said_apart`` under ``names`` put back into ``out``'s toolkit share, the last
    said apart first (a reanalysis that derives several again puts them all back before, so
    that each whole it keeps is the whole it was)."""
    for name in reversed(names):
        before = out.pop(f"{name}_s", None)
        if before is not None and out.pop(f"toolkit_with_{name}_s", None) is not None:
            out["toolkit_s"] = round(out["toolkit_s"] + before, 2)


def teardown(job: Job, files: StartFiles) -> float | None:
    """The hung round's nodes going down: the last node's hang report (each node stops its ranks
    once every node has reported) -> the last exit record (written once its torchrun ended): the
    torchrun agents shutting down, N at once on this machine's cores, neither a poll nor a
    look-up of the toolkit's. Left out of the hang's toolkit share and said beside it, as
    start-up is (None: a report or a record missing)."""
    reports = []
    for path in incident_reports(files.incident):
        with contextlib.suppress(OSError, ValueError):
            reports.append(float(json.loads(path.read_text())["time"]))
    exits = [p.stat().st_mtime for t in range(job.nodes) if (p := files.node_exit(t)).exists()]
    if not reports or len(exits) < len(reports):
        return None
    return span(max(exits), max(reports))


def launchers_up(files: StartFiles, nodes: int, first: float | None) -> float | None:
    """A requeue's next start (``files``): its first launcher's start (``first``) -> the last of
    ``nodes`` nodes' reports (``contract.NodeReport``, written as a launcher begins): srun's
    fan-out to every node and each launcher's Python start-up, ``nodes`` of them on this
    machine's cores. Process start-up, left out of the requeue's toolkit share and said beside
    it (None: a report missing)."""
    reports = [p.stat().st_mtime for t in range(nodes)
               if (p := files.run.node_report(files.name, files.restart, t)).exists()]  # fmt: skip
    if first is None or len(reports) < nodes:
        return None
    return span(max(reports), first)


def notice_event(job: Job) -> dict[str, Any]:
    """USR2 to the job (Slurm's ``scancel --signal``): saved on notice, stopped, requeued by
    submitit's ``checkpoint()``, the next start's first update."""
    before, fault = probe.files_under(job.save), time.time()
    slurm.signal(job.id, "USR2")
    saved = job.wait("the save on notice",
                     lambda: next((e for e in job.events(Kind.CHECKPOINT, fault) if e.get("notice")), None),
                     job.startup_s())  # fmt: skip
    stopped = job.wait_event(Kind.STOPPED, fault, job.startup_s())
    requeued = job.wait_event(Kind.REQUEUED, fault, job.startup_s())
    first = job.wait_event(Kind.FIRST_UPDATE, requeued.time, job.startup_s() + 120)
    launchers, _ = launched(job, requeued.time, "launcher")
    _, last_agent = launched(job, requeued.time)
    marks = {"saved": saved.time, "stopped": stopped.time, "requeued": requeued.time,
             "launchers": launchers, "last_torchrun": last_agent, "first_update": first.time}  # fmt: skip
    out = {"at": since(marks, fault), "saved_s": span(saved.time, fault),
           "stopped_s": span(stopped.time, fault), "toolkit_s": span(requeued.time, fault),
           "total_s": span(first.time, fault), **costs(job, fault, first.time, before)}  # fmt: skip
    ranks_save_apart(out)
    return out


def ranks_save_apart(notice: dict[str, Any]) -> None:
    """A notice's ranks finishing the update in flight and saving (the notice -> the save on
    notice recorded): training's pace (an update took 0.25 s at 2 hollow nodes, 0.59 s at 39 on
    this machine's 2 cores), not a poll or look-up of the toolkit's. Said apart
    (``ranks_save_s``): the toolkit's share is the save -> the requeue (its wait for rank 0's
    marker, the stop recorded, the requeue asked)."""
    said_apart(notice, "ranks_save", notice["saved_s"])


def finished(job: Job) -> dict[str, Any]:
    """The job's end: Slurm's state, the updates trained and any missing."""
    state = slurm.wait_for_job(job.id, timeout=job.startup_s() + 600, backoff=Backoff(1, 1.5, 5))
    summary = follow.run_summary(job.run)
    trained = [n for n, _ in summary.losses]
    blamed = [(e.get("node"), e.get("drained")) for e in job.events(Kind.BLAMED)]
    return {"state": state.state, "updates": summary.updates,
            "missing_updates": len(missing_updates(trained, summary.updates)) if trained else None,
            "recomputed_updates": summary.recomputed_updates, "blamed": blamed}  # fmt: skip


def rounds_job(setup: Setup, nodes: int, hollow: bool) -> dict[str, Any]:
    """The in-job events of one size (module docstring, 1.)."""
    job, submitted = submit(setup, "rounds", nodes, hollow, setup.args.max_update,
                            ("--spares", "1"))  # fmt: skip
    say(f"{'hollow' if hollow else 'real'} {nodes}: rounds job {job.id}")
    out: dict[str, Any] = {
        "job": job.id,
        "start": told(job, "start", start_figures(job, submitted)),
    }
    wait_training(job, submitted)
    out["steady"] = steady(job)
    out["views"] = views(job)
    out["kill_rounds"], count = [], min(setup.args.kills, nodes - 1)
    for n in range(count):
        killed = told(job, f"kill -> round {n + 1}/{count}", kill_event(job, True, n))
        out["kill_rounds"].append(killed)
        wait_training(job, time.time())
    out["hang"] = told(job, "hang -> round", hang_event(job))
    wait_training(job, time.time())
    out["notice"] = told(job, "notice -> requeue", notice_event(job))
    out["end"] = told(job, "end", finished(job))
    return out


def told(job: Job, what: str, figures: dict[str, Any]) -> dict[str, Any]:
    """Say an event's headline figures as it is measured (a long run shows its progress)."""
    keys = ("total_s", "toolkit_s", "detect_over_T", "state", "missing_updates")
    shown = ", ".join(f"{k} {figures[k]}" for k in keys if k in figures)
    calls = (figures.get("slurm_calls") or {}).get("rpc")
    say(
        f"  job {job.id} ({job.nodes} nodes) {what}: {shown}"
        + (f", {calls} Slurm calls" if calls is not None else "")
    )
    return figures


def requeue_job(setup: Setup, nodes: int, hollow: bool) -> dict[str, Any]:
    """A rank killed in a run without in-job restarts: task 0 requeues (module docstring, 2.)."""
    job, submitted = submit(setup, "requeue", nodes, hollow, setup.args.max_update // 2)
    say(f"{'hollow' if hollow else 'real'} {nodes}: requeue job {job.id}")
    out: dict[str, Any] = {
        "job": job.id,
        "start": told(job, "start", start_figures(job, submitted)),
    }
    wait_training(job, submitted)
    out["kill_requeue"] = told(job, "kill -> requeue", kill_event(job, round_=False))
    out["end"] = told(job, "end", finished(job))
    return out


# --- sizes, comparison, the run -----------------------------------------------------------------

EVENTS = ("start", "kill_round", "hang", "notice", "kill_requeue")


def one_size(setup: Setup, nodes: int, hollow: bool) -> dict[str, Any]:
    out = {"rounds": rounds_job(setup, nodes, hollow), "requeue": requeue_job(setup, nodes, hollow)}
    weighings(out, setup.args.work_dir, hollow, nodes)
    median_kill(out)
    return out


def event_of(size: dict[str, Any], name: str) -> dict[str, Any]:
    """An event's figures wherever they were measured (the rounds or the requeue job)."""
    if name == "kill_requeue":
        return dict(size["requeue"].get(name) or {})
    return dict(size["rounds"].get(name) or {})


def file_ops(size: dict[str, Any], label: str, per: str = "update") -> float | None:
    """File operations of one node (``task0``, ``last``) in the steady window, ``per`` update or
    second."""
    ops = size["rounds"]["steady"].get(f"file_ops_per_{per}", {}).get(label) or {}
    counts = [v for k, v in ops.items() if k not in ("updates", "seconds")]
    return round(sum(counts), 2) if ops.get(f"{per}s") else None


def paced(size: dict[str, Any], label: str, key: str) -> float | None:
    """One node's (``task0``, ``last``) update-paced operations per update, or timed polls per
    second (``key``), in the steady window (``by_pace``)."""
    return (size["rounds"]["steady"].get("file_ops_by_pace", {}).get(label) or {}).get(key)


def compared(sizes_: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each size's headline figures and their ratio to the 2-node run of the same kind."""
    base = sizes_.get(2) or sizes_[min(sizes_)]
    table: dict[str, Any] = {}
    for nodes, size in sorted(sizes_.items()):
        row: dict[str, Any] = {}
        for name in EVENTS:
            now, then = event_of(size, name), event_of(base, name)
            for key in ("toolkit_s", "total_s", "detect_over_T", "files_created_per_node",
                        "decision_cpu_s"):  # fmt: skip
                if key in now:
                    row[f"{name}.{key}"] = (now[key], report.ratio(now[key], then.get(key)))
            calls = (now.get("slurm_calls") or {}).get("rpc")
            row[f"{name}.slurm_rpcs"] = (
                calls,
                report.ratio(calls, (then.get("slurm_calls") or {}).get("rpc")),
            )
        for label in ("task0", "last"):
            for per in ("update", "second"):
                now_ops, then_ops = file_ops(size, label, per), file_ops(base, label, per)
                row[f"steady.file_ops_per_{per}.{label}"] = (
                    now_ops,
                    report.ratio(now_ops, then_ops),
                )
            for key in ("per_update", "polls_per_second"):
                now_p, then_p = paced(size, label, key), paced(base, label, key)
                row[f"steady.paced.{key}.{label}"] = (now_p, report.ratio(now_p, then_p))
        mem = size["rounds"]["steady"]["memory"]["last"].get("node_mb")
        row["steady.node_mb"] = (
            mem,
            report.ratio(mem, base["rounds"]["steady"]["memory"]["last"].get("node_mb")),
        )
        table[str(nodes)] = row
    return table


def node_mb(result: dict[str, Any], who: str = "last") -> float:
    """A hollow node's unique memory (``who``: the last node, any node but task 0's), the most any
    measured size's took, with MARGIN (a node's grows a little with the world: its gloo pairs,
    the rendezvous store's clients)."""
    return MARGIN * max((size["rounds"]["steady"]["memory"][who].get("node_mb") or 0)
                        for size in result["hollow"].values())  # fmt: skip


def task0_extra_mb(result: dict[str, Any]) -> float:
    """What task 0's node takes beyond any other node's, once a run: its launcher holds what
    verifying a checkpoint imports (``checkpoints.warm``)."""
    return max(0.0, node_mb(result, "task0") - node_mb(result))


def memory_budget_mb(args: argparse.Namespace) -> float:
    """What this benchmark's nodes may take: ``--memory-budget-gib``, else the machine's memory
    less ``--leave-gib``, and never more than is available now less 1 GiB."""
    meminfo = {
        line.split(":")[0]: int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
    }
    total, available = meminfo["MemTotal"] / 1024, meminfo["MemAvailable"] / 1024
    budget = (
        args.memory_budget_gib * 1024 if args.memory_budget_gib else total - args.leave_gib * 1024
    )
    return min(budget, available - 1024)


def fitting(
    asked: list[int], node_mb: float, budget_mb: float, task0_mb: float = 0.0
) -> tuple[list[int], dict[str, Any]]:
    """The hollow sizes that fit (with a spare: N + 1 nodes of ``node_mb``, and task 0's
    ``task0_mb`` more once); larger ones lowered to the most that fit. BenchError when fewer than
    32 would (the issue's floor)."""
    most = int((budget_mb - task0_mb) // node_mb) - 1
    said = {"node_mb": round(node_mb, 1), "task0_extra_mb": round(task0_mb, 1),
            "budget_mb": round(budget_mb), "most_nodes": most}  # fmt: skip
    if max(asked) > most and most < min(32, max(asked)):
        raise BenchError(
            f"{node_mb:.0f} MB a hollow node: {budget_mb:.0f} MB hold {most} nodes and a spare, fewer than 32"
        )
    return sorted({min(n, most) for n in asked}), said


def largest(result: dict[str, Any], kind: str) -> tuple[str, str] | None:
    """(the 2-node size, the largest size) measured of ``kind``, as the JSON keys them."""
    found = sorted(result.get(kind, {}), key=int)
    return (found[0], found[-1]) if found else None


def ratio_row(
    result: dict[str, Any], kind: str, key: str, goal: float, label: str, spec: str = ".1f"
) -> tuple[str, str, str]:
    ends = largest(result, kind)
    if ends is None:
        return (label, "n/a", f"<= {goal}x")
    value, ratio = result["compared"][kind][ends[1]].get(key, (None, None))
    return (
        f"{label} at {ends[1]} {kind} nodes",
        f"{fmt(value, spec)} ({fmt(ratio, '.2f')}x {ends[0]} nodes)"
        if ratio is not None
        else f"{fmt(value, spec)} ({ends[0]} nodes: 0 or none, no ratio)",
        f"<= {goal}x",
    )


def rows(result: dict[str, Any]) -> report.Rows:
    out: report.Rows = []
    for kind in ("real", "hollow"):
        if largest(result, kind) is None:
            continue
        sizes_ = list(result[kind].values())
        lost = sum((s["rounds"]["end"].get("missing_updates") or 0) for s in sizes_)
        done = all(s["rounds"]["end"]["state"] == "COMPLETED" for s in sizes_)
        out.append((f"{kind}: every size completed, updates missing", f"{done}, {lost}", "True, 0"))
        for event in ("kill_round", "kill_requeue", "notice"):
            for key, goal, what, spec in (("toolkit_s", GOAL_TOOLKIT_RATIO, "toolkit s", ".2f"),
                                          ("slurm_rpcs", GOAL_CALLS_RATIO, "Slurm calls", ".0f")):  # fmt: skip
                label = f"{kind} {event} {what}"
                out.append(ratio_row(result, kind, f"{event}.{key}", goal, label, spec))
        out.append(ratio_row(result, kind, "kill_round.decision_cpu_s", GOAL_TOOLKIT_RATIO,
                             f"{kind} kill_round decision CPU s (its work, beside)", ".2f"))  # fmt: skip
        worst = max((s["rounds"]["hang"].get("detect_over_T") or 0) for s in sizes_)
        out.append((f"{kind}: hang detected, worst (x T)", fmt(worst), f"<= {GOAL_DETECT_OVER_T}"))
        for label, who in (("last", "a node"), ("task0", "task 0")):
            for key, what in (("file_ops_per_update", "file ops/update"),
                              ("paced.per_update", "file ops paced by updates, /update"),
                              ("paced.polls_per_second", "timed polls/s")):  # fmt: skip
                out.append(
                    ratio_row(result, kind, f"steady.{key}.{label}", 1.0, f"{kind} {what}, {who}")
                )
        out.append(view_row(result, kind))
    if "memory" in result:
        mem = result["memory"]
        said = (f"{mem['most_nodes']} ({mem['node_mb']:.0f} MB a node, task 0's "
                f"{mem.get('task0_extra_mb', 0):.0f} MB more, in {mem['budget_mb']} MB)")  # fmt: skip
        out.append(("hollow nodes that fit, with a spare", said, "64, else >= 32"))
    return out


def view_row(result: dict[str, Any], kind: str) -> tuple[str, str, str]:
    """status, logs and doctor on the largest run: seconds and lines."""
    ends = largest(result, kind)
    views_ = result[kind][ends[1]]["rounds"]["views"] if ends else {}
    said = ", ".join(f"{v} {d['seconds']:.1f} s {d['lines']} lines" for v, d in views_.items())
    return (f"{kind} status, logs, doctor at {ends[1] if ends else '?'} nodes", said, "seconds")


def run(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    real, hollow = sizes(args.real), sizes(args.hollow)
    args.work_dir = (args.work_dir or Path(".local/bench/scale")).resolve()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(args.work_dir / "cluster", args.port, args.first_job_id)
    setup = Setup(
        args, probe.CallLog.install(args.work_dir / "slurm-clients"), probe.Scanner().start()
    )
    result: dict[str, Any] = {"real": {}, "hollow": {}}
    with cluster.up(max(real + hollow) + 2):
        try:
            result["machine"] = machine()
            if hollow:
                result["hollow"][str(hollow[0])] = one_size(setup, hollow[0], True)
            for nodes in real:
                result["real"][str(nodes)] = one_size(setup, nodes, False)
                cluster.resume_drained()
            for asked in hollow[1:]:
                fits, result["memory"] = fitting(hollow, node_mb(result), memory_budget_mb(args),
                                                 task0_extra_mb(result))  # fmt: skip
                nodes = min(asked, max(fits))
                say(f"hollow {asked} nodes asked, {nodes} run: {result['memory']}")
                result["hollow"][str(nodes)] = one_size(setup, nodes, True)
                cluster.resume_drained()
            if hollow and "memory" not in result:
                _, result["memory"] = fitting(hollow, node_mb(result), memory_budget_mb(args),
                                              task0_extra_mb(result))  # fmt: skip
        finally:
            setup.scanner.stop()
            for job in setup.jobs:
                with contextlib.suppress(slurm.SlurmError):
                    slurm.cancel(job, check=False)
    result["compared"] = {k: compared({int(n): v for n, v in result[k].items()})
                          for k in ("real", "hollow") if result[k]}  # fmt: skip
    result["smoke"] = bool(args.smoke)
    result.update(provenance(started, load_before, result.pop("machine", {})))
    return result


def reanalyze(path: Path, work_dir: Path, trace_s: float) -> dict[str, Any]:
    """``path``'s result again, from what its run left in ``work_dir`` (each steady window's strace
    files, each requeue's ledger and next start's node reports): the figures the benchmark has
    gained since it ran (``file_ops_by_pace``, a requeue's ``launchers_up_s``, a notice's
    ``ranks_save_s``, a crash's ``agents_down_s``, the ``torchruns_up_s`` of every event that
    relaunches: ``events_again``; each decision's own account, ``weighings``), compared anew;
    ``trace_s``: the run's ``--trace-s``. Every other figure is kept as measured."""
    result = json.loads(path.read_text())
    for kind in ("real", "hollow"):
        for nodes, size in result[kind].items():
            save = save_dir(work_dir, "rounds", kind == "hollow", int(nodes)).resolve()
            traces, steady_ = traces_of(work_dir, size["rounds"]["job"]), size["rounds"]["steady"]
            steady_["file_ops_by_pace"] = {
                k: by_pace(probe.count_by_pace(probe.traced_ops(Path(f"{traces}-{k}.txt"), save)),
                           v["updates"], trace_s)
                for k, v in steady_["file_ops_per_update"].items()
            }  # fmt: skip
            events_again(size, work_dir, kind == "hollow", int(nodes))
            weighings(size, work_dir, kind == "hollow", int(nodes))
            median_kill(size)
    result["compared"] = {k: compared({int(n): v for n, v in result[k].items()})
                          for k in ("real", "hollow") if result[k]}  # fmt: skip
    result["reanalyzed"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return result


def events_again(size: dict[str, Any], work_dir: Path, hollow: bool, nodes: int) -> None:
    """One size's events with the figures said apart since its run (``reanalyze``), each found
    from its run's ledger (the fault's time: the decision's less its ``decided`` mark)."""
    ranks_save_apart(size["rounds"]["notice"])
    torchruns_up_apart(size["rounds"]["hang"])
    run = RunDir(save_dir(work_dir, "rounds", hollow, nodes))
    recorded = ledger.read(run.ledger)
    first = next(e for e in recorded if e.kind == Kind.RESTARTED)
    for kill in kills(size):
        fault = kill.get("fault_at") or first.time - kill["at"]["decided"]  # older: the ledger's
        restarted = decision_after(recorded, Kind.RESTARTED, fault) or first
        files = StartFiles(run, str(size["rounds"]["job"]), restarted.restart,
                           int(restarted.get("round", 1)) - 1)  # fmt: skip
        put_back(kill, "agents_down", "torchruns_up")
        shutdown_and_startup_apart(kill, files, nodes, fault, True)
    event = size["requeue"]["kill_requeue"]
    run = RunDir(save_dir(work_dir, "requeue", hollow, nodes))
    requeued = next(e for e in ledger.read(run.ledger) if e.kind == Kind.REQUEUED)
    fault = event.get("fault_at") or requeued.time - event["at"]["decided"]
    job, relaunched = str(size["requeue"]["job"]), event["at"].get("launchers") is not None
    put_back(event, *(["launchers_up"] if relaunched else []), "agents_down", "torchruns_up")
    if relaunched:
        files = StartFiles(run, job, requeued.restart + 1, 0)
        said_apart(event, "launchers_up",
                   launchers_up(files, nodes, fault + event["at"]["launchers"]))  # fmt: skip
    shutdown_and_startup_apart(event, StartFiles(run, job, requeued.restart, 0), nodes, fault,
                               False)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--reanalyze"]:  # a result again, from the files its run left
        p = argparse.ArgumentParser(prog="python -m benchmarks.scale --reanalyze")
        p.add_argument("result", type=Path)
        p.add_argument("--work-dir", type=Path, default=Path(".local/bench/scale"))
        p.add_argument("--trace-s", type=float, default=10.0, help="the run's --trace-s")
        got = p.parse_args(argv[1:])
        again = run_and_write("bench-scale", got.result,
                              lambda: reanalyze(got.result, got.work_dir, got.trace_s), rows,
                              (OSError, KeyError, StopIteration))  # fmt: skip
        return 0 if again is not None else 1
    args = report.parse(build_parser(), argv, "scale", SMOKE)
    result = run_and_write("bench-scale", args.out, lambda: run(args), rows,
                           (BenchError, slurm.SlurmError))  # fmt: skip
    return 0 if result is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
