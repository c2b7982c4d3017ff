"""The launcher: the callable submitit runs as one Slurm task per node.

On every (re)start it looks at what it actually got (node count, GPUs), recomputes the batch
plan, decides what to resume from (task 0 checks ``checkpoint_last.pt`` and falls back; the other
nodes read its decision), and runs one torchrun agent that starts the training workers. Resume
state always comes from the save dir, never from the pickled submission, so a requeue Slurm
performs by itself (node failure, spot loss, ``scontrol requeue``) resumes too.

Interruptions:
- USR2 (preemption, time limit, spot notice): the workers save at the next update and exit;
  submitit calls ``checkpoint()`` on task 0, which waits for that save, then submitit requeues.
- torchrun fails (a rank or a node died): task 0 requeues the job while restarts remain
  (``hpc_train.restarts`` decides).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_core import instances, slurm
from hpc_core.rundir import STOP_MARKER_ENV, ResumeDecision, RunDir
from hpc_core.wait import FAST, wait_until
from hpc_train import checkpoints, commands, restarts
from hpc_train.restarts import Action
from hpc_train.spec import JobSpec
from hpc_train.spot import SpotWatcher, endpoint_to_watch

# checkpoint() waits this long for the save: inside the local cluster's GraceTime (30 s) and
# submitit's USR2@90 before the time limit. Set HPC_TRAIN_SAVE_WAIT_S for a longer grace time.
SAVE_WAIT_S = float(os.environ.get("HPC_TRAIN_SAVE_WAIT_S", "25"))
DECISION_WAIT_S = 300.0
REQUEUE_GRACE_S = 60.0  # after `scontrol requeue` Slurm ends this task; never succeed meanwhile


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


def has_exited(pid: int) -> bool:
    """True once ``pid`` has exited (zombie or gone), without reaping it.

    Inside a signal handler that interrupted ``Popen.wait()``, ``Popen.poll()`` always answers
    None: the interrupted wait holds the lock poll needs. /proc does not.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rpartition(")")[2].split()[0] in {"Z", "X"}


@dataclass(frozen=True)
class Start:
    """One node's view of one start of the job (from submitit's JobEnvironment)."""

    job_id: str
    task: int  # 0 decides for everyone
    num_nodes: int
    first_host: str  # hosts the c10d rendezvous
    restart: int  # SLURM_RESTART_COUNT: 0 on the first start


def previous_stop(run: RunDir, job_id: str, restart: int) -> str:
    """Why the previous run of this job ended, for the log."""
    if restart == 0:
        return "first start"
    marker = run.read_stop(job_id, restart - 1)
    if marker is not None:
        return f"saved on notice ({marker.signal or 'peer'}) at update {marker.update}"
    return "no save on notice (node failure, requeue or crash): last periodic checkpoint"


def decide_resume(run: RunDir, job_id: str, restart: int, task: int) -> ResumeDecision:
    """Task 0 verifies the checkpoints and decides; the other tasks wait for its decision."""
    if task == 0:
        resume = checkpoints.choose_resume(run.root)
        log(f"resume: {resume.reason}")
        if resume.moved_aside:
            log(f"kept the bad checkpoint as {resume.moved_aside}")
        decision = ResumeDecision(resume.fairseq_args(), resume.at_update, resume.reason)
        run.write_decision(job_id, restart, decision)
        return decision
    try:
        return wait_until(
            lambda: run.read_decision(job_id, restart),
            "task 0's resume decision",
            timeout=DECISION_WAIT_S,
            backoff=FAST,
        )
    except TimeoutError:
        raise RuntimeError(f"task 0 wrote no resume decision in {DECISION_WAIT_S:.0f} s") from None


class Launcher:
    """Run by submitit on each node of the allocation (``ntasks_per_node=1``)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self._proc: subprocess.Popen[bytes] | None = None
        self._marker: Path | None = None  # this start's stop marker: the save on notice is durable
        self._signals: list[str] = []  # SIGTERM / notice, in the order this start received them

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec}  # never pickle a live process (submitit pickles us on requeue)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec = state["spec"]
        self._proc = None
        self._marker = None
        self._signals = []

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

    def _on_sigterm(self, previous: Any) -> Any:
        def handler(signum: int, frame: Any) -> None:
            self._signals.append("SIGTERM")
            if callable(previous):  # submitit's own handler (it logs and carries on)
                previous(signum, frame)

        return handler

    def plan_node(self, nnodes: int, gpus: int) -> tuple[bool, int, list[str], str]:
        """(use_gpu, ranks on this node, fairseq args, batch description) for this start."""
        spec = self.spec
        use_gpu = spec.gpus_per_node > 0 and gpus > 0
        nproc = min(spec.gpus_per_node, gpus) if use_gpu else 1
        args, plan = commands.fairseq_args(spec, nnodes * nproc, use_gpu)
        return use_gpu, nproc, args, plan.describe()

    def torchrun_command(self, start: Start, nproc: int, args: list[str]) -> list[str]:
        return commands.torchrun_argv(
            torchrun_path(), start.num_nodes, nproc, start.first_host, start.job_id, args
        )

    def __call__(self) -> dict[str, Any]:
        import submitit

        job = submitit.JobEnvironment()
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        start = Start(job.job_id, job.global_rank, job.num_nodes, job.hostnames[0], restart)
        return self.run(start, visible_gpus())

    def run(self, start: Start, gpus: int) -> dict[str, Any]:
        """One start on this node: plan, resume decision, torchrun, then the restart policy."""
        spec, run = self.spec, self.spec.run_dir
        done = {"node": socket.gethostname(), "restarts": start.restart}
        log(
            f"job {start.job_id} start #{start.restart + 1}: {previous_stop(run, *start_key(start))}"
        )
        if not restarts.restart_allowed(start.restart, spec.max_restarts):
            raise RuntimeError(f"restart budget exhausted (--max-restarts {spec.max_restarts})")
        use_gpu, nproc, args, described = self.plan_node(start.num_nodes, gpus)
        if spec.gpus_per_node > 0 and not use_gpu:
            log(f"no GPU visible: falling back to CPU ranks (gloo, legacy_ddp), {nproc} per node")
        log(f"node {start.task + 1}/{start.num_nodes}, {nproc} rank(s) here; {described}")
        spec.save_dir.mkdir(parents=True, exist_ok=True)
        decision = decide_resume(run, start.job_id, start.restart, start.task)
        if decision.at_update >= spec.updates:
            log(f"checkpoint is at update {decision.at_update}: max-update reached, done")
            return done
        env = dict(os.environ)
        self._marker = run.stop_marker(*start_key(start))
        env[STOP_MARKER_ENV] = str(self._marker)
        if not use_gpu:
            env.update(instances.plain(instances.cpu_env()))
        argv = self.torchrun_command(start, nproc, args + decision.args)
        log(f"running: {commands.shell(argv)}")
        watcher = self._watch_spot(start.job_id)
        previous = signal.signal(signal.SIGTERM, self._on_sigterm(signal.getsignal(signal.SIGTERM)))
        try:
            self._proc = subprocess.Popen(argv, env=env, preexec_fn=_ignore_usr2)
            returncode = self._proc.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
        if watcher:
            watcher.stop()
        saved = run.read_stop(*start_key(start)) is not None
        # a SIGTERM after the save on notice is the requeue ending the job, not a cancel
        cancelled = returncode != 0 and not saved and self.cancelled(start.job_id)
        outcome = restarts.after_exit(
            returncode, saved, start.task, start.restart, spec.max_restarts, cancelled
        )
        if outcome.action in (Action.FINISHED, Action.CANCELLED):
            log(outcome.why)
            return done
        if outcome.action is Action.STOPPED:
            log(outcome.why)
            return done | {"stopped": True}
        if outcome.action is Action.FAIL:
            raise RuntimeError(outcome.why)
        log(f"job {start.job_id}: {outcome.why}")
        slurm.requeue(start.job_id)
        time.sleep(REQUEUE_GRACE_S)  # the requeue ends this task; never report success meanwhile
        raise RuntimeError("requeue did not take effect")

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

        interval = float(os.environ.get("HPC_TRAIN_SPOT_POLL_S", "5"))
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
        log("notice received: waiting for the workers to save checkpoint_last.pt")
        proc, marker = self._proc, self._marker

        def saved_or_exited() -> str | None:
            if marker is not None and marker.exists():
                return "the save on notice is durable"
            if proc is None or has_exited(proc.pid):
                return "workers exited"
            return None

        try:
            what = wait_until(saved_or_exited, "the save on notice", SAVE_WAIT_S, FAST)
            log(f"{what} {time.monotonic() - started:.1f} s after the notice: requeueing")
        except TimeoutError:
            log(f"no save on notice after {SAVE_WAIT_S:.0f} s: requeueing anyway")
        return submitit.helpers.DelayedSubmission(Launcher(self.spec))


def start_key(start: Start) -> tuple[str, int]:
    """(job id, restart): what names this start's files in the run directory."""
    return start.job_id, start.restart
