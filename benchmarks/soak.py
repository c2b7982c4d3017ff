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
--hang-factor 10 --hang-save-timeout 60 --hang-startup-timeout 180``) and a 30 s straggler
window with ``--evict-stragglers``, and ``--nodes-replaced yes`` (``TOOLKIT``: the nodes are
replaced, below). The schedule, offsets in seconds from the
run's first update (``SCHEDULE``), in the order the issue lists them:
- a preemption (``chaos.preempt``: a ``high`` job on the run's nodes, held ``--hold-s``);
- a transient crash (every training process on a training node SIGKILLed: not an error that
  recurs at the same update);
- a hang (one rank SIGSTOPped);
- a lost node (its training processes SIGKILLed, then its slurmd: Slurm marks it DOWN after
  ``SlurmdTimeout``, 20 s here);
- a slow node (its ranks throttled to ``--slow-factor`` of the time for ``--slow-s``,
  ``chaos.throttle_here``);
- nodes taken and given back (a ``high`` job on 3 of the 4 nodes for ``--taken-s``).
Each lands on a training node this way has not hit yet, other than task 0's where there is a
choice (``pick_target``: a node hit twice is quarantined).
A failure whose offset comes while the run is not training hits when it trains again (an update
logged after the previous failure, in the last 2 s); one that never finds it training is
``skipped``. The bare job's ranks run ``fairseq-train``, which ``hpc_train.chaos`` does not look
for: the benchmark kills/stops/throttles them itself, on the node, through ``srun --overlap``
(``_here``).

**Nodes replaced** (``Replacer``, the same for the three ways): on ParallelCluster clustermgtd
replaces a node that is DOWN, or DRAINED with no job left on it; the local cluster has no
clustermgtd, so the benchmark stands in for it: such a node is brought back (its slurmd started
again by ``slurm/local/cluster.sh node-up`` when it was killed, given a new NodeAddr as a new
instance gets a new IP, then ``scontrol update state=resume``) ``--replace-s`` after it was
first seen so: a new machine under the old name, which a quarantine does not hold. A node still
allocated to a job (DRAINING: a node an in-job restart left out) is not touched, as clustermgtd
does not.

**A requeue's hold**: Slurm holds a requeued job before it may start again: for
SchedulerParameters' ``requeue_delay`` on Slurm 25.11+, else for AuthInfo's ``cred_expire``.
ParallelCluster sets ``cred_expire=70``; the shipped configs set ``requeue_delay=10``
(``hpc_train.cluster.requeue_hold``), so a cluster made from them on ParallelCluster 3.16 holds
10 s. The local Slurm (22.05) has no ``requeue_delay``: ``make bench-soak`` restarts the local
cluster with ``cred_expire`` at the hold asked (``SOAK_CRED_EXPIRE``: 10, the shipped clusters';
70, ParallelCluster's default) and records the hold the controller reports
(``settings.requeue_hold_s``).

Figures (keys of the JSON), per way under ``ways.<name>``:
- ``updates_reached``: the highest update logged within the budget;
- ``clean_s_per_update``: from the run's own uninterrupted stretch, first update to the first
  failure (the update lines' arrival times, polled every ``POLL_S``);
- ``goodput``: updates_reached x the ideal seconds per update / budget (1 = ideal); the ideal
  (``ideal_s_per_update``) is the toolkit ways' pooled steady step (``pooled_ideal``: every
  update trained right after the previous one, from the train logs' own millisecond stamps, a
  slow node's throttle left out); the bare way, whose fairseq-train stamps whole seconds, keeps
  its own first stretch (``goodput_from`` says which; ``goodput_own_first_stretch`` keeps the
  figure from each way's own first stretch). ``--reanalyze RESULT`` recomputes it for a
  written result whose runs are still on disk;
- ``failures``: each one's time, node, and ``to_first_resumed_update_s`` (the failure to the
  first update of the next start: the ledger's ``first_update`` for the toolkit, the first
  update line after a ``Loaded checkpoint`` line for bare) and ``updates_recomputed`` (the
  highest update before the resume minus the update it resumed from);
- ``updates_recomputed``: update numbers logged more than once in the budget;
- ``replaced``: the nodes the stand-in for clustermgtd brought back, and when;
- ``ledger_goodput``: the toolkit's own account of the budget (``hpc_train.planning.goodput``), to
  set beside the figures the benchmark measured from outside;
- ``alive_at_end``: the Slurm job was RUNNING or PENDING (not dead) when the budget ended;
- ``ledger``: the toolkit runs' ledger events (kind, time, data), for the record.
Top-level ``requeue_waits`` (toolkit ways, ``requeue_waits``): each requeue to the next start,
``waited_s`` and ``beyond_hold_s`` (the hold subtracted): where a requeue's cost goes besides the
hold, a preemptor's or taker's hold on the nodes, the next scheduling pass and the launch.
Top-level ratios from this one run (the machine is shared and noisy): ``goodput_ratio_in_job_
over_bare``, ``resume_ratio_in_job_over_requeue`` (mean failure -> first resumed update, over
every failure both ways resumed from) and ``resume_ratio_inside_allocation`` (the same over the
failures that leave the allocation standing: crash, hang, lost node, slow node; a preemption and
nodes taken end the allocation, so no way can recover from them inside it).
Goals (issue 19): in_job goodput >= 0.85, >= 2x bare, its failure -> resume <= 0.5 of the
requeue way's, 0 updates recomputed after a notice (preemption, nodes taken).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks import report
from benchmarks.preemption import BenchError, Jobs, machine, say
from benchmarks.report import fmt, provenance, ratio, run_and_write
from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train import chaos, testing
from hpc_train.cluster import requeue_hold
from hpc_train.planning import goodput as run_goodput
from hpc_train.runs import logparse
from hpc_train.worker import speed

POLL_S = 0.25
# the toolkit ways: the integration tests' short hang allowances, a 30 s straggler window with
# eviction, and --nodes-replaced yes: the Replacer stands in for clustermgtd
TOOLKIT = ("--hang-timeout-floor", "10", "--hang-factor", "10", "--hang-save-timeout", "60",
           "--hang-startup-timeout", "180", "--straggler-window", "30",
           "--evict-stragglers", "--nodes-replaced", "yes")  # fmt: skip
# (offset from the first update in seconds, failure): the same for every way
SCHEDULE: tuple[tuple[float, str], ...] = (
    (60, "preempt"), (230, "crash"), (400, "hang"), (570, "lost_node"), (740, "slow"),
    (910, "nodes_taken"),
)  # fmt: skip
# failures after which the allocation still stands: the ones a way may recover from inside it
INSIDE_ALLOCATION = ("crash", "hang", "lost_node", "slow")
MAX_STEP_S = 1.0  # a step longer than this is a stall or a restart, not clean training
TRAINING_NOW_S = 2.0  # an update logged this recently: the run trains (a failure may land)
REPLACE_POLL_S = 2.0
DEAD_GRACE_S = 30.0  # a way's job ended this long: it will not train again in the budget
DEAD_POLL_S = 5.0
CLUSTER_SH = Path(__file__).resolve().parents[1] / "slurm" / "local" / "cluster.sh"
HEADLINE_CONFIG = Path(__file__).resolve().parents[1] / "pcluster_configs" / "p3dn.yaml"
GOAL_IDEAL = 0.85
GOAL_VS_BARE = 2.0
GOAL_RESUME_RATIO = 0.5
NOTICE_FAILURES = ("preempt", "nodes_taken")
BARE_TARGETS = ("fairseq-train", "bin/torchrun")
HERE = "_here"
# --smoke: the three ways, 25 s each, the schedule compressed (most of it lands after the budget
# and is recorded as skipped), short holds
SMOKE = {"budget_s": 25, "scale": 0.02, "hold_s": 2, "taken_s": 5, "slow_s": 5, "replace_s": 5,
         "quiet_timeout": 30}  # fmt: skip


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


def logged_updates(lines: Sequence[str]) -> list[tuple[float, int]]:
    """(the line's own stamp, update) of every per-update metrics line that has one (the
    toolkit logs milliseconds; a bare fairseq-train logs whole seconds)."""
    out = []
    for line in lines:
        t = logparse.line_time(line)
        found = updates_of([(t, line)]) if t is not None else []
        out += found
    return out


def steady_steps(
    updates: Sequence[tuple[float, int]], excluded: Sequence[tuple[float, float]]
) -> list[float]:
    """The seconds of each update trained right after the previous one (``u`` then ``u + 1``),
    saves and validations included, restarts and stalls not (a step over ``MAX_STEP_S``), nor
    one that began inside an ``excluded`` window (a slow node's throttle)."""
    out = []
    for (t0, u0), (t1, u1) in itertools.pairwise(updates):
        if u1 != u0 + 1 or not 0 <= t1 - t0 <= MAX_STEP_S:
            continue
        if any(a <= t0 < b for a, b in excluded):
            continue
        out.append(t1 - t0)
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


def first_update_after(
    events: Sequence[ledger.Event], after: float, before: float = float("inf")
) -> float | None:
    return min((e.time for e in events if e.kind == Kind.FIRST_UPDATE and after < e.time < before),
               default=None)  # fmt: skip


def training_again(updates: Sequence[tuple[float, int]], last: float | None, now: float) -> bool:
    """The run trains: an update was logged after the last failure (1 s on: a line of the update
    before it may arrive after it) and within ``TRAINING_NOW_S`` of ``now``. The next failure
    must not land in a restart, where it would hit no training process."""
    if not updates:
        return False
    arrived = updates[-1][0]
    return arrived >= now - TRAINING_NOW_S and (last is None or arrived > last + 1.0)


def pick_target(training: Sequence[str], hit: Collection[str]) -> str:
    """The node a failure lands on: not task 0's (the first, whose launcher decides for the
    run) where there is a choice, and one this way has not hit yet where there is one (the
    schedule's failures are not one bad node's; a node hit twice is blamed twice: quarantined)."""
    others = list(training[1:]) or list(training)
    fresh = [n for n in others if n not in hit]
    return (fresh or others)[-1]


def replace_due(
    states: Mapping[str, str], seen: dict[str, float], now: float, after_s: float
) -> list[str]:
    """The stand-in for clustermgtd's decision: nodes DOWN, or DRAINED with no job on them
    (``sinfo %t``: down, down*, drain, drain*; not drng, a node still allocated), for
    ``after_s`` since first seen so (``seen`` is updated: when each was first seen so)."""
    bad = {n for n, st in states.items() if st.rstrip("*~#%$@^-!") in ("down", "drain")}
    for node in list(seen):
        if node not in bad:
            del seen[node]
    for node in bad:
        seen.setdefault(node, now)
    return sorted(n for n in bad if now - seen[n] >= after_s)


def training_nodes(events: Sequence[ledger.Event]) -> list[str]:
    """The nodes of the latest start or in-job restart (the spare is not one)."""
    nodes: list[str] = []
    for e in sorted(events, key=lambda e: e.time):
        if e.kind == Kind.STARTED and e.get("nodes"):
            nodes = list(e.get("nodes"))
        elif e.kind == Kind.RESTARTED and e.get("members"):
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
export PORT=$(({slurm.RDZV_PORT_BASE} + SLURM_JOB_ID * {slurm.RDZV_ROUND_PORTS} % {slurm.RDZV_PORT_SPAN}))
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
    args, _ = speed.split_args(words[words.index("hpc_train.worker.train") + 1 :])
    return args  # the toolkit's speed-lever argument is the rank's, not fairseq-train's


# --- on the cluster ----------------------------------------------------------------------------


@dataclass
class Way:
    name: str
    job: str
    log: Path
    save: Path
    toolkit: bool
    lines: list[tuple[float, str]] = field(default_factory=list)
    updates: list[tuple[float, int]] = field(default_factory=list)
    hit: list[str] = field(default_factory=list)  # the nodes its failures landed on
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
        new = [(now, s) for s in chunk[:end].decode(errors="replace").splitlines()]
        self.lines += new
        self.updates += updates_of(new)

    def events(self) -> list[ledger.Event]:
        return ledger.read(RunDir(self.save).ledger) if self.toolkit else []


def bare_ranks(job: str, node: str) -> list[int]:
    """The bare job's ranks on this host (``fairseq-train``, not torchrun nor a rank's data
    loader workers, which are its children)."""
    found = {pid for pid, cmd in chaos._processes(job, node, BARE_TARGETS)
             if "bin/torchrun" not in cmd}  # fmt: skip
    return sorted(pid for pid in found if chaos._parent(pid) not in found)


def here(job: str, node: str, action: str, extra: Sequence[str] = ()) -> int:
    """On the node: SIGKILL the bare job's torchrun and ranks, SIGSTOP one rank, or throttle
    its ranks (``slow FACTOR SECONDS``)."""
    if action == "kill":
        procs = list(chaos._processes(job, node, BARE_TARGETS))
        for pid, _ in procs:
            os.kill(pid, signal.SIGKILL)
        return len(procs)
    if action == "slow":
        factor, seconds = float(extra[0]), float(extra[1])
        return chaos.throttle_here(job, node, factor, seconds, find=bare_ranks)
    ranks = bare_ranks(job, node)
    if ranks:
        os.kill(ranks[0], signal.SIGSTOP)
    return len(ranks[:1])


def on_bare_node(job: str, node: str, action: str, *extra: str, timeout: float = 60) -> None:
    slurm.run(["srun", f"--jobid={job}", "--overlap", f"--nodelist={node}", "-N1", "-n1",
               sys.executable, "-m", "benchmarks.soak", HERE, job, node, action, *extra],
              timeout=timeout)  # fmt: skip


def target_node(way: Way) -> str:
    nodes = training_nodes(way.events()) if way.toolkit else []
    running = chaos.running_nodes(way.job)
    return pick_target([n for n in nodes if n in running] or running, way.hit)


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
        way.hit.append(node)
        if kind == "slow":  # returns when the throttle ends (or the ranks there do)
            if way.toolkit:
                chaos.slow(way.job, node, args.slow_factor, args.slow_s)
            else:
                on_bare_node(way.job, node, "slow", str(args.slow_factor), str(args.slow_s),
                             timeout=args.slow_s + 60)  # fmt: skip
        elif way.toolkit and kind in ("crash", "lost_node"):
            chaos.kill_node(way.job, node, stop_slurmd=kind == "lost_node")
        elif way.toolkit:
            chaos.hang(way.job, node)
        else:
            on_bare_node(way.job, node, "stop" if kind == "hang" else "kill")
            if kind == "lost_node":
                chaos.stop_local_slurmd(node)
    return {"kind": kind, "time": t, "node": node}


class Replacer:
    """Stands in for ParallelCluster's clustermgtd on the local cluster (``replace_due``): a
    thread that brings back a node DOWN, or DRAINED with no job on it, ``after_s`` after it was
    first seen so - its slurmd started again where it was killed (``cluster.sh node-up``), then
    resumed. ``replaced``: (node, time) of each."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self.replaced: list[tuple[str, float]] = []
        self._seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Replacer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _loop(self) -> None:
        said: set[str] = set()
        while not self._stop.wait(REPLACE_POLL_S):
            try:
                self.step()
            except (slurm.SlurmError, OSError, subprocess.SubprocessError) as err:
                if str(err) not in said:  # each distinct failure once: a silent stand-in for
                    said.add(str(err))  # clustermgtd that replaces nothing skews every way
                    say(f"the stand-in for clustermgtd failed: {err}")

    def step(self) -> list[str]:
        due = replace_due(node_states(), self._seen, time.time(), self.after_s)
        for node in due:
            bring_back(node)
            self.replaced.append((node, round(time.time(), 3)))
            say(f"replaced {node} (the stand-in for clustermgtd)")
        return due


# A replaced node is a new machine: clustermgtd sets NodeAddr to the new instance's IP
# (hpc_core.slurm.machine), and the quarantine holds machines, not names. Here each replacement
# gets the next loopback address; its slurmd listens on all of them (the port is the node's).
NEW_ADDRESSES = (f"127.0.0.{i}" for i in itertools.count(11))


def node_states() -> dict[str, str]:
    out = slurm.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
    return dict(ln.split() for ln in out.splitlines() if ln.strip())  # a node per partition


def bring_back(node: str) -> None:
    """The node's slurmd started again where it was killed (``cluster.sh node-up``: that node
    alone; ``up`` would resume every node, a drained one not due yet too), at a new address
    (``NEW_ADDRESSES``), then resumed."""
    up = subprocess.run(["bash", str(CLUSTER_SH), "node-up", node], capture_output=True,
                        text=True, timeout=60)  # fmt: skip
    if up.returncode != 0:
        raise subprocess.SubprocessError(f"cluster.sh node-up: {slurm.last_line(up.stderr)}")
    slurm.run(["scontrol", "update", f"nodename={node}", f"nodeaddr={next(NEW_ADDRESSES)}"])
    with contextlib.suppress(slurm.SlurmError):  # back by itself already (ReturnToService=2)
        slurm.resume(node)


def is_running(job: str) -> bool:
    return slurm.job_state(job).state == "RUNNING"


@dataclass
class _Injections:
    """One way's schedule as it is worked through: what is still to inject, what was (and failed),
    the thread injecting now, and when the job's first update came."""

    pending: list[tuple[float, str]]
    done: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    worker: threading.Thread | None = None
    first: float | None = None


def soak(
    way: Way, args: argparse.Namespace, jobs: Jobs, submitted: float, replacer: Replacer
) -> dict[str, Any]:
    """Poll the way's log for the budget, injecting the schedule; the figures."""
    deadline = submitted + args.budget_s
    inj = _Injections(pending=list(scaled(SCHEDULE, args.scale)))
    _inject_over_budget(way, args, jobs, submitted, deadline, inj)
    state = slurm.job_state(way.job)
    if inj.worker is not None:
        inj.worker.join(timeout=60)
    way.poll()
    lines = [(t, s) for t, s in way.lines if t <= deadline]
    updates = updates_of(lines)
    events = way.events()
    inj.done.sort(key=lambda f: f["time"])
    failures = _failure_figures(way, inj.done, lines, updates, events, deadline)
    first_failure = min((f["time"] for f in inj.done), default=deadline)
    clean = clean_s_per_update(updates, first_failure)
    reached = max((u for _, u in updates), default=0)
    first = inj.first
    return {
        "job_id": way.job,
        "updates_reached": reached,
        "reached_max_update": reached >= args.max_update,  # then idle to the budget's end
        "clean_s_per_update": clean,
        "goodput": ratio(reached * clean, args.budget_s) if clean else None,
        "first_update_after_submit_s": round(first - submitted, 1) if first else None,
        "failures": failures,
        "skipped": [kind for _, kind in inj.pending],
        "inject_errors": inj.errors,
        "updates_recomputed": duplicates(updates),
        "state_at_end": state.state,
        "restarts": state.restarts,
        "alive_at_end": state.state in ("RUNNING", "PENDING", "REQUEUED", "CONFIGURING"),
        "replaced": [[n, t] for n, t in replacer.replaced if submitted <= t <= deadline],
        "ledger_goodput": run_goodput.account(events, deadline).as_json() if events else None,
        "ledger": [{"kind": e.kind, "time": round(e.time, 3), **e.data} for e in events],
        "save_dir": str(way.save),
    }


def _inject_over_budget(
    way: Way,
    args: argparse.Namespace,
    jobs: Jobs,
    submitted: float,
    deadline: float,
    inj: _Injections,
) -> None:
    """Until the deadline (or the job's end for good): poll the log and inject each failure when
    it is due and the job trains again after the last one, one at a time, each in a thread."""
    dead_since: float | None = None
    looked = 0.0
    while time.time() < deadline:
        way.poll()
        # a job that ended for good (the bare one dies at its first failure) trains no more in
        # the budget: stop watching it after a grace (a requeue passes through no end state)
        if time.time() - looked >= DEAD_POLL_S:
            looked = time.time()
            dead = slurm.job_state(way.job).finished
            dead_since = (dead_since or looked) if dead else None
        if dead_since is not None and time.time() - dead_since > DEAD_GRACE_S:
            say(f"{way.name}: job {way.job} ended for good; the rest of the budget is idle")
            break
        if inj.first is None and updates_of(way.lines):
            inj.first = updates_of(way.lines)[0][0]
            say(f"{way.name}: first update {inj.first - submitted:.1f} s after submission")
        busy = inj.worker is not None and inj.worker.is_alive()
        now = time.time()
        pending = inj.pending
        due = inj.first is not None and pending and not busy and now >= inj.first + pending[0][0]
        last = inj.done[-1]["time"] if inj.done else None
        if due and training_again(way.updates, last, now) and is_running(way.job):
            offset, kind = pending.pop(0)

            def go(kind: str = kind, offset: float = offset) -> None:
                try:
                    inj.done.append({**inject(kind, way, args, jobs), "offset_s": offset})
                    say(f"{way.name}: {kind} injected ({inj.done[-1]['node'] or '-'})")
                except (slurm.SlurmError, BenchError, OSError) as err:
                    inj.errors.append(f"{kind}: {err}")
                    say(f"{way.name}: {kind} failed: {err}")

            inj.worker = threading.Thread(target=go, daemon=True)
            inj.worker.start()
        time.sleep(POLL_S)


def _failure_figures(
    way: Way,
    done: list[dict[str, Any]],
    lines: list[tuple[float, str]],
    updates: list[tuple[float, int]],
    events: list[ledger.Event],
    deadline: float,
) -> list[dict[str, Any]]:
    """Each injected failure (by time) with its recovery: the first resumed update (the ledger's
    for the toolkit, the log's for bare), the update it resumed from, the updates recomputed."""
    failures = []
    # each failure's window ends at the next one's time, the last one's at the deadline; none
    # injected (a slow start can use up a short budget) is no failures, not an error
    ends = [g["time"] for g in done[1:]] + [deadline] if done else []
    for f, after in zip(done, ends, strict=True):
        # a failure's resume comes before the next failure (a slow node may cause none)
        resumed_log = resume_in_log([(t, s) for t, s in lines if t < after], f["time"])
        resumed_at = first_update_after(events, f["time"], after) if way.toolkit else None
        resumed_t = resumed_at if way.toolkit else (resumed_log[0] if resumed_log else None)
        failures.append({
            **f, "time": round(f["time"], 3),
            "to_first_resumed_update_s": round(resumed_t - f["time"], 1) if resumed_t else None,
            "log_resume_s": round(resumed_log[0] - f["time"], 1) if resumed_log else None,
            "resumed_from_update": resumed_log[1] - 1 if resumed_log else None,
            "updates_recomputed": recomputed_at(updates, resumed_log) if resumed_log else None,
        })  # fmt: skip
    return failures


def toolkit_way(name: str, options: Sequence[str], args: argparse.Namespace, jobs: Jobs) -> Way:
    save = args.work_dir / name
    try:
        job = testing.submit_tiny(args.data, save, args.max_update, f"bench-soak-{name}", "2",
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
    """Cancel everything submitted; bring back any node left drained or down, at once."""
    jobs.cancel_unfinished()
    if way is not None:
        slurm.cancel(way.job, check=False)
        deadline = time.time() + 60
        while not slurm.job_state(way.job).finished and time.time() < deadline:
            time.sleep(1)
    for node in replace_due(node_states(), {}, time.time(), 0.0):
        try:
            bring_back(node)
            say(f"brought back {node}")
        except (slurm.SlurmError, subprocess.SubprocessError) as err:
            say(f"could not bring back {node}: {err}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    config = slurm.show_config()
    args.requeue_hold_s = slurm.requeue_hold_of(config)  # what every requeue below waits, at least
    # and then the next scheduling pass: ParallelCluster keeps Slurm's defaults, (null) here
    args.scheduler_parameters = slurm.config_value(config, "SchedulerParameters")
    say(f"a requeued job is held {args.requeue_hold_s:.0f} s ({hold_reference()}); "
        f"SchedulerParameters {args.scheduler_parameters} (ParallelCluster: Slurm's defaults)")  # fmt: skip
    ways: dict[str, Any] = {}
    makers: list[tuple[str, Callable[[Jobs], Way]]] = [
        ("in_job", lambda jobs: toolkit_way(
            "in_job", ("--spares", "1", "--restart-in-job", *TOOLKIT), args, jobs)),
        ("requeue", lambda jobs: toolkit_way("requeue", TOOLKIT, args, jobs)),
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
                with Replacer(args.replace_s) as replacer:
                    ways[name] = soak(way, args, jobs, submitted, replacer)
                say(f"{name}: reached update {ways[name]['updates_reached']}, "
                    f"goodput {fmt(ways[name]['goodput'])}")  # fmt: skip
            finally:
                cleanup(jobs, way)
            partial = summarize(ways, args, started, load_before)
            report.write_json(args.work_dir / "partial.json", partial)
    ideal = apply_ideal(ways, args.budget_s, args.slow_s)
    return {**summarize(ways, args, started, load_before), "ideal_s_per_update": ideal}


def reanalyze(path: Path) -> dict[str, Any]:
    """A written result again, its goodput against the pooled ideal (``apply_ideal``; its
    runs' save dirs must still be there); the rest as measured."""
    result = json.loads(path.read_text())
    ways, settings = result["ways"], result["settings"]
    ideal = apply_ideal(ways, settings["budget_s"], settings["slow_s"])
    goodput = {name: w["goodput"] for name, w in ways.items()}
    hold = settings.get("requeue_hold_s")
    waits = {name: requeue_waits(w["ledger"], hold) for name, w in ways.items() if w.get("ledger")}
    return {
        **result, "goodput": goodput, "ideal_s_per_update": ideal,
        "goodput_ratio_in_job_over_bare": ratio(goodput.get("in_job"), goodput.get("bare")),
        "requeue_waits": waits,
    }  # fmt: skip


def pooled_ideal(ways: dict[str, Any], budget_s: float, slow_s: float) -> float | None:
    """One clean seconds-per-update for the toolkit ways (the same code at the same width: the
    recovery differs, not the ideal): the mean of their steady steps (``steady_steps``) from
    their train logs' own stamps, within each budget, a slow node's throttle left out. Each
    way's first minute alone is too short a sample on a shared machine (seen: 0.044 and 0.050
    s/update in one run, the way with more updates then the lower goodput)."""
    steps: list[float] = []
    for way in ways.values():
        if not way.get("ledger"):
            continue  # the bare way: no ledger, and its log stamps are whole seconds
        begin = min(e["time"] for e in way["ledger"])
        log = RunDir(Path(way["save_dir"])).train_log  # none yet: a start slower than the budget
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        updates = [(t, u) for t, u in logged_updates(lines) if begin <= t <= begin + budget_s]
        slow = [(f["time"], f["time"] + slow_s) for f in way["failures"] if f["kind"] == "slow"]
        own = steady_steps(updates, slow)
        way["steady_s_per_update"] = statistics.mean(own) if own else None
        steps += own
    return statistics.mean(steps) if steps else None


def apply_ideal(ways: dict[str, Any], budget_s: float, slow_s: float) -> float | None:
    """Each toolkit way's goodput against the pooled ideal (``pooled_ideal``); the bare way
    keeps its own first stretch (``goodput_from``)."""
    ideal = pooled_ideal(ways, budget_s, slow_s)
    for way in ways.values():
        way.setdefault("goodput_own_first_stretch", way["goodput"])
        if way.get("ledger") and ideal:
            way["goodput"] = ratio(way["updates_reached"] * ideal, budget_s)
            way["goodput_from"] = "the toolkit ways' pooled steady s/update"
        else:
            way["goodput_from"] = "its own first stretch (clean_s_per_update)"
    return ideal


def mean_resume(way: dict[str, Any] | None, kinds: Collection[str] | None = None) -> float | None:
    """Mean failure -> first resumed update over the way's failures (of ``kinds``) it resumed
    from within the budget."""
    values = [f["to_first_resumed_update_s"] for f in (way or {}).get("failures", [])
              if f["to_first_resumed_update_s"] is not None
              and (kinds is None or f["kind"] in kinds)]  # fmt: skip
    return statistics.mean(values) if values else None


def requeue_waits(rows: Sequence[Mapping[str, Any]], hold_s: float | None) -> list[dict[str, Any]]:
    """Each requeue of a way's ledger (``rows``: kind, time, data) to its next start: ``waited_s``
    from task 0's ``requeued`` to the next ``started`` (its decision made), and ``beyond_hold_s``
    that less the hold: a preemptor's or a taker's hold on the nodes, the wait for Slurm's next
    scheduling pass (the main one every 60 s, backfill every 30 s by default) and the job's
    launch. ``after``: the cause of the stop before it."""
    out: list[dict[str, Any]] = []
    cause = None
    for i, row in enumerate(rows):
        if row["kind"] == Kind.STOPPED:
            cause = row.get("cause")
        if row["kind"] != Kind.REQUEUED:
            continue
        nxt = next((r for r in rows[i + 1 :] if r["kind"] == Kind.STARTED), None)
        if nxt is None:
            continue
        waited = nxt["time"] - row["time"]
        beyond = None if hold_s is None else round(waited - hold_s, 1)
        out.append({"after": cause, "waited_s": round(waited, 1), "beyond_hold_s": beyond})
    return out


def mean_wait(waits: Sequence[Mapping[str, Any]]) -> float | None:
    values = [w["waited_s"] for w in waits]
    return round(statistics.mean(values), 1) if values else None


def notice_recomputed(way: dict[str, Any] | None) -> int | None:
    values = [f["updates_recomputed"] for f in (way or {}).get("failures", [])
              if f["kind"] in NOTICE_FAILURES and f["updates_recomputed"] is not None]  # fmt: skip
    return sum(values) if values else None


def summarize(
    ways: dict[str, Any], args: argparse.Namespace, started: float, load: tuple[float, ...]
) -> dict[str, Any]:
    def goodput(name: str) -> float | None:
        return ways.get(name, {}).get("goodput")

    hold = getattr(args, "requeue_hold_s", None)
    return {
        "goodput": {name: w["goodput"] for name, w in ways.items()},
        "goodput_ratio_in_job_over_bare": ratio(goodput("in_job"), goodput("bare")),
        "mean_resume_s": {name: mean_resume(w) for name, w in ways.items()},
        "resume_ratio_in_job_over_requeue": ratio(mean_resume(ways.get("in_job")),
                                                  mean_resume(ways.get("requeue"))),
        "mean_resume_inside_allocation_s": {
            name: mean_resume(w, INSIDE_ALLOCATION) for name, w in ways.items()},
        "resume_ratio_inside_allocation": ratio(
            mean_resume(ways.get("in_job"), INSIDE_ALLOCATION),
            mean_resume(ways.get("requeue"), INSIDE_ALLOCATION)),
        "notice_updates_recomputed_in_job": notice_recomputed(ways.get("in_job")),
        "requeue_waits": {name: requeue_waits(w.get("ledger") or [], hold)
                          for name, w in ways.items() if w.get("ledger")},
        "ways": ways,
        "goals": {"in_job_goodput_min": GOAL_IDEAL, "in_job_over_bare_min": GOAL_VS_BARE,
                  "resume_ratio_max": GOAL_RESUME_RATIO, "notice_updates_recomputed": 0},
        "settings": {"budget_s": args.budget_s, "schedule": scaled(SCHEDULE, args.scale),
                     "schedule_from": "the run's first update", "hold_s": args.hold_s,
                     "taken_s": args.taken_s, "taken_nodes": 3, "max_update": args.max_update,
                     "slow_factor": args.slow_factor, "slow_s": args.slow_s,
                     "replace_s": args.replace_s, "inside_allocation": list(INSIDE_ALLOCATION),
                     "requeue_hold_s": getattr(args, "requeue_hold_s", None),
                     "scheduler_parameters": getattr(args, "scheduler_parameters", None),
                     "nodes": 2, "preset": "tiny", "toolkit_options": list(TOOLKIT)},
        **provenance(started, (load[0], load[1], load[2]), machine()),
    }  # fmt: skip


def hold_reference() -> str:
    """The requeue holds a soak's may be compared with: ParallelCluster's default and that of
    a cluster made from the shipped headline config on ParallelCluster 3.16."""
    shipped = requeue_hold.of_config(yaml.safe_load(HEADLINE_CONFIG.read_text()))
    return (f"ParallelCluster {slurm.PCLUSTER_CRED_EXPIRE_S:g}; "
            f"shipped configs {shipped:g} (Slurm {requeue_hold.PCLUSTER_SLURM_VERSION})")  # fmt: skip


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    ways = result["ways"]

    def per(key: str, spec: str = ".2f") -> str:
        return ", ".join(f"{n} {fmt(w.get(key), spec)}" for n, w in ways.items())

    hold = result["settings"].get("requeue_hold_s")
    return [
        ("a requeue's hold (s)", fmt(hold, "g"), hold_reference()),
        ("SchedulerParameters", str(result["settings"].get("scheduler_parameters")),
         "ParallelCluster: Slurm's defaults ((null): every 60 s, backfill every 30 s)"),
        ("goodput (of ideal)", per("goodput"), f"in_job >= {GOAL_IDEAL}"),
        ("updates reached", per("updates_reached", "d"), ""),
        ("ideal s/update (toolkit ways, pooled)", fmt(result.get("ideal_s_per_update"), ".4f"),
         ""),
        ("s/update, own first stretch", per("clean_s_per_update", ".3f"), ""),
        ("goodput in_job / bare", fmt(result["goodput_ratio_in_job_over_bare"]),
         f">= {GOAL_VS_BARE}"),
        ("failure -> resumed update, mean (s)",
         ", ".join(f"{n} {fmt(v, '.1f')}" for n, v in result["mean_resume_s"].items()), ""),
        ("resume in_job / requeue", fmt(result["resume_ratio_in_job_over_requeue"]),
         f"<= {GOAL_RESUME_RATIO}"),
        ("  the same, failures inside the allocation",
         fmt(result["resume_ratio_inside_allocation"]), f"<= {GOAL_RESUME_RATIO}"),
        ("updates recomputed after notices, in_job",
         fmt(result["notice_updates_recomputed_in_job"], "g"), "0"),
        ("requeued -> next start, mean (s)",
         ", ".join(f"{n} {fmt(mean_wait(w), '.1f')} ({len(w)})"
                   for n, w in result.get("requeue_waits", {}).items()),
         "the hold, a taker's hold on the nodes, the next scheduling pass, the launch"),
        ("alive at the end", ", ".join(f"{n} {w['alive_at_end']}" for n, w in ways.items()), ""),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 4 and argv[0] == HERE:
        print(f"{argv[3]}: {here(argv[1], argv[2], argv[3], argv[4:])} process(es) or cycle(s)")
        return 0
    if len(argv) == 2 and argv[0] == "--reanalyze":  # a result again, from its runs' logs
        out = Path(argv[1])
        found = run_and_write("bench-soak", out, lambda: reanalyze(out), summary_rows, (OSError,))
        return 0 if found is not None else 1
    p = report.parser("soak", __doc__)
    p.add_argument("--budget-s", type=int, default=1200, help="wall budget of each way")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the schedule's offsets")
    p.add_argument("--max-update", type=int, default=100000,
                   help="more than any way reaches: a way that reaches it ends before its "
                   "budget, and its goodput is not comparable (reached_max_update)")  # fmt: skip
    p.add_argument("--hold-s", type=int, default=10, help="seconds the preemptor holds")
    p.add_argument("--taken-s", type=int, default=30, help="seconds 3 nodes are taken")
    p.add_argument("--slow-factor", type=float, default=0.5,
                   help="share of the time a slow node's ranks run")  # fmt: skip
    p.add_argument("--slow-s", type=int, default=150, help="seconds a node is slow")
    p.add_argument("--replace-s", type=float, default=60,
                   help="seconds before the stand-in for clustermgtd brings back a node DOWN "
                   "or DRAINED with no job on it")  # fmt: skip
    p.add_argument("--only", nargs="*", help="ways to run (default: all)")
    p.add_argument("--quiet-timeout", type=float, default=300,
                   help="seconds to wait for other jobs to leave the queue before each way")  # fmt: skip
    args = report.parse(p, argv, "soak", SMOKE)
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
