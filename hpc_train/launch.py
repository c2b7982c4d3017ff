"""The launcher: the callable submitit runs as one Slurm task per node.

On every (re)start it looks at what it actually got (node count, GPUs), recomputes the batch
plan, sets the CPU fallback environment when there is no GPU, and runs one torchrun agent that
starts the training workers. Resume state always comes from the save dir (checkpoint_last.pt),
never from the pickled submission, so a requeue Slurm performs by itself resumes too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpc_train import commands, environment
from hpc_train.spec import JobSpec


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


class Launcher:
    """Run by submitit on each node of the allocation (``ntasks_per_node=1``)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

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
        gpus = visible_gpus()
        use_gpu, nproc, args, described = self.plan_node(job.num_nodes, gpus)
        if spec.gpus_per_node > 0 and not use_gpu:
            log(f"no GPU visible: falling back to CPU ranks (gloo, legacy_ddp), {nproc} per node")
        log(
            f"job {job.job_id} start #{restarts + 1} (restarts so far: {restarts}), node "
            f"{job.node + 1}/{job.num_nodes}, {nproc} rank(s) here; {described}"
        )
        env = dict(os.environ)
        if not use_gpu:
            env.update(environment.plain(environment.cpu_env()))
        spec.save_dir.mkdir(parents=True, exist_ok=True)
        argv = commands.torchrun_argv(
            torchrun_path(), job.num_nodes, nproc, job.hostnames[0], job.job_id, args
        )
        log(f"running: {commands.shell(argv)}")
        proc = subprocess.Popen(argv, env=env, preexec_fn=_ignore_usr2)
        returncode = proc.wait()
        if returncode != 0:
            raise RuntimeError(f"torchrun on {socket.gethostname()} exited with {returncode}")
        log("training finished")
        return {
            "node": socket.gethostname(),
            "restarts": restarts,
            "world_size": job.num_nodes * nproc,
        }

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook on the preemption / time-limit signal: requeue the same spec.

        The resumed run reads checkpoint_last.pt from the save dir.
        """
        import submitit

        log("signal received: requeueing (resume from checkpoint_last.pt)")
        return submitit.helpers.DelayedSubmission(Launcher(self.spec))
