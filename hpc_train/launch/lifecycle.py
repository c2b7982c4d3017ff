"""A start's lifecycle on one node, before and around torchrun.

``Launcher._start_body`` runs these in order: ``begin`` (why the last start ended, the restart
budget, task 0's ``starts.decide_start``: geometry, batch plan, resume point; a refused start,
or one that would not advance, ends through ``recovery``'s decision and executor), ``announce`` (the fairseq arguments; ``started`` in the ledger),
``environment`` (the ranks' ``contract.WorkerEnv``), then torchrun with its ``Watchers``: the
spot notice (``watch.spot``), the hang monitor (``watch.hang_monitor``), task 0's straggler
and grow-back threads (``watch.straggler_monitor``, ``watch.grow_monitor``). When torchrun
exits, what it left running of this start is ended (``end_leftovers``: the ranks of a killed
agent), and ``recovery`` decides and carries out what follows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from hpc_core import instances, procs, slurm
from hpc_core.ledger import Kind
from hpc_core.wait import FAST, process_exited, wait_until
from hpc_train.contract import (
    SAVE_DIR,
    START,
    Cause,
    LauncherBell,
    StartDecision,
    WorkerEnv,
    node_name,
)
from hpc_train.faults import end_evidence
from hpc_train.faults.end_evidence import Ending
from hpc_train.faults.suspects import Suspect
from hpc_train.job import command_lines, tracking
from hpc_train.launch import recovery, requeue, restart_policy, signals
from hpc_train.launch.context import Here, log
from hpc_train.launch.starts import batch_plan_of, decide_start, previous_stop
from hpc_train.planning import costs
from hpc_train.planning import plan as plan_mod
from hpc_train.watch import hang_monitor, straggler_monitor
from hpc_train.watch.grow_monitor import GrowWatch
from hpc_train.watch.spot import SpotWatcher, endpoint_to_watch


def visible_gpus(wanted: int) -> int:
    """GPUs torch can use on this node; a CUDA that fails to initialise is logged and counts 0.
    A job that asks for none (``wanted`` 0: CPU ranks whatever the node has) counts none, and
    this launcher never imports torch: that import is ~1.7 s of CPU at every start of every node
    (measured on the local cluster, where it was a tenth of a 2-node start's CPU)."""
    if wanted <= 0:
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as err:
        log(f"CUDA is broken on this node ({type(err).__name__}: {err}): counting no GPU")
        return 0


def torchrun_path() -> str:
    candidate = Path(sys.executable).with_name("torchrun")
    return str(candidate) if candidate.exists() else "torchrun"


LEFTOVER_WAIT_S = 5.0  # for the processes torchrun left to be gone after their SIGKILL


def leftovers(
    save_dir: Path, key: tuple[str, int], node: str, proc: Path = procs.PROC
) -> list[int]:
    """The live processes of this start (``key``) on this ``node``: its ranks and their loader
    processes, whose environment names the start and the save dir (``WorkerEnv``; read by
    ``hpc_core.procs``, which keeps another emulated node's out on a shared host)."""
    want = {SAVE_DIR: str(save_dir), START: f"{key[0]}:{key[1]}"}
    found = procs.carrying(want, node, skip={os.getpid()}, proc=proc)
    return sorted(p.pid for p in found if not process_exited(p.pid))


def end_leftovers(here: Here, returncode: int) -> list[int]:
    """torchrun has exited: SIGKILL what it left running of this start on this node (the
    pids). Only a torchrun killed itself (SIGKILL, the OOM killer) leaves any: it starts its
    ranks in sessions of their own, so they outlive it and train on with their peers, unwatched,
    and no node's torchrun ever ends: task 0 never decides and this node waits for its word in
    vain. Their end is the one their peers see (a lost connection): the start ends everywhere
    and task 0 weighs this node's exit record (``agent_exit.NodeExit.killed``)."""
    pids = leftovers(here.spec.training.save_dir, here.files.ranks_start, node_name())
    if not pids:
        return []
    log(f"torchrun exited with {returncode} and left {len(pids)} process(es) of this start "
        f"running (pids {', '.join(map(str, pids))}): killing them (SIGKILL)")  # fmt: skip
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: all(process_exited(p) for p in pids) or None,
                   "the leftover processes' end", LEFTOVER_WAIT_S, FAST)  # fmt: skip
    return pids


def previous_end(here: Here, came_from: str | None) -> str:
    """Why the start before this one ended (task 0 blames the nodes Slurm lost meanwhile: the
    start before's end, weighed now, ``Ending.UNRECORDED``)."""
    if came_from is not None:
        return came_from
    said = previous_stop(here.files)
    if not here.task0:
        return said
    ev = end_evidence.at_next_start(here.where(), said)
    if not ev.nodes:  # the toolkit said how it ended: nobody to ask about
        return said
    return recovery.carry_out(here, recovery.what_follows(ev, here.options), ev).came_from


def begin(here: Here, spent: int, gpus: int, came_from: str | None) -> tuple[StartDecision, str]:
    """Before torchrun: the restart budget, then task 0's decision for every node (a refused
    start is blamed and requeued; restarts that never advance stop the run)."""
    spec = here.spec
    before = previous_end(here, came_from)
    log(f"job {here.job_id} start #{spent + 1}: {before}")
    budget = spec.recovery.max_restarts
    if not restart_policy.restart_allowed(spent, budget):
        raise RuntimeError(f"restart budget exhausted (--max-restarts {budget})")
    spec.training.save_dir.mkdir(parents=True, exist_ok=True)
    decision = decide_start(here.run, here.start, spec, gpus, log)
    # refused, no progress over the last restarts, or no checkpoint that verifies (held)
    ending, why = ((Ending.REFUSED, decision.refused) if decision.refused else
                   (Ending.NO_GOOD_CHECKPOINT, decision.held) if decision.held else
                   (Ending.NO_PROGRESS, decision.stop))  # fmt: skip
    if why:
        ev = end_evidence.at_start(ending, here.where(spent), detail=why,
                                   nodes=tuple(decision.bad_nodes))  # fmt: skip
        recovery.carry_out(here, recovery.what_follows(ev, here.options), ev)
        raise RuntimeError(why)  # (the executor raised first: this start ends on every task)
    return decision, before


def announce(here: Here, decision: StartDecision, before: str) -> list[str]:
    """The plan task 0 decided, said (log, the ledger's ``started``); fairseq's arguments."""
    spec, start, use_gpu = here.spec, here.start, decision.use_gpu
    plan = batch_plan_of(spec, decision)  # task 0's, for every node
    if spec.sizing.gpus_per_node > 0 and not use_gpu:
        log("no GPU visible: falling back to CPU ranks (gloo, legacy_ddp), "
            f"{decision.ranks_per_node} per node")  # fmt: skip
    log(f"node {start.task + 1}/{start.num_nodes}, {decision.ranks_per_node} rank(s) here; "
        f"{plan.describe()}")  # fmt: skip
    here.note(Kind.STARTED, nodes=list(start.hosts), world=plan.world_size,
              update_freq=plan.update_freq, resume_at=decision.at_update, previous=before,
              **({"spares": list(start.standby)} if start.standby else {}))  # fmt: skip
    return command_lines.fairseq_argv(spec, plan, use_gpu) + decision.args


def environment(here: Here, use_gpu: bool) -> tuple[WorkerEnv, dict[str, str]]:
    """The ranks' ``WorkerEnv`` (built once here, parsed once by each rank), and torchrun's
    whole environment."""
    spec, files = here.spec, here.files
    beats = files.heartbeats(node_name())
    worker = WorkerEnv(
        save_dir=spec.training.save_dir,
        start=files.ranks_start,
        stop_marker=files.stop_marker,
        notice_pending=files.notice_pending,
        heartbeat_dir=None if spec.watch.no_watchdog else beats,
        sync_save=spec.saves.sync,
        # tiered saves: this run's dir on node-local disk
        local_save_dir=here.run.local_tier(spec.saves.local_dir) if spec.saves.local_dir else None,
        auto_interval=plan_mod.auto_interval(spec, here.start.num_nodes, use_gpu),
        audit_samples=spec.training.audit_samples,
        tensorboard=tracking.tensorboard_dir(spec.tracking, here.run),
        wandb=tracking.wandb_run(spec.tracking, spec.training.save_dir),
        bell=LauncherBell(here.run.bells, here.start.first_host, here.start.bell_key),
    )
    env = {**os.environ, **worker.to_env()}
    if not use_gpu:
        env.update(instances.plain(instances.cpu_env()))
    else:  # NCCL's flight recorder, dumped on a hang (hang_monitor) or an NCCL timeout
        env.update(hang_monitor.flight_recorder_env(beats))
    return worker, env


def watch_spot(job_id: str) -> SpotWatcher | None:
    """This node's spot-notice thread (``watch.spot``): the notice becomes the job's USR2."""
    endpoint = endpoint_to_watch()
    if endpoint is None:
        log("spot watch off: not on EC2 (set HPC_TRAIN_IMDS_ENDPOINT to watch a metadata server)")
        return None

    def on_notice(action: dict[str, str]) -> None:
        log(f"spot notice {action.get('action')} at {action.get('time')}: signalling the job")
        slurm.signal(job_id, "USR2")

    # the default is the planner's too (costs.SPOT_POLL_S: how late a notice may be seen)
    interval = float(os.environ.get("HPC_TRAIN_SPOT_POLL_S", costs.SPOT_POLL_S))
    watcher = SpotWatcher(on_notice, log, endpoint=endpoint, interval_s=interval)
    watcher.start()
    return watcher


def watch_hangs(here: Here, nproc: int, pid: int) -> hang_monitor.Monitor | None:
    """This node's hang watchdog (``watch.hang_monitor``), unless ``--no-watchdog``."""
    if here.spec.watch.no_watchdog:
        return None
    return hang_monitor.Monitor(
        here.files, node_name(), nproc, here.start.num_nodes, here.spec.watch.hang, pid,
        partial(process_exited, pid), log, partial(here.start.ring_round, here.run),
    ).start()  # fmt: skip


def watch_stragglers(here: Here, spent: int) -> straggler_monitor.StragglerWatch | None:
    """Task 0's straggler thread (``watch.straggler_monitor``), unless ``--no-watchdog`` (no
    heartbeats); it evicts only with a restart left (``spent``: the restarts the budget has
    counted, ``Launcher.restarts_spent``)."""
    spec, watch = here.spec, here.spec.watch
    if watch.no_watchdog:
        return None
    evict = spec.recovery.evict_stragglers and restart_policy.may_requeue(
        spent, spec.recovery.max_restarts
    )
    return straggler_monitor.watch(here.files, here.start, spec.watch.stragglers, evict,
                                   here.note, log)  # fmt: skip


def watch_growth(here: Here, own_notice: signals.OwnNotice) -> GrowWatch | None:
    """Task 0's grow-back thread while this start runs on fewer than ``--nodes`` MAX
    (``watch.grow_monitor``); none with ``--grow-after 0``. A grow is a notice of task 0's
    own (``own_notice.send(Cause.GROW, ...)``): the save on notice, then submitit's requeue."""
    spec, start, grow_after = here.spec, here.start, here.spec.recovery.grow_after
    if start.task != 0 or start.num_nodes >= spec.sizing.nodes_max or grow_after <= 0:
        return None
    try:
        end = slurm.job_info(start.job_id) or {}
        end_time = time.mktime(time.strptime(end["EndTime"], "%Y-%m-%dT%H:%M:%S"))
    except (slurm.SlurmError, KeyError, ValueError):
        end_time = None  # no limit known: grow whenever nodes come free

    def grow(target: int, why: str) -> None:
        log(f"grow: from {start.num_nodes} to {target} node(s): {why}; saving on notice")
        here.note(Kind.GROWN, **{"from": start.num_nodes, "to": target, "why": why})
        own_notice.send(Cause.GROW, start.job_id)  # the save on notice, then submitit's requeue

    excluded = partial(requeue.excluded, spec, start.job_id)
    return GrowWatch(spec.slurm.partition, start.hosts, spec.sizing.nodes_max, grow_after, excluded,
                     end_time, grow, log).start()  # fmt: skip


@dataclass
class Watchers:
    """The threads beside one torchrun, started as it starts and stopped as it exits (each a
    ``watch.watcher.Watcher``; the launcher's pulse, ``watch.launchers``, spans the whole start)."""

    spot: SpotWatcher | None = None
    hangs: hang_monitor.Monitor | None = None
    stragglers: straggler_monitor.StragglerWatch | None = None
    growth: GrowWatch | None = None

    def start(self, here: Here, nproc: int, pid: int, spent: int,
              own_notice: signals.OwnNotice) -> None:  # fmt: skip
        self.spot = watch_spot(here.job_id)
        self.hangs = watch_hangs(here, nproc, pid)
        self.stragglers = watch_stragglers(here, spent)  # task 0 only
        self.growth = watch_growth(here, own_notice)  # task 0, below --nodes MAX

    def stop(self) -> tuple[str | None, Suspect | None, str | None]:
        """(the hang the monitor stopped the ranks for, the straggler evicted, why torchrun
        was killed after its ranks ended)."""
        hang = self.hangs.stop() if self.hangs else None
        evicted = self.stragglers.stop() if self.stragglers else None
        if self.growth:
            self.growth.stop()
        if self.spot:
            self.spot.stop()
        return hang, evicted, self.hangs.stuck if self.hangs else None
