"""Submit a fairseq RoBERTa pretraining run to Slurm with submitit.

    python -m hpc_train.submit --preset tiny --nodes 2 --gpus-per-node 0 \\
        --data .local/data/demo-bin --save-dir .local/runs/demo --follow
    python -m hpc_train.submit --preset roberta-large --nodes 2 --data /lustre/data-bin/wikitext-103 \\
        --save-dir /lustre/runs/large --dry-run -- --validate-interval-updates 2000
    python -m hpc_train.submit --preset roberta-large --nodes 2 --data /lustre/data-bin/wikitext-103 \\
        --save-dir /lustre/runs/large --container /lustre/images/hpc-train.sqsh \\
        --container-mounts /lustre/tokenizers:/tokenizers:ro
    python -m hpc_train.submit --preset tiny --nodes 2 --gpus-per-node 0 \\
        --data .local/data/demo-bin --save-dir .local/runs/boxed --container .local/images/hpc-train
    python -m hpc_train.submit --preset roberta-large --nodes 4 --data /lustre/data-bin/wikitext-103 \\
        --save-dir /lustre/runs/large --tensorboard --wandb-project roberta --wandb-mode offline

One Slurm task per node runs ``hpc_train.launch.launcher.Launcher``, which starts torchrun, which starts
fairseq on every GPU (or one CPU rank per node when there is no GPU). The job is submitted with
``--requeue`` and resumes from ``checkpoint_last.pt`` in ``--save-dir`` after every restart.
Arguments after ``--`` go to fairseq-train unchanged. With ``--container`` the launcher and the
ranks run inside the image: through pyxis, or through Slurm's own OCI support for an OCI image
directory (``hpc_train.job.container``, docs/containers.md). With ``--tensorboard`` and
``--wandb-project`` rank 0 logs the curves, one series and one W&B run across every start
(``hpc_train.job.tracking``, docs/runs.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpc_core import instances, ledger, slurm, space
from hpc_core.ledger import Kind
from hpc_core.slurm_env import JOB_ID
from hpc_train import cli
from hpc_train.faults import quarantine
from hpc_train.job import command_lines, container, levers, options, presets, tracking
from hpc_train.job.batch import BatchPlan
from hpc_train.job.spec import SIGNAL_DELAY_S, JobSpec, SpecError, validate
from hpc_train.launch import restart_policy
from hpc_train.planning import costs

DRY_RUN_PING_S = 3.0  # one `scontrol ping` (a refused connection answers at once)


def setup_lines(spec: JobSpec) -> list[str]:
    """Lines the sbatch script runs before srun: the node's EFA/NCCL environment, read at job
    start (instances.node_env_lines: the submit host cannot know the nodes' EFA software), and
    with ``--preflight`` the all-reduce health check of the allocation."""
    if spec.sizing.gpus_per_node <= 0:
        lines = [
            "# No GPUs requested: one CPU rank per node, gloo (OMP_NUM_THREADS=1 by the launcher)"
        ]
    else:
        itype = instances.instance_type(spec.sizing.instance_type)
        rdma = "GPUDirect RDMA" if itype.gpudirect_rdma else "no GPUDirect RDMA"
        lines = [
            f"# NCCL over EFA on {itype.name} ({itype.gpus}x {itype.gpu_model}, {rdma})",
            *instances.node_env_lines(spec.sizing.instance_type),  # the node's, read at job start
        ]
    if spec.slurm.preflight:
        from nccl_checks import preflight

        gpu = spec.sizing.gpus_per_node > 0
        lines += [
            "# Pre-flight: all-reduce across the allocation; an unhealthy verdict ends the job here",
            *preflight.setup_lines(
                nodes=spec.sizing.nodes_min,  # the nodes that train first (a spare's is not known)
                backend="nccl" if gpu else "gloo",
                out_dir=spec.run_dir.preflight,
                instance_type=spec.sizing.instance_type if gpu else None,
            ),
        ]
    return lines


def sbatch_parameters(spec: JobSpec, exclude: Sequence[str] = ()) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for ``spec`` (keys of submitit's sbatch renderer);
    ``exclude``: nodes to keep out (the save dir's quarantine list)."""
    params: dict[str, Any] = {
        "job_name": spec.slurm.job_name,
        "nodes": spec.sizing.nodes_min,
        "ntasks_per_node": 1,  # one launcher per node; torchrun starts the ranks
        "time": spec.slurm.time_limit_min,
        "exclusive": True,  # whole nodes: GPUs, EFA and NVLink are per node
        "signal_delay_s": SIGNAL_DELAY_S,
        "setup": setup_lines(spec),
        # requeue: Slurm may restart the job after preemption or a node failure
        "additional_parameters": {"requeue": True},
    }
    srun_args: list[str] = []
    if spec.recovery.in_job_restarts:
        # a node that fails (NODE_FAIL: its slurmd gone) ends neither the job (sbatch) nor the
        # other nodes' tasks (srun kills the whole step otherwise): task 0 blames the node and
        # restarts training inside the allocation, which Slurm shrinks to the nodes left
        params["additional_parameters"]["no_kill"] = True
        srun_args.append("--no-kill")
    if (
        spec.allocation_arg != spec.sizing.nodes_arg
        or spec.sizing.nodes_max != spec.sizing.nodes_min
    ):
        # Elastic (MIN-MAX) or hot spares (N-(N+K)). With --ntasks-per-node Slurm settles for
        # MIN nodes; without it, it allocates as many as are free and srun still starts one
        # task per node.
        params["additional_parameters"]["nodes"] = spec.allocation_arg
        del params["ntasks_per_node"]
    if spec.slurm.partition:
        params["partition"] = spec.slurm.partition
    if exclude:
        params["exclude"] = ",".join(exclude)
    if spec.notify.mail_user:
        params["mail_user"] = spec.notify.mail_user
    if spec.notify.mail_type:
        params["mail_type"] = spec.notify.mail_type
    if spec.sizing.gpus_per_node > 0:
        params["gpus_per_node"] = spec.sizing.gpus_per_node
    if spec.slurm.cpus_per_task:
        params["cpus_per_task"] = spec.slurm.cpus_per_task
    elif spec.sizing.gpus_per_node > 0:
        # all cores to the node's one task: torchrun's ranks and their data loaders run in it
        params["cpus_per_task"] = instances.instance_type(spec.sizing.instance_type).cores
    if spec.container.image is not None:
        # pyxis: the launcher (and so torchrun and the ranks) runs inside the image
        srun_args += spec.container_srun_args
    if srun_args:
        params["srun_args"] = srun_args
    return params


def job_python(spec: JobSpec, host_python: str = sys.executable) -> str:
    """The interpreter each task runs submitit with: the image's with ``--container``."""
    return container.IMAGE_PYTHON if spec.container.image is not None else host_python


def submission_command(folder: Path, python: str = sys.executable) -> str:
    """The command submitit's sbatch runs in each task (same form as SlurmExecutor's)."""
    return " ".join([shlex.quote(python), "-u -m submitit.core._submit", shlex.quote(str(folder))])


def render_sbatch(spec: JobSpec, python: str = sys.executable) -> str:
    """The sbatch script submitit would submit for ``spec``; needs no Slurm."""
    from submitit.slurm.slurm import _make_sbatch_string

    command = submission_command(spec.run_dir.slurm_logs, job_python(spec, python))
    params = sbatch_parameters(spec, quarantine.nodes(spec.run_dir))
    return _make_sbatch_string(command=command, folder=spec.run_dir.slurm_logs, **params)


def training_command(spec: JobSpec, plan: BatchPlan) -> tuple[str, str]:
    """(torchrun command line, batch plan) as each node would run it in the largest world;
    ``plan``: that world's, as ``validate`` decided it."""
    gpu = spec.sizing.gpus_per_node > 0
    nproc = spec.sizing.ranks_per_node(gpu)
    args = command_lines.fairseq_argv(spec, plan, gpu)
    argv = command_lines.torchrun_argv(
        "torchrun", spec.sizing.nodes_max, nproc, "FIRST_NODE", JOB_ID, args,
        module=command_lines.worker_module(spec),
    )  # fmt: skip
    port = slurm.rendezvous_port(JOB_ID)  # no digits: the rule's base
    line = command_lines.shell(argv).replace(f"FIRST_NODE:{port}", "$FIRST_NODE:$RDZV_PORT")
    line = line.replace(JOB_ID, f"${JOB_ID}")
    note = f"{plan.describe()}; RDZV_PORT = {slurm.RDZV_PORT_RULE}"
    image = spec.container.image
    if image is not None:
        note += f"; inside the image {image}"
        if container.is_oci_image(image):
            mounts = ", ".join(map(str, spec.container_mount_list))
            note += (
                f" (its OCI bundle {spec.run_dir.oci_bundle}, written at submit; mounts {mounts})"
            )
    return line, note


def make_executor(spec: JobSpec) -> Any:
    import submitit

    executor = submitit.SlurmExecutor(
        folder=spec.run_dir.slurm_logs,
        max_num_timeout=restart_policy.submitit_max_num_timeout(spec.recovery.max_restarts),
        python=shlex.quote(job_python(spec)),
    )
    executor.update_parameters(**sbatch_parameters(spec, quarantine.nodes(spec.run_dir)))
    return executor


def submit(spec: JobSpec) -> Any:
    """Submit ``spec``, validated (``validate``, once: ``main``) to a Slurm that answers
    (``slurm.ensure_reachable``); return the submitit Job."""
    from hpc_train.launch.launcher import Launcher

    spec.run_dir.slurm_logs.mkdir(parents=True, exist_ok=True)
    image = spec.container.image
    if image is not None and container.is_oci_image(image):
        container.write_bundle(
            spec.run_dir.oci_bundle, Path(image), spec.container_mount_list, spec.training.save_dir
        )
    from submitit.core.utils import FailedJobError

    said = io.StringIO()  # submitit prints sbatch's stderr on failure; we say it in one line
    try:
        with contextlib.redirect_stderr(said):
            return make_executor(spec).submit(Launcher(spec))
    except FailedJobError as err:  # sbatch said no: its own last line, not submitit's traceback
        raise slurm.SlurmError(f"sbatch refused the job: {slurm.last_line(str(err))}") from None


def record_submission(spec: JobSpec, job_id: str, when: float) -> None:
    """The run's first ledger line (``when``: just before sbatch, so it precedes the start),
    and its line in the user's index (``hpc-train status``)."""
    run = spec.run_dir
    ledger.record(
        run.ledger, Kind.SUBMITTED, job_id, 0, when,
        nodes=spec.sizing.nodes_arg, max_update=spec.updates, preset=spec.training.preset,
        name=spec.slurm.job_name,
        # the run's limits, in-job watchdog or not (--no-watchdog): the doctor and the alerts
        # judge a stall by them from outside the job
        hang_limits=asdict(spec.watch.hang), watchdog=not spec.watch.no_watchdog,
    )  # fmt: skip
    ledger.index_run(job_id, run.root.resolve(), spec.slurm.job_name, spec.updates)


def with_tracking(spec: JobSpec) -> JobSpec:
    """``spec`` with its tracking checked (``job.tracking.check``: TrackingError, one line) and
    ``--wandb-mode auto`` decided here, once, from this environment (the job's: Slurm passes
    it on)."""
    tracking.check(spec.tracking, spec.training.extra_args)
    decided = tracking.resolved(spec.tracking, os.environ, Path.home())
    return dataclasses.replace(spec, tracking=decided)


def preset_lines() -> list[str]:
    return [f"  {name:14s} {recipe.describe()}" for name, recipe in presets.PRESETS.items()]


def build_parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="python -m hpc_train.submit",
        usage="%(prog)s --preset NAME --data DIR --save-dir DIR [options] [-- FAIRSEQ_ARGS ...]",
        description=__doc__.split("\n\n")[0]
        + "\n\nArguments after `--` go to fairseq-train unchanged (after the preset's).",
        epilog="\n".join([cli.examples(__doc__, "python -m hpc_train.submit"), "", "presets:"])
        + "\n"
        + "\n".join(preset_lines()),
    )
    options.add_options(p)
    p.add_argument("--dry-run", action="store_true", help="print the sbatch script and command")
    p.add_argument("--follow", action="store_true", help="follow the job until it ends")
    return p


def grace_time_s(partition: str | None, dry_run: bool = False) -> float | None:
    """The partition's GraceTime at preemption, when Slurm can say (not for a partition sbatch
    will refuse anyway). A dry run never waits for a controller: with none that answers at once
    it says, on stderr, what it did not ask."""
    if dry_run:
        why = slurm.unreachable(timeout=DRY_RUN_PING_S)
        if why is not None:
            what = f"partition {partition}" if partition else "the default partition"
            print(f"dry run: Slurm not asked for the GraceTime of {what} "
                  f"(`scontrol show partition`): {why}", file=sys.stderr)  # fmt: skip
            return None
    try:
        return slurm.grace_time_s(partition)
    except slurm.SlurmError:
        return None


def node_check_line(spec: JobSpec) -> str:
    """What --dry-run says of the GPU check each node's launcher makes before training."""
    if spec.checks_nodes:
        return (f"# node check (--node-check {spec.slurm.node_check}): each node's launcher checks its "
                f"GPUs through NVML for {spec.sizing.instance_type} at every start; a failing node is "
                "blamed, drained and left out")  # fmt: skip
    return (f"# node check off (--node-check {spec.slurm.node_check}): the cluster's own check runs "
            "(ParallelCluster's DCGM check in the prolog, HealthChecks.Gpu)")  # fmt: skip


def save_dir_room(save_dir: Path) -> space.Space | None:
    """The room of the file system the save dir is (or will be made) on; None when it cannot
    be asked."""
    try:
        return space.of(save_dir)
    except OSError:
        return None


def space_warnings(spec: JobSpec) -> list[str]:
    """The save dir's room against what the run keeps: its last checkpoint's size (a run
    submitted again), else the preset's (``costs.preset_checkpoint_bytes``)."""
    room = save_dir_room(spec.training.save_dir)
    if room is None:
        return []
    run = spec.run_dir
    last = run.checkpoint_last
    nbytes = last.stat().st_size if last.is_file() else costs.preset_checkpoint_bytes(
        spec.training.preset, gpu=spec.sizing.gpus_per_node > 0
    )  # fmt: skip
    found = costs.space_warning(room, nbytes, spec.saves.keep_checkpoints, run.set_aside_files())
    return [] if found is None else [found]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        spec = with_tracking(options.spec_from_options(args, extra))
        plan = validate(spec, check_paths=not args.dry_run)  # once: the plan is reused below
        if not args.dry_run:
            slurm.ensure_reachable()
        grace = grace_time_s(spec.slurm.partition, dry_run=args.dry_run)
        for warning in costs.submit_warnings(
            spec.training.preset, spec.sizing.gpus_per_node > 0, SIGNAL_DELAY_S, grace_time_s=grace
        ):
            print(warning, file=sys.stderr)
        for warning in space_warnings(spec):
            print(warning, file=sys.stderr)
        if args.dry_run:
            print(render_sbatch(spec))
            line, note = training_command(spec, plan)
            print(f"# training command on each node ({note}):\n{line}")
            gpu = spec.sizing.gpus_per_node > 0
            print("\n".join(levers.describe(spec.lever_choices(gpu), spec.lever_cc(gpu))))
            if gpu:
                print(node_check_line(spec))
            for line in tracking.describe(spec.tracking, spec.run_dir):
                print(f"# {line}")
            return 0
        submitted_at = time.time()
        job = submit(spec)
    except (SpecError, tracking.TrackingError, slurm.SlurmError) as err:
        parser.error(str(err))
    spares = f" + {spec.recovery.spares} hot spare(s)" if spec.recovery.spares else ""
    print(
        f"submitted job {job.job_id}: {spec.sizing.nodes_arg} node(s){spares}, preset {spec.training.preset}"
    )
    run = spec.run_dir
    record_submission(spec, job.job_id, submitted_at)
    print(f"  task logs: {run.task_log(job.job_id, 0)} … (one per node, and .err)")
    print(f"  train log: {run.train_log}")
    print(f"  checkpoints: {run.checkpoint_last}")
    for line in tracking.describe(spec.tracking, run):
        print(f"  {line}")
    if args.follow:
        from hpc_train.runs import follow

        return follow.follow(run, job.job_id, spec.updates, bar=sys.stdout.isatty())
    return 0


if __name__ == "__main__":
    sys.exit(main())
