"""The launcher: the callable submitit runs as one Slurm task per node.

On every (re)start it looks at what it actually got (node count, GPUs), recomputes the batch
plan, decides what to resume from (task 0 checks ``checkpoint_last.pt`` and falls back; the other
nodes read its decision), and runs one torchrun agent that starts the training workers. Resume
state always comes from the save dir, never from the pickled submission, so a requeue Slurm
performs by itself (node failure, spot loss, ``scontrol requeue``) resumes too.

Interruptions:
- USR2 (preemption, time limit, spot notice): the workers save at the next update and exit;
  submitit calls ``checkpoint()`` on task 0, which waits for that save, then submitit requeues.
- torchrun fails (a rank or a node died): task 0 requeues the job while restarts remain.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpc_train import checkpoints, commands, environment, preemption, slurm
from hpc_train.spec import JobSpec
from hpc_train.spot import SpotWatcher, endpoint_to_watch

# checkpoint() waits this long for the save: inside the local cluster's GraceTime (30 s) and
# submitit's USR2@90 before the time limit. Set HPC_TRAIN_SAVE_WAIT_S for a longer grace time.
SAVE_WAIT_S = float(os.environ.get("HPC_TRAIN_SAVE_WAIT_S", "25"))
DECISION_WAIT_S = 300.0


def log(msg: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"[{stamp}] hpc-train {socket.gethostname()}: {msg}", flush=True)


def visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install counts as no GPU; the log says so below
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


def state_dir(spec: JobSpec) -> Path:
    return spec.save_dir / ".hpc-train"


def previous_stop(spec: JobSpec, job_id: str, restarts: int) -> str:
    """Why the previous run of this job ended, for the log."""
    if restarts == 0:
        return "first start"
    marker = preemption.stop_marker(spec.save_dir, job_id, restarts - 1)
    if marker.exists():
        info = json.loads(marker.read_text())
        return f"saved on notice ({info.get('signal') or 'peer'}) at update {info['update']}"
    return "no save on notice (node failure, requeue or crash): last periodic checkpoint"


def decide_resume(spec: JobSpec, job_id: str, restarts: int, task: int) -> dict[str, Any]:
    """Task 0 verifies and decides; the other tasks wait for its decision file.

    The decision: ``args`` for fairseq and ``at_update``, the update the resumed checkpoint
    was saved at (fairseq would train one update past max-update when resumed at it).
    """
    decision = state_dir(spec) / f"resume-{job_id}-{restarts}.json"
    if task == 0:
        resume = checkpoints.choose_resume(spec.save_dir)
        log(f"resume: {resume.reason}")
        if resume.moved_aside:
            log(f"kept the bad checkpoint as {resume.moved_aside}")
        out = {"args": resume.fairseq_args(), "at_update": resume.at_update}
        decision.parent.mkdir(parents=True, exist_ok=True)
        tmp = decision.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        os.replace(tmp, decision)
        return out
    deadline = time.monotonic() + DECISION_WAIT_S
    while not decision.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"task 0 wrote no resume decision in {DECISION_WAIT_S:.0f} s")
        time.sleep(0.2)
    return json.loads(decision.read_text())


class Launcher:
    """Run by submitit on each node of the allocation (``ntasks_per_node=1``)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self._proc: subprocess.Popen[bytes] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec}  # never pickle a live process (submitit pickles us on requeue)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec = state["spec"]
        self._proc = None

    def plan_node(self, nnodes: int, gpus: int) -> tuple[bool, int, list[str], str]:
        """(use_gpu, ranks on this node, fairseq args, batch description) for this start."""
        spec = self.spec
        use_gpu = spec.gpus_per_node > 0 and gpus > 0
        nproc = min(spec.gpus_per_node, gpus) if use_gpu else 1
        args, plan = commands.fairseq_args(spec, nnodes * nproc, use_gpu)
        return use_gpu, nproc, args, plan.describe()

    def __call__(self) -> dict[str, Any]:
        import submitit

        job = submitit.JobEnvironment()
        spec = self.spec
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        log(f"job {job.job_id} start #{restarts + 1}: {previous_stop(spec, job.job_id, restarts)}")
        if restarts > spec.max_restarts:
            raise RuntimeError(f"restart budget exhausted ({restarts} > --max-restarts)")
        gpus = visible_gpus()
        use_gpu, nproc, args, described = self.plan_node(job.num_nodes, gpus)
        if spec.gpus_per_node > 0 and not use_gpu:
            log(f"no GPU visible: falling back to CPU ranks (gloo, legacy_ddp), {nproc} per node")
        log(f"node {job.node + 1}/{job.num_nodes}, {nproc} rank(s) here; {described}")
        spec.save_dir.mkdir(parents=True, exist_ok=True)
        decision = decide_resume(spec, job.job_id, restarts, job.global_rank)
        if decision["at_update"] >= spec.updates:
            log(f"checkpoint is at update {decision['at_update']}: max-update reached, done")
            return {"node": socket.gethostname(), "restarts": restarts}
        args += decision["args"]
        env = dict(os.environ)
        if not use_gpu:
            env.update(environment.plain(environment.cpu_env()))
        argv = commands.torchrun_argv(
            torchrun_path(), job.num_nodes, nproc, job.hostnames[0], job.job_id, args
        )
        log(f"running: {commands.shell(argv)}")
        watcher = self._watch_spot(job.job_id)
        self._proc = subprocess.Popen(argv, env=env, preexec_fn=_ignore_usr2)
        returncode = self._proc.wait()
        if watcher:
            watcher.stop()
        stopped = preemption.stop_marker(spec.save_dir, job.job_id, restarts)
        if returncode == 0 and not stopped.exists():
            log("training finished")
            return {"node": socket.gethostname(), "restarts": restarts}
        if job.global_rank != 0:
            if returncode == 0:
                return {"node": socket.gethostname(), "restarts": restarts, "stopped": True}
            raise RuntimeError(f"torchrun exited with {returncode}; task 0 decides on a requeue")
        why = "stopped on notice" if returncode == 0 else f"torchrun exited with {returncode}"
        if restarts >= spec.max_restarts:
            raise RuntimeError(f"{why}; no restarts left (--max-restarts {spec.max_restarts})")
        log(f"{why}: requeueing job {job.job_id} (restart {restarts + 1}/{spec.max_restarts})")
        slurm.requeue(job.job_id)
        time.sleep(60)  # the requeue ends this task; never report success meanwhile
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
            slurm.run(["scancel", "--signal=USR2", str(job_id)])

        interval = float(os.environ.get("HPC_TRAIN_SPOT_POLL_S", "5"))
        watcher = SpotWatcher(on_notice, log, endpoint=endpoint, interval_s=interval)
        watcher.start()
        return watcher

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook on USR2 (task 0): wait for the workers' save, then requeue.

        Runs inside a signal handler: a blocking wait here deadlocks on the lock the interrupted
        ``wait()`` holds, and ``poll()`` cannot see the exit for the same reason: read /proc.
        """
        import submitit

        started = time.monotonic()
        log("notice received: waiting for the workers to save checkpoint_last.pt")
        while self._proc is not None and not has_exited(self._proc.pid):
            if time.monotonic() - started > SAVE_WAIT_S:
                log(f"workers still running after {SAVE_WAIT_S:.0f} s: requeueing anyway")
                break
            time.sleep(0.1)
        else:
            log(f"workers exited {time.monotonic() - started:.1f} s after the notice")
        return submitit.helpers.DelayedSubmission(Launcher(self.spec))
