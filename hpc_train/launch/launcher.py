"""The launcher: the callable submitit runs as one Slurm task per node.

On every (re)start task 0 decides for all nodes (``starts.decide_start``: the geometry, the
batch plan, what to resume from) and each node runs one torchrun agent that starts the training
workers. Resume state always comes from the save dir, never from the pickled submission, so a
requeue Slurm performs by itself (node failure, spot loss, ``scontrol requeue``) resumes too.

``Launcher`` holds what submitit pickles and what its hooks need; each concern is a part of
``hpc_train.launch`` (its docstring lists them). Every end of a start goes the same three steps:
its evidence read once (``faults.end_evidence``), the pure policy (``restart_policy.after_end``,
by way of ``recovery.what_follows``) and the one executor (``recovery.carry_out``).

Interruptions:
- USR2 (preemption, time limit, spot notice): the workers save at the next update and exit;
  submitit calls ``checkpoint()`` on task 0, which waits for that save, then submitit requeues.
- torchrun fails (a rank or a node died): task 0 requeues the job while restarts remain
  (``hpc_train.launch.restart_policy`` decides); with ``--restart-in-job`` it restarts training
  in the same allocation on the healthy nodes instead (``contract.RoundVerdict``: the others
  wait for its word; a blamed node's task ends), and requeues only below MIN healthy nodes.
  With ``--spares K`` the last K nodes of the allocation stand by (``rounds.stand_by``) and
  task 0 swaps one in for each node it leaves out: the width, and the recipe's batch, stay N.
- no progress (a hang): each node's watchdog thread (``hpc_train.watch.hang_monitor``) saves its
  ranks' stacks and stops them; task 0 names the suspect node, drains it (unless
  ``--no-drain``), and requeues without it (or restarts in the job without it). A torchrun that
  outlives its ranks is killed by the same thread (a stuck agent); ranks that outlive their
  torchrun (a killed agent) are killed as it exits (``lifecycle.end_leftovers``).
- a requeue that could not start (too few usable nodes in the partition) is said and, where
  nothing replaces drained nodes, stops the run instead.
- a straggler (a node's own compute >= 20 % slower for minutes): task 0 names it
  (``hpc_train.watch.straggler_monitor``); ``--evict-stragglers``: save, requeue, exclude it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from hpc_core import doorbell, ledger
from hpc_core.ledger import Kind
from hpc_core.slurm_env import SlurmEnv
from hpc_core.wait import wait_until
from hpc_train.contract import (
    ENDED,
    ENDING,
    WAITING,
    Cause,
    FailureRecord,
    RoundAction,
    node_name,
)
from hpc_train.faults import agent_exit, end_evidence, failures, storage
from hpc_train.faults.end_evidence import Ended, Ending
from hpc_train.job import command_lines, upgrade
from hpc_train.job.spec import JobSpec
from hpc_train.launch import lifecycle, notify, recovery, requeue, restart_policy, rounds, signals
from hpc_train.launch.context import Here, log
from hpc_train.launch.rounds import Onward
from hpc_train.launch.signals import SAVE_WAIT_ENV as SAVE_WAIT_ENV
from hpc_train.launch.starts import Start, allocation_start, warm_decider
from hpc_train.watch import launchers

ROOT_CAUSE_WAIT_S = 5.0  # to copy torchrun's last stderr lines (its summary) after its exit


class Launcher:
    """Run by submitit on each node of the allocation (``ntasks_per_node=1``)."""

    def __init__(self, spec: JobSpec) -> None:
        self._ready(spec)

    def __getstate__(self) -> dict[str, Any]:
        """What submitit pickles (at submit, and on requeue): the spec as plain values, which a
        later version of the toolkit can read (``job.upgrade``); never a live process."""
        return {"spec": upgrade.plain(self.spec)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled on a node, maybe by a later version than the one that pickled it: a spec
        it cannot read is one line at ``__call__`` (``upgrade.Unreadable``), never a traceback
        in submitit's loader."""
        try:
            spec = upgrade.read(state["spec"])
        except upgrade.Unreadable as err:
            self._unreadable: str | None = upgrade.unreadable_line(str(err))
            return
        self._ready(spec)

    def _ready(self, spec: JobSpec) -> None:
        """This process's launcher for ``spec``: nothing started yet."""
        self.spec = spec
        self._unreadable = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._marker: Path | None = None  # this start's stop marker: the save on notice is durable
        self._pending: Path | None = None  # this start's record of a notice, for its ranks
        self._signals: list[str] = []  # SIGTERM / notice, in the order this start received them
        # the running start, as its parts see it (``_begin``); the hooks that run outside the
        # start's own call read it: submitit's ``checkpoint()``, the pulse's ``_on_silent``
        self._here: Here | None = None
        # a notice task 0 sends itself (a grow, a stuck launcher): its cause, from the watcher
        # thread that sends it to ``checkpoint()`` in the signal's handler (``OwnNotice``)
        self._own_notice = signals.OwnNotice()
        self._training_over = False  # this start's torchrun ended well: only exits are awaited

    def _begin(self, start: Start) -> Here:
        """This node's ``start`` begins: its ``Here``, built once and kept as the running
        start (``_here``) for the hooks; training not over yet."""
        self._here, self._training_over = self.here(start), False
        return self._here

    def note(self, kind: Kind, **data: Any) -> None:
        """Task 0 records a stage of this start in the run's ledger (the others never do)."""
        self._record(kind, data)

    def deputy_note(self, kind: Kind, **data: Any) -> None:
        """What ``note`` does, from task 1 acting for a stuck task 0."""
        self._record(kind, data, deputy=True)

    def _record(self, kind: Kind, data: dict[str, Any], deputy: bool = False) -> None:
        if self._here is None or (self._here.start.task != 0 and not deputy):
            return
        start = self._here.start
        try:
            event = ledger.record(
                self.spec.run_dir.ledger, kind, start.job_id, start.restart, **data
            )
        except OSError as err:  # the ledger is a record: never a reason to stop training
            log(f"could not write the ledger ({err})")
            event = ledger.Event(kind, time.time(), start.job_id, start.restart, data)
        if self.spec.notify.command:
            notify.notify(self.spec.notify.command, event, self.spec.training.save_dir, log)

    def here(self, start: Start) -> Here:
        """This start as every part sees it (its key computed once)."""
        return Here.of(self.spec, start, self.note, self.deputy_note)

    def torchrun_command(self, start: Start, nproc: int, args: list[str]) -> list[str]:
        return command_lines.torchrun_argv(lifecycle.torchrun_path(), start.num_nodes, nproc,
                                           start.first_host, start.job_id, args, start.round,
                                           command_lines.worker_module(self.spec))  # fmt: skip

    def __call__(self) -> dict[str, Any]:
        if self._unreadable is not None:
            raise SystemExit(self._unreadable)  # one line, the task fails: no traceback
        import submitit

        job = submitit.JobEnvironment()
        restart = SlurmEnv().restart_count
        hosts = tuple(job.hostnames)
        spare_count = self.spec.spares_in(len(hosts))  # derived once: the spares of this job
        start = allocation_start(job.job_id, job.global_rank, hosts, restart, spare_count)
        me = Start(job.job_id, job.global_rank, len(hosts), hosts[0], restart, hosts)
        doorbell.open_here(self.spec.run_dir.bells, hosts[me.task], me.bell_key)  # before a word
        gpus = lifecycle.visible_gpus(self.spec.sizing.gpus_per_node)
        if start is None:  # a hot spare: idle until task 0 swaps it in, or the run ends
            return self._stand_by(me, gpus, len(hosts) - spare_count)
        return self.run(start, gpus)

    def run(self, start: Start, gpus: int, came_from: str | None = None) -> dict[str, Any]:
        """Every start of this node in this allocation: the first, then each in-job restart
        task 0 decides after a crash or a hang (``_start_once`` returns the next start)."""
        while True:
            onward = self._start_once(start, gpus, came_from)
            if onward.start is None:
                return onward.result or {}
            start, came_from = onward.start, onward.came_from

    def _stand_by(self, spare: Start, gpus: int, trains: int) -> dict[str, Any]:
        """A hot spare (``rounds.stand_by``; ``trains``: the nodes that train): it trains once
        a round takes it in."""
        onward = rounds.stand_by(self.here(spare), trains)
        if onward.start is None:
            return onward.result or {}
        return self.run(onward.start, gpus, onward.came_from)

    def restarts_spent(self, start: Start) -> int:
        """Restarts this run has had, as the one budget (``--max-restarts``) counts them
        (``restart_policy.restarts_spent``): Slurm's requeues and this job's in-job restarts,
        less the requeues that were grows (a start before this one that stopped for a grow)."""
        events = ledger.read(self.spec.run_dir.ledger)
        in_job = sum(1 for e in events if e.kind == Kind.RESTARTED and e.job == start.job_id)
        grows = {e.restart for e in events if e.kind == Kind.STOPPED and e.job == start.job_id
                 and e.get("cause") == Cause.GROW and e.restart < start.restart}  # fmt: skip
        return restart_policy.restarts_spent(start.restart, max(in_job, start.round), len(grows))

    def _start_once(self, start: Start, gpus: int, came_from: str | None) -> Onward:
        """One start on this node, its launcher beating and watching another's all along
        (``hpc_train.watch.launchers``); this node's result, or its next start in the allocation."""
        here = self._begin(start)
        spec = self.spec
        pulse = launchers.Pulse(here.files, start.task, start.hosts,
                                launchers.allowance_s(spec.watch.hang.floor_s),
                                partial(self._on_silent, start),
                                watch=not spec.watch.no_watchdog, log=log).start()  # fmt: skip
        try:
            return self._start_body(here, gpus, came_from, pulse)
        finally:
            pulse.stop()

    def _start_body(
        self, here: Here, gpus: int, came_from: str | None, pulse: launchers.Pulse
    ) -> Onward:
        """Decide (``lifecycle``), train (torchrun), then what follows: the end's evidence read
        once, the policy's transition, carried out (``recovery``)."""
        spent = self.restarts_spent(here.start)
        decision, before = lifecycle.begin(here, spent, gpus, came_from)
        args = lifecycle.announce(here, decision, before)
        if decision.at_update >= self.spec.updates:
            reached = f"checkpoint is at update {decision.at_update}: max-update reached, done"
            ev = end_evidence.at_start(Ending.REACHED, here.where(spent), detail=reached)
            return recovery.carry_out(here, recovery.what_follows(ev, here.options), ev)
        ended = self._train(here, decision.use_gpu, decision.ranks_per_node, args, spent, pulse)
        ev = end_evidence.at_exit(here.where(spent), ended, self._signals, self.spec.updates)
        finished = recovery.EndPath(finished=partial(self._await_watched, here, pulse))
        return recovery.carry_out(here, recovery.what_follows(ev, here.options), ev, finished)

    def _train(self, here: Here, use_gpu: bool, nproc: int, args: list[str], spent: int,
               pulse: launchers.Pulse) -> Ended:  # fmt: skip
        """torchrun on this node, its watcher threads beside it, until it exits."""
        worker, env = lifecycle.environment(here, use_gpu)
        self._marker, self._pending = worker.stop_marker, worker.notice_pending
        argv = self.torchrun_command(here.start, nproc, args)
        log(f"running: {command_lines.shell(argv)}")
        watchers = lifecycle.Watchers()
        try:
            with (
                signals.recording(self._signals, self._pending),
                agent_exit.Tee(sys.stderr) as tee,
            ):
                self._proc = subprocess.Popen(
                    argv, env=env, preexec_fn=signals.ignore_usr2, stderr=tee.file
                )
                tee.start()
                pulse.beat(WAITING)
                watchers.start(here, nproc, self._proc.pid, spent, self._own_notice)
                warm_decider(here.start, self.spec)  # idle while its ranks train
                returncode = self._proc.wait()
                lifecycle.end_leftovers(here, returncode)  # a killed agent's ranks train on
                said, probe = self._record_exit(here, returncode, tee)
        finally:
            hang, evicted, stuck = watchers.stop()
        pulse.beat(ENDING)
        saved = here.files.stop() is not None
        return Ended(returncode, saved, hang, evicted, stuck, said, probe)

    def _record_exit(
        self, here: Here, returncode: int, tee: agent_exit.Tee
    ) -> tuple[tuple[FailureRecord, ...], failures.Probe | None]:
        """This node's exit record for task 0 (``faults.failures.NodeExit``): torchrun's exit,
        its root cause, and after a failure the reports its ranks said on stderr and a probe of
        the save dir from here (storage evidence on no file there); (said, probe)."""
        root = tee.finish(timeout=ROOT_CAUSE_WAIT_S) if returncode else None
        rank, code = root or (None, None)
        said = tuple(tee.failures)
        probe = storage.probe(self.spec.training.save_dir, node_name()) if returncode else None
        record = failures.NodeExit(
            here.start.task, node_name(), returncode, rank, code,
            tuple(asdict(r) for r in said), asdict(probe) if probe else None,
        )  # fmt: skip
        failures.write_exit(here.files, record)
        here.start.ring_decider(here.run)
        return said, probe

    def _await_watched(self, here: Here, pulse: launchers.Pulse) -> None:
        """Training is over: wait for the launchers this one watches to end their part (a stuck
        one holds the job's nodes to the time limit: the pulse requeues without it)."""
        self._training_over = True
        pulse.beat(ENDED)  # first: the launcher watching this one waits for it too

        def ended() -> bool | None:  # (a launcher that never beat is not one: a test's stand-in)
            beats = [here.files.launcher_beat(t) for t in pulse.watching]
            return pulse.said is not None or all(b.phase == ENDED for b in beats if b is not None)

        with contextlib.suppress(TimeoutError):
            wait_until(ended, "the other launchers' end", 4 * pulse.allowance, rounds.SPARE_POLL)
        if pulse.said is not None:
            requeue.await_end()  # the requeue ends this task; never report success meanwhile

    def _on_silent(self, start: Start, silence: launchers.Silence) -> None:
        """The pulse found a watched launcher stuck: that end's evidence, the policy's
        transition, carried out from the pulse's thread (task 0 while training: its own
        notice, submitit's requeue; else a requeue, or the job's end)."""
        here = self._here if self._here is not None else self.here(start)
        ev = end_evidence.at_start(Ending.SILENT, here.where(), detail=silence.describe(),
                                   nodes=(silence.node,), training=not self._training_over)  # fmt: skip
        path = recovery.EndPath(own_notice=self._own_notice, pulse=True)
        recovery.carry_out(here, recovery.what_follows(ev, here.options), ev, path)

    def save_wait_s(self) -> float:
        """The longest checkpoint() waits for the save on notice (``signals.save_wait_s``)."""
        return signals.save_wait_s(self.spec)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook on USR2 (task 0): wait for the workers' save, then requeue.

        The save is durable once the stop marker exists (rank 0 writes it after the checkpoint);
        the workers' exit can take much longer (DataLoader processes shutting down), so whichever
        comes first ends the wait (``signals.wait_for_save``). Runs inside a signal handler.
        """
        import submitit

        if self._unreadable is not None:  # nothing runs: nothing to save, nothing to requeue
            log(self._unreadable)
            return None
        self._signals.append("notice")
        here = self._here
        done = here.files.verdict() if here else None
        if done is not None and done.action == RoundAction.REQUEUE:  # task 1 acted for this task
            log(f"notice after the job was requeued ({done.why}): nothing to add")
            return submitit.helpers.DelayedSubmission(Launcher(self.spec))
        log("notice received: waiting for the workers to save checkpoint_last.pt")
        self.note(Kind.NOTICE, signal="USR2")
        proc = self._proc
        exited = signals.workers_exited(proc.pid if proc else None)
        saved = signals.wait_for_save(self._marker, self.save_wait_s(), exited)
        if here is not None:  # the stop and submitit's requeue, recorded by the executor
            ev = end_evidence.at_notice(here.where(), saved, self._own_notice.cause())
            recovery.carry_out(here, recovery.what_follows(ev, here.options), ev)
        return submitit.helpers.DelayedSubmission(Launcher(self.spec))
