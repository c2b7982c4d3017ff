"""Command lines of a run: the torchrun launch and the fairseq training arguments. Pure.

Every node builds them on every (re)start from the batch plan task 0 decided for the world it
actually got (``JobSpec.batch_plan``, carried in ``contract.StartDecision``), so the global batch
stays fixed through ``--update-freq`` whatever the node count; ``--dry-run`` builds them from
``validate``'s plan for the largest world the job may get.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from hpc_core.slurm import rendezvous_port
from hpc_train.contract import round_key
from hpc_train.job import batch, devices, levers, presets
from hpc_train.job.spec import JobSpec

TRAIN_MODULE = "hpc_train.worker.train"  # the worker torchrun starts on every rank
HOLLOW_MODULE = "hpc_train.worker.hollow"  # ... under --hollow: a stand-in for the model
WORKER_MODULES = (TRAIN_MODULE, HOLLOW_MODULE)


def worker_module(spec: JobSpec) -> str:
    """The module torchrun starts on every rank of ``spec``'s run."""
    return HOLLOW_MODULE if spec.training.hollow else TRAIN_MODULE


def torchrun_argv(
    torchrun: str,
    nnodes: int,
    nproc_per_node: int,
    endpoint_host: str,
    job_id: str,
    worker_args: Sequence[str],
    round_: int = 0,
    module: str = TRAIN_MODULE,
) -> list[str]:
    """One torchrun agent per node; c10d rendezvous on the job's first node, its id and port
    the round's (``contract.round_key``, ``hpc_core.slurm.rendezvous_port``: ``41.1`` for
    job 41's first in-job restart); ``module`` on every rank (``worker_module``)."""
    return [
        torchrun,
        f"--nnodes={nnodes}",
        f"--nproc_per_node={nproc_per_node}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint_host}:{rendezvous_port(job_id, round_)}",
        f"--rdzv_id={round_key(job_id, round_)}",
        "--max_restarts=0",  # restarts are Slurm's job (requeue), from checkpoint_last.pt
        "-m",
        module,
        *worker_args,
    ]


def fairseq_args(spec: JobSpec, world_size: int, gpu: bool) -> tuple[list[str], batch.BatchPlan]:
    """fairseq-train arguments for ``spec`` on ``world_size`` ranks, and their batch plan
    (``JobSpec.batch_plan``)."""
    plan = spec.batch_plan(world_size, gpu)
    return fairseq_argv(spec, plan, gpu), plan


def fairseq_argv(spec: JobSpec, plan: batch.BatchPlan, gpu: bool) -> list[str]:
    """fairseq-train arguments for ``spec`` with a decided batch ``plan`` (task 0's, at a start)."""
    recipe: presets.Preset = spec.recipe
    per_device = plan.batch_per_device
    choices = spec.lever_choices(gpu)
    on = levers.on_names(choices)
    fused = levers.LeverName.FUSED_ADAMW in on
    save_dir = Path(spec.training.save_dir)
    args = [
        str(spec.training.data),
        *presets.RECIPE,
        "--arch", recipe.arch,
        *recipe.arch_args,
        "--tokens-per-sample", str(recipe.tokens_per_sample),
        "--optimizer", presets.GPU_OPTIMIZER if fused else presets.CPU_OPTIMIZER,
        "--batch-size", str(per_device),
        "--update-freq", str(plan.update_freq),
        "--lr", str(recipe.peak_lr),
        "--warmup-updates", str(min(recipe.warmup_updates, spec.updates)),
        "--total-num-update", str(spec.updates),
        "--max-update", str(spec.updates),
        "--save-dir", str(save_dir),
        "--save-interval-updates", str(spec.save_interval_updates),
        "--keep-interval-updates", str(spec.saves.keep_checkpoints),
        "--no-epoch-checkpoints",
        "--skip-invalid-size-inputs-valid-test",
        "--log-format", "json",
        "--log-interval", str(recipe.log_interval),
        "--seed", "1",
    ]  # fmt: skip
    if gpu:
        args += devices.precision_flags(spec.sizing.gpu_precision)
        args += ["--distributed-backend", "nccl", "--ddp-backend", "c10d"]
        args += ["--num-workers", str(devices.LOADER_WORKERS)]
    else:
        # fp16/bf16 need a GPU; gloo has no c10d-DDP bucket support in fairseq: legacy_ddp.
        args += ["--cpu", "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
        args += ["--num-workers", "0"]
    if (
        levers.LeverName.PACK in on
    ):  # full blocks, no padding (job.levers); fairseq takes the last value
        args += ["--sample-break-mode", "none"]
    args += levers.worker_args(choices)  # the rank takes it off before fairseq parses
    args += list(spec.training.extra_args)
    return args


def shell(argv: Sequence[str]) -> str:
    """A command line a person can paste into a shell."""
    return " ".join(shlex.quote(str(a)) for a in argv)
