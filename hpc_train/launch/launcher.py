"""The launcher: the callable submitit runs as one Slurm task per node.

On every (re)start task 0 decides for all nodes (``starts.decide_start``: the geometry, the
batch plan, what to resume from) and each node runs one torchrun agent that starts the training
workers. Resume
state always comes from the save dir, never from the pickled submission, so a requeue Slurm
performs by itself (node failure, spot loss, ``scontrol requeue``) resumes too.

Interruptions:
- USR2 (preemption, time limit, spot notice): the workers save at the next update and exit;
  submitit calls ``checkpoint()`` on task 0, which waits for that save, then submitit requeues.
- torchrun fails (a rank or a node died): task 0 requeues the job while restarts remain
  (``hpc_train.launch.restart_policy`` decides); with ``--restart-in-job`` it restarts training
  in the same allocation on the healthy nodes instead (``contract.RoundVerdict``: the others
  wait for its word; a blamed node's task ends), and requeues only below MIN healthy nodes.
  With ``--spares K`` the last K nodes of the allocation stand by (``_stand_by``) and task 0
  swaps one in for each node it leaves out: the width, and the recipe's batch, stay N.
- no progress (a hang): each node's watchdog thread (``hpc_train.watch.hang_monitor``) saves its ranks'
  stacks and stops them; task 0 names the suspect node, drains it (unless ``--no-drain``),
  and requeues without it (or restarts in the job without it). A torchrun that outlives its
  ranks is killed by the same thread (a stuck agent).
- a requeue that could not start (too few usable nodes in the partition) is said and, where
  nothing replaces drained nodes, stops the run instead.
- a straggler (a node's own compute >= 20 % slower for minutes): task 0 names it
  (``hpc_train.watch.straggler_monitor``); ``--evict-stragglers``: save, requeue, exclude it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from hpc_core import instances, ledger, slurm
from hpc_core.wait import FAST, Backoff, process_exited, wait_until
from hpc_train.contract import (
    DONE,
    ENDED,
    ENDING,
    IN_JOB_RESTART,
    REQUEUE,
    RESTART_IN_JOB,
    STOP,
    WAITING,
    RoundVerdict,
    StartDecision,
    WorkerEnv,
    node_name,
    read_beats,
    read_launcher_beat,
    read_stop,
    read_verdict,
    record_notice,
    start_progress,
    write_verdict,
)
from hpc_train.faults import agent_exit, failures, node_blame, quarantine
from hpc_train.job import command_lines
from hpc_train.job.spec import SIGNAL_DELAY_S, JobSpec
from hpc_train.launch import notify, release, restart_policy
from hpc_train.launch.restart_policy import Action
from hpc_train.launch.spot import SpotWatcher, endpoint_to_watch
from hpc_train.launch.starts import (
    Start,
    allocation_start,
    batch_plan_of,
    decide_start,
    previous_stop,
    refill,
    start_key,
)
from hpc_train.planning import costs
from hpc_train.planning import plan as plan_mod
from hpc_train.watch import hang_monitor, launchers, straggler_monitor
from hpc_train.watch.grow_monitor import GrowWatch

# checkpoint() waits for the save on notice at most this long: HPC_TRAIN_SAVE_WAIT_S if set, else
# the need of the run's slowest recent save (the ledger's) or, before one, the preset's estimate
# (hpc_train.planning.costs.notice_wait_s: >= 25 s, <= the 90 s of submitit's USR2 before the time
# limit). The wait ends as soon as the save is durable.
SAVE_WAIT_ENV = "HPC_TRAIN_SAVE_WAIT_S"
ROOT_CAUSE_WAIT_S = 5.0  # torchrun's failure summary after it exited (orphans hold the pipe)
REQUEUE_GRACE_S = 60.0  # after `scontrol requeue` Slurm ends this task; never succeed meanwhile
VERDICT_WAIT_S = 240.0  # for task 0's word after a bad end (its evidence waits come first)
SPARE_POLL = Backoff(1.0, 1.5, 5.0)  # a hot spare reads task 0's word: seconds matter, not ms


def log(msg: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"[{stamp}] hpc-train {socket.gethostname()}: {msg}", flush=True)


def visible_gpus() -> int:
    """GPUs torch can use on this node; a CUDA that fails to initialise is logged and counts 0."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as err:
        log(f"CUDA is broken on this node ({type(err).__name__}: {err}): counting no GPU")
        return 0


def torchrun_path() -> str:
    candidate = Path(sys.executable).with_name("torchrun")
    return str(candidate) if candidate.exists() else "torchrun"


def _ignore_usr2() -> None:
    # Slurm signals every process of the step; the agent must not die of it (the default
    # action of SIGUSR2 is to terminate). Workers install their own handler.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class Launcher:
    """Run by submitit on each node of the allocation (``ntasks_per_node=1``)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self._proc: subprocess.Popen[bytes] | None = None
        self._marker: Path | None = None  # this start's stop marker: the save on notice is durable
        self._pending: Path | None = None  # this start's record of a notice, for its ranks
        self._signals: list[str] = []  # SIGTERM / notice, in the order this start received them
        self._start: Start | None = None
        self._own_notice = ""  # the cause when task 0 sent the notice itself (grow, hang)
        self._training_over = False  # this start's torchrun ended well: only exits are awaited

    def note(self, kind: str, **data: Any) -> None:
        """Task 0 records a stage of this start in the run's ledger (the others never do)."""
        self._record(kind, data)

    def deputy_note(self, kind: str, **data: Any) -> None:
        """What ``note`` does, from task 1 acting for a stuck task 0."""
        self._record(kind, data, deputy=True)

    def _record(self, kind: str, data: dict[str, Any], deputy: bool = False) -> None:
        start = self._start
        if start is None or (start.task != 0 and not deputy):
            return
        try:
            event = ledger.record(
                self.spec.run_dir.ledger, kind, start.job_id, start.restart, **data
            )
        except OSError as err:  # the ledger is a record: never a reason to stop training
            log(f"could not write the ledger ({err})")
            event = ledger.Event(kind, time.time(), start.job_id, start.restart, data)
        if self.spec.notify:
            notify.notify(self.spec.notify, event, self.spec.save_dir, log)

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec}  # never pickle a live process (submitit pickles us on requeue)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec = state["spec"]
        self._proc = None
        self._marker = None
        self._pending = None
        self._signals = []
        self._start = None
        self._own_notice = ""
        self._training_over = False

    def cancelled(self, job_id: str) -> bool:
        """Did the user cancel the job (``scancel``)?

        scancel sends SIGTERM to every task with no notice before it; a preemption or the time
        limit sends the notice (USR2) first, and a node failure kills the peers' ranks, not this
        task. Slurm's own word counts too, though while the steps are torn down it only says
        COMPLETING. A cancel during a notice's save is taken for the notice (a requeue).
        """
        if self._signals[:1] == ["SIGTERM"]:
            return True
        try:
            return slurm.job_state(job_id).state == "CANCELLED"
        except slurm.SlurmError as err:
            log(f"cannot tell a cancel from a crash ({err}): treating it as a crash")
            return False

    def _recording(self, name: str, previous: Any) -> Any:
        """A handler that notes ``name`` in the order signals came, then runs ``previous``
        (submitit's own: it logs SIGTERM and carries on; on USR2 task 0's calls checkpoint())."""

        def handler(signum: int, frame: Any) -> None:
            self._signals.append(name)
            if name == "notice" and self._pending is not None:  # for ranks without a handler yet
                record_notice(self._pending, signal.Signals(signum).name)
            if callable(previous):
                previous(signum, frame)

        return handler

    def torchrun_command(self, start: Start, nproc: int, args: list[str]) -> list[str]:
        return command_lines.torchrun_argv(
            torchrun_path(), start.num_nodes, nproc, start.first_host, start_key(start)[0], args
        )

    def __call__(self) -> dict[str, Any]:
        import submitit

        job = submitit.JobEnvironment()
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        hosts = tuple(job.hostnames)
        spares = self.spec.spares_in(len(hosts))
        start = allocation_start(job.job_id, job.global_rank, hosts, restart, spares)
        if start is None:  # a hot spare: idle until task 0 swaps it in, or the run ends
            spare = Start(job.job_id, job.global_rank, len(hosts), hosts[0], restart, hosts)
            return self._stand_by(spare, visible_gpus())
        return self.run(start, visible_gpus())

    def run(self, start: Start, gpus: int, came_from: str | None = None) -> dict[str, Any]:
        """Every start of this node in this allocation: the first, then each in-job restart
        task 0 decides after a crash or a hang (``_start_once`` returns the next start)."""
        while True:
            result = self._start_once(start, gpus, came_from)
            if isinstance(result, dict):
                return result
            start, came_from = result

    def restarts_spent(self, start: Start) -> int:
        """Restarts this run has had, as the one budget (``--max-restarts``) counts them
        (``restart_policy.restarts_spent``): Slurm's requeues and this job's in-job restarts,
        less the requeues that were grows (a start before this one that stopped for a grow)."""
        events = ledger.read(self.spec.run_dir.ledger)
        in_job = sum(1 for e in events if e.kind == "restarted" and e.job == start.job_id)
        grows = {e.restart for e in events if e.kind == "stopped" and e.job == start.job_id
                 and e.get("cause") == "grow" and e.restart < start.restart}  # fmt: skip
        return restart_policy.restarts_spent(start.restart, max(in_job, start.round), len(grows))

    def _start_once(
        self, start: Start, gpus: int, came_from: str | None
    ) -> dict[str, Any] | tuple[Start, str]:
        """One start on this node, its launcher beating and watching another's all along
        (``hpc_train.watch.launchers``); this node's result, or its next start in the allocation."""
        self._start, self._training_over = start, False
        spec = self.spec
        pulse = launchers.Pulse(spec.run_dir, start_key(start), start.task, start.hosts,
                                launchers.allowance_s(spec.hang_limits.floor_s),
                                partial(self._on_silent, start),
                                watch=not spec.no_watchdog).start()  # fmt: skip
        try:
            return self._start_body(start, gpus, came_from, pulse)
        finally:
            pulse.stop()

    def _start_body(
        self, start: Start, gpus: int, came_from: str | None, pulse: launchers.Pulse
    ) -> dict[str, Any] | tuple[Start, str]:
        """Plan, resume decision, torchrun, then the restart policy."""
        spec, run = self.spec, self.spec.run_dir
        done = {"node": socket.gethostname(), "restarts": start.restart}
        spent = self.restarts_spent(start)
        if came_from is not None:
            previous_end = came_from
        else:
            previous_end = previous_stop(run, *start_key(start))
            if start.task == 0:
                previous_end = self._blame_lost(start, previous_end)
        log(f"job {start.job_id} start #{spent + 1}: {previous_end}")
        if not restart_policy.restart_allowed(spent, spec.max_restarts):
            raise RuntimeError(f"restart budget exhausted (--max-restarts {spec.max_restarts})")
        spec.save_dir.mkdir(parents=True, exist_ok=True)
        decision = decide_start(run, start, spec, gpus, log)
        if decision.refused:
            self.refuse(start, decision, spent)
        if decision.stop:  # task 0 saw no progress over the last restarts: every task fails
            log(f"stopping the run: {decision.stop}")
            self.note("stopped", cause="no progress", why=decision.stop)
            self._release_spares(start, STOP, decision.stop)
            raise RuntimeError(decision.stop)
        use_gpu, nproc = decision.use_gpu, decision.ranks_per_node
        plan = batch_plan_of(spec, decision)  # task 0's, for every node
        args = command_lines.fairseq_argv(spec, plan, use_gpu)
        if spec.gpus_per_node > 0 and not use_gpu:
            log(f"no GPU visible: falling back to CPU ranks (gloo, legacy_ddp), {nproc} per node")
        log(f"node {start.task + 1}/{start.num_nodes}, {nproc} rank(s) here; {plan.describe()}")
        self.note(
            "started",
            nodes=list(start.hosts),
            world=plan.world_size,
            update_freq=plan.update_freq,
            resume_at=decision.at_update,
            previous=previous_end,
            **({"spares": list(start.standby)} if start.standby else {}),
        )
        if decision.at_update >= spec.updates:
            log(f"checkpoint is at update {decision.at_update}: max-update reached, done")
            self.note("finished", why="max-update reached before this start")
            self._release_spares(start, DONE, "max-update reached")
            return done
        self._marker = run.stop_marker(*start_key(start))
        self._pending = run.notice_pending(*start_key(start))
        beats = run.heartbeats(*start_key(start), node_name())
        worker = WorkerEnv(
            save_dir=spec.save_dir,
            start=start_key(start),
            stop_marker=self._marker,
            notice_pending=self._pending,
            heartbeat_dir=None if spec.no_watchdog else beats,
            sync_save=spec.sync_save,
            # tiered saves: this run's dir on node-local disk
            local_save_dir=run.local_tier(spec.local_save_dir) if spec.local_save_dir else None,
            auto_interval=plan_mod.auto_interval(spec, start.num_nodes, use_gpu),
            audit_samples=spec.audit_samples,
        )
        env = {**os.environ, **worker.to_env()}
        if not use_gpu:
            env.update(instances.plain(instances.cpu_env()))
        else:  # NCCL's flight recorder, dumped on a hang (hang_monitor) or an NCCL timeout
            env.update(hang_monitor.flight_recorder_env(beats))
        argv = self.torchrun_command(start, nproc, args + decision.args)
        log(f"running: {command_lines.shell(argv)}")
        watcher = self._watch_spot(start.job_id)
        # every task notes a notice (USR2) before the requeue's SIGTERM: then it is no cancel
        noted = {signal.SIGTERM: "SIGTERM", signal.SIGUSR2: "notice"}
        previous = {sig: signal.getsignal(sig) for sig in noted}
        for sig, name in noted.items():
            signal.signal(sig, self._recording(name, previous[sig]))
        monitor = slow = wider = None
        try:
            self._proc = subprocess.Popen(
                argv, env=env, preexec_fn=_ignore_usr2, stderr=subprocess.PIPE
            )
            tee = agent_exit.Tee(self._proc.stderr, sys.stderr).start()  # type: ignore[arg-type]
            pulse.beat(WAITING)
            monitor = self._watch_hangs(start, nproc, self._proc.pid)
            slow = self._watch_stragglers(start, spent)  # task 0 only
            wider = self._watch_growth(start)  # task 0, below --nodes MAX
            returncode = self._proc.wait()
            root = tee.root_cause(timeout=ROOT_CAUSE_WAIT_S) if returncode else None
            agent_exit.write(run, *start_key(start), agent_exit.NodeExit(
                start.task, node_name(), returncode, *(root or (None, None))))  # fmt: skip
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            hang = monitor.stop() if monitor else None  # the hang it stopped the ranks for
            evicted = slow.stop() if slow else None  # --evict-stragglers: the node it evicted
            if wider:
                wider.stop()
        if watcher:
            watcher.stop()
        pulse.beat(ENDING)
        saved = read_stop(run, *start_key(start)) is not None
        stuck = monitor.stuck if monitor else None  # torchrun outlived its ranks: we killed it
        if stuck is not None and hang is None:
            returncode, hang = self._after_stuck_agent(start, stuck, saved, returncode)
        elif returncode != 0 and hang is None and self._ranks_finished(start):
            # the agent failed after its ranks finished (its exit barrier lost a stuck peer's
            # store): training is done, no rank reported an error
            stuck = f"torchrun exited {returncode} after its ranks finished training"
            log(stuck)
            returncode = 0
        # a SIGTERM after the save on notice is the requeue ending the job, not a cancel
        cancelled = returncode != 0 and not saved and self.cancelled(start.job_id)
        # the watchdog's kill makes the peers report lost connections: that is not the cause
        crash, repeated = (None, False) if returncode == 0 or hang else self.crash_report(start)
        outcome = restart_policy.after_exit(
            returncode, saved, start.task, spent, spec.max_restarts, cancelled, hang,
            crash, repeated,
        )  # fmt: skip
        outcome = restart_policy.evicting(outcome, evicted.node if evicted else None)
        suspect = self._blame(start, outcome.cause) if outcome.blame else evicted
        progress = start_progress(run, *start_key(start), start.hosts) if start.task == 0 else {}
        if outcome.action is Action.FINISHED:
            why = f"{outcome.why}; then {stuck}: killed" if stuck else outcome.why
            log(why)
            self.note("finished", why=why, **progress)
            self._release_spares(start, DONE, why)
            self._await_watched(start, pulse)
            return done
        if crash and crash[0] == "crash" and suspect is not None:  # the blamed node says why
            crash = ("crash", f"{suspect.node}: {suspect.why}")
        error = {"error": crash[1]} if crash else {}
        self.note("stopped", cause=outcome.cause, why=outcome.why, returncode=returncode,
                  **error, **progress)  # fmt: skip
        if outcome.action in (Action.CANCELLED, Action.STOPPED):
            log(outcome.why)
            self._release_spares(start, DONE, outcome.why)
            return done | ({"stopped": True} if outcome.action is Action.STOPPED else {})
        if outcome.action is Action.FAIL:
            log(outcome.why)
            if start.task != 0 and spec.in_job_restarts:  # task 0 decides: in the job, or not
                return self._follow_verdict(start, outcome.why, done)
            write_verdict(run, *start_key(start), RoundVerdict(STOP, outcome.why))
            raise RuntimeError(outcome.why)
        log(f"job {start.job_id}: {outcome.why}")
        left_out = [suspect.node] if suspect is not None else []
        healthy = [h for h in start.hosts if h not in left_out]
        members, standby = refill(healthy, start.standby, start.num_nodes)  # a spare for each
        if not spec.in_job_restarts or len(members) < spec.nodes_min:
            self._requeue(start, left_out)
        detail = crash[1] if crash else hang or f"torchrun exited with {returncode}"
        why = f"{outcome.cause}: {detail}"
        verdict = RoundVerdict(RESTART_IN_JOB, why, members, standby)
        write_verdict(run, *start_key(start), verdict)
        # each node left out goes back to Slurm once its task has ended (a watcher thread)
        tasks = {start.hosts.index(n): n for n in left_out}
        release.start(release.LeftOut(run, start_key(start), start.job_id, tasks), log, self.note)
        spare_in = members[len(healthy) :]
        self.note("restarted", why=why, members=members, left_out=left_out, round=start.round + 1,
                  **({"spare_in": spare_in, "spares": standby} if start.standby else {}))  # fmt: skip
        log(f"in-job restart on {', '.join(members)} (without {', '.join(left_out) or 'none'}"
            + (f"; hot spare {', '.join(spare_in)} in" if spare_in else "") + ")")  # fmt: skip
        return self._next_round(start, members, why, done, standby)

    def _next_round(
        self,
        start: Start,
        members: Sequence[str],
        why: str,
        done: dict[str, Any],
        standby: Sequence[str] = (),
    ) -> dict[str, Any] | tuple[Start, str]:
        """This node's part in an in-job restart on ``members``: its next start, or (left out,
        blamed) the end of its task, a success: the run goes on without it."""
        me = start.hosts[start.task]
        if me not in members:
            log(f"left out of the in-job restart ({why}): this task ends")
            return done | {"left_out": True}
        return start.next_round(members, me, standby), f"{IN_JOB_RESTART} after {why}"

    def _on_silent(self, start: Start, silence: launchers.Silence) -> None:
        """The pulse thread found a watched launcher stuck: blame its node (drained unless
        --no-drain), then requeue without it; while training, after a save on notice (the
        ranks are alive). Task 0 leaves the requeue to submitit's ``checkpoint()`` as for any
        notice; task 1, acting for a stuck task 0 (``deputy``), waits for the save itself."""
        spec, run, key = self.spec, self.spec.run_dir, start_key(start)
        deputy, training = start.task != 0, not self._training_over
        why = f"stuck launcher: {silence.describe()}"
        gone = self._start_over(start)
        if gone:  # e.g. this node's slurmd died: the job was requeued and its processes left
            log(f"{why}; not acted on: {gone}")
            return
        log(why)
        note = self.deputy_note if deputy else self.note
        node_blame.blame(run, *key, silence.node, why, not spec.no_drain, note, log)
        if training and not deputy:
            self._own_notice = "hang"
            slurm.signal(start.job_id, "USR2")  # the save on notice, then submitit's requeue
            return
        saved = False
        if training:
            slurm.signal(start.job_id, "USR2")
            with contextlib.suppress(TimeoutError):
                saved = bool(wait_until(lambda: read_stop(run, *key), "the save on notice",
                                        self.save_wait_s(), FAST))  # fmt: skip
        note("stopped", cause="hang", why=why, saved=saved)
        blocked = self._send_requeue(start, [silence.node], why, deputy)
        if blocked is not None:
            slurm.cancel(start.job_id)  # nothing can replace the node: end the job, not hold it

    def _start_over(self, start: Start) -> str:
        """Why this launcher's start is no longer the job's ("" while it is): the job is not
        RUNNING at the restart it was started at. A launcher its slurmd left behind (a node
        lost, its processes alive) must not blame, drain or signal the job's next start."""
        try:
            state = slurm.job_state(start.job_id)
        except slurm.SlurmError:
            return ""  # cannot tell: act as the one in charge
        if state.state == "RUNNING" and state.restarts == start.restart:
            return ""
        return (
            f"job {start.job_id} is {state.state} at restart {state.restarts}; this launcher "
            f"belongs to restart {start.restart}"
        )

    def _await_watched(self, start: Start, pulse: launchers.Pulse) -> None:
        """Training is over: wait for the launchers this one watches to end their part (a stuck
        one holds the job's nodes to the time limit: the pulse requeues without it)."""
        self._training_over = True
        pulse.beat(ENDED)  # first: the launcher watching this one waits for it too
        run, key = self.spec.run_dir, start_key(start)

        def ended() -> bool | None:  # (a launcher that never beat is not one: a test's stand-in)
            beats = [read_launcher_beat(run, *key, t) for t in pulse.watching]
            return pulse.said is not None or all(b.phase == ENDED for b in beats if b is not None)

        with contextlib.suppress(TimeoutError):
            wait_until(ended, "the other launchers' end", 4 * pulse.allowance, SPARE_POLL)
        if pulse.said is not None:
            time.sleep(
                REQUEUE_GRACE_S
            )  # the requeue ends this task; never report success meanwhile

    def _release_spares(self, start: Start, action: str, why: str) -> None:
        """Task 0, as the run ends in this allocation: the hot spares standing by end too."""
        if start.task == 0 and start.standby:
            verdict = RoundVerdict(action, why, [], list(start.standby))
            write_verdict(self.spec.run_dir, *start_key(start), verdict)

    def _stand_by(self, spare: Start, gpus: int) -> dict[str, Any]:
        """A hot spare (``--spares``): idle, reading task 0's word after each round, until a
        round takes it in (then it trains as a member) or the run ends in this allocation."""
        me, job_round = spare.hosts[spare.task], 0
        trains = spare.num_nodes - self.spec.spares_in(spare.num_nodes)
        log(f"hot spare: standing by ({trains} node(s) train)")
        while True:
            job_key, restart = start_key(dataclasses.replace(spare, round=job_round))
            verdict = wait_until(partial(read_verdict, self.spec.run_dir, job_key, restart),
                                 f"round {job_round}'s end", None, SPARE_POLL)  # fmt: skip
            if verdict.action == RESTART_IN_JOB and me in verdict.members:
                members = verdict.members
                start = Start(spare.job_id, members.index(me), len(members), members[0],
                              spare.restart, tuple(members), job_round + 1,
                              tuple(verdict.standby))  # fmt: skip
                log(f"hot spare taken in for round {job_round + 1}: {verdict.why}")
                return self.run(start, gpus, f"{IN_JOB_RESTART} after {verdict.why}")
            if verdict.action == RESTART_IN_JOB:
                job_round += 1
                continue
            done = {"node": socket.gethostname(), "restarts": spare.restart, "spare": True}
            if verdict.action == DONE:
                log(f"hot spare released: {verdict.why}")
                return done
            if verdict.action == REQUEUE:
                time.sleep(REQUEUE_GRACE_S)  # task 0's requeue ends this task
            raise RuntimeError(f"hot spare: task 0 said {verdict.action} ({verdict.why})")

    def _follow_verdict(
        self, start: Start, why: str, done: dict[str, Any]
    ) -> dict[str, Any] | tuple[Start, str]:
        """A node other than task 0's, after a bad end: wait for task 0's word and follow it."""
        key = start_key(start)
        try:
            verdict = wait_until(lambda: read_verdict(self.spec.run_dir, *key),
                                 "task 0's verdict", VERDICT_WAIT_S, FAST)  # fmt: skip
        except TimeoutError:
            raise RuntimeError(f"{why}; task 0 said nothing in {VERDICT_WAIT_S:.0f} s") from None
        if verdict.action == RESTART_IN_JOB:
            return self._next_round(start, verdict.members, verdict.why, done, verdict.standby)
        if verdict.action == REQUEUE:
            time.sleep(REQUEUE_GRACE_S)  # task 0's requeue ends this task
        raise RuntimeError(f"{why}; task 0: {verdict.action} ({verdict.why})")

    def _after_stuck_agent(
        self, start: Start, stuck: str, saved: bool, returncode: int
    ) -> tuple[int, str | None]:
        """torchrun outlived this node's ranks and its monitor killed it: the start ends as the
        ranks left it: finished or saved on notice (the kill was ours: exit 0), else a hang."""
        if saved or self._ranks_finished(start):
            log(f"torchrun was stuck after its ranks finished ({stuck}): killed")
            return 0, None
        return returncode, f"torchrun stuck: {stuck}"

    def _ranks_finished(self, start: Start) -> bool:
        """Did every rank of this node reach max-update (its heartbeat) with no crash report?"""
        run, (job, restart) = self.spec.run_dir, start_key(start)
        beats = read_beats(run.heartbeats(job, restart, node_name()))
        return (
            bool(beats)
            and min(b.update for b in beats) >= self.spec.updates
            and not failures.read(run, job, restart)
        )

    def refuse(self, start: Start, decision: StartDecision, spent: int) -> None:
        """The start cannot run (a node short of GPUs): task 0 blames those nodes, drains them
        (unless --no-drain), requeues without them while the budget lasts (``spent``: the
        restarts it has counted, ``restarts_spent``); every task fails this start."""
        why = f"start refused: {decision.refused}"
        log(why)
        if start.task != 0:
            raise RuntimeError(f"{why}; task 0 requeues")
        self.note("stopped", cause="bad node", why=decision.refused)
        for node in decision.bad_nodes:
            node_blame.blame(self.spec.run_dir, *start_key(start), node, decision.refused,
                             not self.spec.no_drain, self.note, log)  # fmt: skip
        outcome = restart_policy.after_refusal(why, spent, self.spec.max_restarts)
        if outcome.action is Action.FAIL:
            raise RuntimeError(outcome.why)
        self._requeue(
            start, decision.bad_nodes, f"{why}: requeued without {', '.join(decision.bad_nodes)}"
        )

    def _requeue(
        self, start: Start, leave_out: Sequence[str], ended: str = "requeue did not take effect"
    ) -> NoReturn:
        """Task 0 requeues the job without ``leave_out`` (the nodes it blamed), unless the job
        could not start again: too few usable nodes in its partition and nothing to replace
        them (``restart_policy.requeue_blocked``): then the run stops, saying which nodes."""
        blocked = self._send_requeue(start, leave_out, ended)
        if blocked is not None:
            raise RuntimeError(blocked.why)
        time.sleep(REQUEUE_GRACE_S)  # the requeue ends this task; never report success meanwhile
        raise RuntimeError(ended)

    def _send_requeue(
        self, start: Start, leave_out: Sequence[str], ended: str, deputy: bool = False
    ) -> restart_policy.Decision | None:
        """Requeue the job without ``leave_out`` and tell the other launchers; or, when the
        requeued job could not start, tell them to stop and return why (nothing requeued)."""
        by_name, blocked, said = self._requeue_plan(leave_out)
        if said:
            log(said)
            (self.deputy_note if deputy else self.note)(
                "requeue_blocked", why=said, waiting=blocked is None
            )
        if blocked is not None:
            write_verdict(self.spec.run_dir, *start_key(start), RoundVerdict(STOP, blocked.why))
            return blocked
        write_verdict(self.spec.run_dir, *start_key(start), RoundVerdict(REQUEUE, ended))
        (self.deputy_note if deputy else self.note)("requeued", by=f"task {start.task}")
        slurm.requeue(start.job_id)
        if by_name:
            node_blame.exclude(start.job_id, by_name, log)
        return None

    def _requeue_plan(
        self, leave_out: Sequence[str]
    ) -> tuple[list[str], restart_policy.Decision | None, str]:
        """Which of ``leave_out`` the requeue excludes by name, and could the requeued job
        start? (One sinfo, one scontrol; a Slurm error is said and the requeue goes ahead,
        every blamed node excluded: it is Slurm's to refuse then.)"""
        spec = self.spec
        try:
            states = slurm.partition_nodes(spec.partition)
            replaced = restart_policy.nodes_replaced(spec.nodes_replaced, states)
            blamed = restart_policy.excluded_by_name(leave_out, replaced, not spec.no_drain)
            held = restart_policy.quarantined_by_name(
                quarantine.nodes(spec.run_dir), states, replaced
            )  # fmt: skip
            by_name = sorted(set(blamed) | set(held))
            excluded = self._excluded() | set(by_name)
        except slurm.SlurmError as err:
            log(f"cannot tell whether the requeued job can start ({err}): requeueing")
            return list(leave_out), None, ""
        blocked, said = restart_policy.requeue_blocked(states, excluded, spec.nodes_min, replaced)
        return by_name, blocked, said

    def _excluded(self) -> set[str]:
        """The nodes this run keeps out of its job: the job's ExcNodeList (the nodes it blamed)
        and the quarantine list."""
        start = self._start
        info = slurm.job_info(start.job_id) if start else None
        listed = (info or {}).get("ExcNodeList", "(null)")
        excluded = set(slurm.hostnames(listed)) if listed not in ("", "(null)") else set()
        return excluded | set(quarantine.nodes(self.spec.run_dir))

    def _watch_growth(self, start: Start) -> GrowWatch | None:
        """Task 0's grow-back thread while this start runs on fewer than ``--nodes`` MAX
        (``hpc_train.watch.grow_monitor``); none with ``--grow-after 0``."""
        spec = self.spec
        if start.task != 0 or start.num_nodes >= spec.nodes_max or spec.grow_after <= 0:
            return None
        try:
            end = slurm.job_info(start.job_id) or {}
            end_time = time.mktime(time.strptime(end["EndTime"], "%Y-%m-%dT%H:%M:%S"))
        except (slurm.SlurmError, KeyError, ValueError):
            end_time = None  # no limit known: grow whenever nodes come free

        def grow(target: int, why: str) -> None:
            self._own_notice = "grow"
            log(f"grow: from {start.num_nodes} to {target} node(s): {why}; saving on notice")
            self.note("grown", **{"from": start.num_nodes, "to": target, "why": why})
            slurm.signal(start.job_id, "USR2")  # the save on notice, then submitit's requeue

        return GrowWatch(
            spec.partition, start.hosts, spec.nodes_max, spec.grow_after, self._excluded,
            end_time, grow, log,
        ).start()  # fmt: skip

    def save_wait_s(self) -> float:
        """The longest checkpoint() waits for the save on notice (see ``SAVE_WAIT_ENV``)."""
        if os.environ.get(SAVE_WAIT_ENV):
            return float(os.environ[SAVE_WAIT_ENV])
        spec = self.spec
        measured = costs.measured_save_s(ledger.read(spec.run_dir.ledger))
        return costs.notice_wait_s(spec.preset, spec.gpus_per_node > 0, SIGNAL_DELAY_S,
                                   measured_s=measured)  # fmt: skip

    def crash_report(self, start: Start) -> tuple[tuple[str, str] | None, bool]:
        """(class, description) of the exception that ended this start's workers, if any said,
        and whether the start before died of the same user error at the same update."""
        run, (job, restart) = self.spec.run_dir, start_key(start)
        if start.task == 0:  # it decides: every node's exit record and its ranks' reports
            now = node_blame.crash_evidence(run, job, restart, start.hosts)
        else:
            now = failures.read(run, job, restart)
        cause = failures.first(now)
        if cause is None:
            return None, False
        before = failures.read(run, job, restart - 1) if restart > 0 else []
        repeated = failures.repeated(now, before) is not None
        if all(f.witness for f in now):  # only peers saw a rank go away: the peers' symptom
            return ("crash", f"a rank died without a word; its peers saw {cause.describe()}"), False
        return (cause.cause, cause.describe()), repeated

    def _watch_hangs(self, start: Start, nproc: int, pid: int) -> hang_monitor.Monitor | None:
        """This node's hang watchdog (``hpc_train.watch.hang_monitor``), unless ``--no-watchdog``."""
        spec = self.spec
        if spec.no_watchdog:
            return None
        run, node = spec.run_dir, node_name()
        limits = spec.hang_limits
        return hang_monitor.Monitor(
            run, *start_key(start), node, nproc, start.num_nodes, limits, pid,
            lambda: process_exited(pid), log,
        ).start()  # fmt: skip

    def _watch_stragglers(self, start: Start, spent: int) -> straggler_monitor.Watch | None:
        """Task 0's straggler thread (``hpc_train.watch.straggler_monitor``), unless
        ``--no-watchdog`` (no heartbeats); it evicts only with a restart left (``spent``: the
        restarts the budget has counted, ``restarts_spent``)."""
        spec = self.spec
        if spec.no_watchdog:
            return None
        evict = spec.evict_stragglers and restart_policy.may_requeue(spent, spec.max_restarts)
        return straggler_monitor.watch(
            spec.run_dir, start, start_key(start)[0], spec.straggler_limits, evict,
            not spec.no_drain, self.note, log,
        )  # fmt: skip

    def _blame_lost(self, start: Start, previous_end: str) -> str:
        """Task 0, after a start Slurm ended by itself: blame the nodes it lost (NODE_FAIL);
        the previous start's end, as the log and the ledger say it."""
        run, (job, restart) = self.spec.run_dir, start_key(start)
        lost = node_blame.lost_nodes(node_blame.unrecorded_end(run, job, restart), log)
        for node, state in lost:
            node_blame.blame(run, job, restart, node, f"node failure in job {job}: {state}",
                             not self.spec.no_drain, self.note, log)  # fmt: skip
        if not lost:
            return previous_end
        return f"node failure ({', '.join(f'{n} {s}' for n, s in lost)}): last periodic checkpoint"

    def _blame(self, start: Start, cause: str) -> hang_monitor.Suspect | None:
        """Task 0: the node to blame for this stop (a hang's suspect, the node of a crash),
        blamed (``hpc_train.faults.node_blame``: ledger, quarantine, drain unless --no-drain)."""
        run, (job, restart) = self.spec.run_dir, start_key(start)
        if cause == "hang":
            found = hang_monitor.blame(run, job, restart, start.hosts, log)
            why = f"hang in job {job}: {found.why}" if found else ""
        else:
            ranks = node_blame.rank_nodes(run, job, restart, start.hosts)
            exits = agent_exit.read(run, job, restart, len(start.hosts)).values()
            crash = node_blame.crash_suspect(
                failures.read(run, job, restart), list(exits), start.hosts, ranks
            )
            found = hang_monitor.Suspect(crash[0], None, crash[1]) if crash else None
            why = f"crash in job {job}: {crash[1]}" if crash else ""
        if found is not None:
            node_blame.blame(run, job, restart, found.node, why, not self.spec.no_drain,
                             self.note, log, rank=found.rank)  # fmt: skip
        return found

    def _watch_spot(self, job_id: str) -> SpotWatcher | None:
        endpoint = endpoint_to_watch()
        if endpoint is None:
            log(
                "spot watch off: not on EC2 (set HPC_TRAIN_IMDS_ENDPOINT to watch a metadata server)"
            )
            return None

        def on_notice(action: dict[str, str]) -> None:
            log(f"spot notice {action.get('action')} at {action.get('time')}: signalling the job")
            slurm.signal(job_id, "USR2")

        # the default is the planner's too (costs.SPOT_POLL_S: how late a notice may be seen)
        interval = float(os.environ.get("HPC_TRAIN_SPOT_POLL_S", costs.SPOT_POLL_S))
        watcher = SpotWatcher(on_notice, log, endpoint=endpoint, interval_s=interval)
        watcher.start()
        return watcher

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook on USR2 (task 0): wait for the workers' save, then requeue.

        The save is durable once the stop marker exists (rank 0 writes it after the checkpoint);
        the workers' exit can take much longer (DataLoader processes shutting down), so whichever
        comes first ends the wait. Runs inside a signal handler: a blocking wait here deadlocks
        on the lock the interrupted ``wait()`` holds, and ``poll()`` cannot see the exit for the
        same reason: read /proc.
        """
        import submitit

        started = time.monotonic()
        self._signals.append("notice")
        start = self._start
        done = read_verdict(self.spec.run_dir, *start_key(start)) if start else None
        if done is not None and done.action == REQUEUE:  # task 1 acted for this (stuck) task
            log(f"notice after the job was requeued ({done.why}): nothing to add")
            return submitit.helpers.DelayedSubmission(Launcher(self.spec))
        log("notice received: waiting for the workers to save checkpoint_last.pt")
        self.note("notice", signal="USR2")
        proc, marker = self._proc, self._marker
        wait_s = self.save_wait_s()

        def saved_or_exited() -> str | None:
            if marker is not None and marker.exists():
                return "the save on notice is durable"
            if proc is None or process_exited(proc.pid):
                return "workers exited"
            return None

        try:
            what = wait_until(saved_or_exited, "the save on notice", wait_s, FAST)
            log(f"{what} {time.monotonic() - started:.1f} s after the notice: requeueing")
            saved = marker is not None and marker.exists()
        except TimeoutError:
            log(f"no save on notice after {wait_s:.0f} s: requeueing anyway")
            saved = False
        why = "saved on notice" if saved else "notice, but no save on notice in time"
        progress = (
            start_progress(self.spec.run_dir, *start_key(start), start.hosts) if start else {}
        )
        cause = self._own_notice or "notice"
        self.note("stopped", cause=cause, why=why, saved=saved, **progress)
        self.note("requeued", by="submitit (notice)")
        return submitit.helpers.DelayedSubmission(Launcher(self.spec))
