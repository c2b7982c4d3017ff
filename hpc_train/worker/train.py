"""The training worker: one per rank, started by torchrun as ``python -m hpc_train.worker.train ARGS``.

It runs fairseq's own training entry with the few fixes this stack needs:
- distributed init from torchrun's environment (env://, WORLD_SIZE, RANK). Without it fairseq on
  a CPU node takes its world size from the CUDA device count (0 → 1) and every rank silently
  trains alone;
- checkpoint loading under torch's weights_only default through an explicit allow-list
  (see ``hpc_train.worker.checkpoints``), instead of switching the safety off;
- atomic checkpoint files (write, fsync, rename) instead of fairseq's in-place copies;
- async saves: a host-memory snapshot written in the background (``hpc_train.worker.async_save``),
  through node-local disk first with ``--local-save-dir`` (tiered);
- the data position converted when a resume changes the width, so that each sample of an epoch
  is trained once, and the ``--audit-samples`` record of it (``hpc_train.worker.data_position``);
- save on notice: SIGUSR2 → all ranks save at the same update and stop (``hpc_train.worker.preemption``);
- a heartbeat every update for the launcher's hang watchdog, one per validation batch and one as
  each save begins, and SIGUSR1 → Python stacks (``hpc_train.worker.heartbeat``,
  ``hpc_train.worker.validation_beats``);
- on GPUs: the process bound to LOCAL_RANK's GPU before NCCL starts (bound to it), the group torn
  down at exit, bf16 without fairseq's implied ``--tpu``, ``--optimizer fused_adamw`` registered;
- fairseq's timestamped log format on stdout, and its known warnings silenced one by one;
- the data-loader processes stopped at once after the last save (``hpc_train.worker.loaders``);
- the speed levers the launcher chose (``hpc_train.worker.speed``, ``hpc_train.job.levers``);
- a profile of a few updates when asked (``HPC_TRAIN_PROFILE``, ``hpc_train.worker.profile``);
- rank 0's curves in TensorBoard and W&B, one series and one run across every start
  (``--tensorboard``, ``--wandb-project``: ``hpc_train.worker.tracking``).
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpc_core.rundir import RunDir
from hpc_train.contract import WorkerEnv, image_marker, node_name, rank_of
from hpc_train.worker import (
    async_save,
    checkpoints,
    compute_time,
    crash,
    data_position,
    lean_import,
    ledger_hooks,
    loaders,
    local_tier,
    pace,
    preemption,
    profile,
    save_interval,
    speed,
    tracking,
    validation_beats,
)
from hpc_train.worker.heartbeat import Heartbeat


def distributed_args(env: Mapping[str, str]) -> list[str]:
    """fairseq flags for the rank torchrun started us as; none outside torchrun."""
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return []
    return [
        "--distributed-init-method", "env://",
        "--distributed-world-size", env["WORLD_SIZE"],
        "--distributed-rank", env["RANK"],
        "--distributed-no-spawn",
    ]  # fmt: skip


def local_gpu(env: Mapping[str, str], args: Sequence[str], visible: int) -> int | None:
    """The GPU this rank binds to: LOCAL_RANK, for a GPU rank torchrun started; None on a CPU
    rank (``--cpu``), outside torchrun or with no GPU visible. ValueError when LOCAL_RANK names
    a GPU that is not there."""
    if "WORLD_SIZE" not in env or "RANK" not in env or "--cpu" in args or visible < 1:
        return None
    local = int(env.get("LOCAL_RANK", "0"))
    if not 0 <= local < visible:
        raise ValueError(f"LOCAL_RANK={local} but {visible} GPU(s) visible")
    return local


def start_process_group(env: Mapping[str, str], args: Sequence[str]) -> int | None:
    """On a GPU rank: bind the process to its GPU, then start NCCL bound to it (``device_id``).

    fairseq would start the group unbound, and NCCL would then guess each rank's GPU from its
    global rank ("can cause a hang if rank to GPU mapping is heterogeneous") and barrier() would
    use "the device under current context". CPU ranks are left to fairseq (gloo). Returns the
    GPU index, or None.
    """
    import torch
    import torch.distributed as dist

    gpu = local_gpu(env, args, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if gpu is None:
        return None
    device = torch.device("cuda", gpu)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl",
        init_method="env://",
        world_size=int(env["WORLD_SIZE"]),
        rank=int(env["RANK"]),
        device_id=device,
    )
    return gpu


def stop_process_group() -> None:
    """Tear the process group down once training has returned (NCCL warns at exit otherwise)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def heartbeat_of(worker: WorkerEnv, rank: int) -> Heartbeat | None:
    """This rank's heartbeat, with its stacks armed, when its launcher asked for one."""
    if worker.heartbeat_dir is None:
        return None
    beat = Heartbeat(worker.heartbeat_dir, rank)
    beat.arm_stacks(worker.heartbeat_dir)
    return beat


def save_dir_of(worker: WorkerEnv, args: Sequence[str]) -> Path:
    """The run's save dir: the launcher's (``WorkerEnv.save_dir``); for a rank started by hand,
    its last ``--save-dir`` argument. ValueError when neither says (no silent default)."""
    if worker.save_dir is not None:
        return worker.save_dir
    given = [value for flag, value in itertools.pairwise(args) if flag == "--save-dir"]
    if not given:
        raise ValueError("no save dir: not started by the launcher and no --save-dir given")
    return Path(given[-1])


def stop_marker(worker: WorkerEnv, run: RunDir) -> Path:
    """Where to record a save on notice: the path the launcher chose for this start, or (a
    worker run by hand, outside the launcher) the run directory's marker for a local run."""
    return worker.stop_marker or run.stop_marker("local", 0)


def log_to_file(path: Path) -> None:
    """Copy this rank's log records to ``path`` (one handler on the root logger).

    fairseq's own ``--log-file`` adds a new handler for every epoch's progress bar, so its lines
    repeat from the second epoch on. Ranks other than 0 log warnings only (fairseq lowers them).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    logging.getLogger().addHandler(handler)


def say_image(rank: int) -> None:
    """With ``--container``: each rank says which image it runs in (the image's own marker;
    nothing on the host), before fairseq quiets the ranks other than 0."""
    image = image_marker()
    if image is not None:
        logging.getLogger(__name__).info(f"rank {rank} on {node_name()} runs in the image {image}")


def setup_logging() -> None:
    """fairseq's own log format (with timestamps), on stdout, before anything imports fairseq.

    fairseq_cli.train sets this up when imported, but importing fairseq first (its models
    package runs ``logging.basicConfig(level=DEBUG)`` in wav2vec2_classification) makes that a
    no-op: worker logs lost their timestamps and went to stderr with hydra's DEBUG lines.
    Whoever configures the root logger first wins, so this runs first.
    """
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stdout,
    )


def quiet_known_warnings() -> None:
    """Hide deprecation noise fairseq 0.12 triggers in hydra and torch on every rank."""
    warnings.filterwarnings("ignore", category=UserWarning, module=r"hydra\.")  # raised in hydra
    # attributed to our caller (stacklevel 11), and its text starts with a newline:
    # "\n'config' is validated against ConfigStore schema with the same name. …"
    warnings.filterwarnings("ignore", message=r"\s*'\w+' is validated against ConfigStore schema")
    # the worker starts the process group itself, bound to its GPU (start_process_group)
    warnings.filterwarnings(
        "ignore", message="Distributed is already initialized, cannot initialize"
    )
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator")
    warnings.filterwarnings("ignore", message=r".*torch\.cuda\.amp\.autocast")
    # bf16 keeps per-parameter gradients; fairseq suggests apex for their norm (not used here)
    warnings.filterwarnings("ignore", message="amp_C fused kernels unavailable")


def install_extensions(
    run: RunDir, worker: WorkerEnv, rank: int, progress: dict[str, int]
) -> Heartbeat | None:
    """Every change this stack makes to fairseq, in the one order that works; each step's reason
    is why it sits where it does. Returns the rank's heartbeat (None: no watchdog)."""
    # 1. torch's weights_only loading: fairseq's own classes allowed, not the safety switched off
    checkpoints.allow_fairseq_globals()
    # 2. --optimizer fused_adamw registered with fairseq's optimizer registry
    from hpc_train.worker import optim  # noqa: F401

    # 3. atomic checkpoint files (temp, fsync, rename; the digest recorded as each is written)
    #    instead of fairseq's in-place copies, and every load verified beside it (CRCs, digest)
    checkpoints.install_atomic_writes()
    checkpoints.install_verified_loads(run, worker.start, rank)
    # 4. async saves: after 3, because its deferred copies are the atomic ones
    async_save.install(
        run,
        sync=worker.sync_save,
        local_dir=local_tier.usable(worker.local_save_dir),
        direct=preemption.saving_on_notice,  # the notice's save skips the local tier
    )
    # 5. the heartbeat and each update's own compute time (hang and straggler watchers)
    heartbeat = heartbeat_of(worker, rank)
    compute_time.install(heartbeat.compute if heartbeat else None)
    validation_beats.install(heartbeat)  # validation's batches and each save beat on their own
    # 6. save on notice: every rank agrees each update; after 4, its save flushes the writer
    preemption.install_save_on_notice(
        stop_marker(worker, run),
        heartbeat,
        save_interval.AutoInterval.for_rank(worker.auto_interval, rank),
        worker.notice_pending,
        worker.bell,
    )
    # 7. rank 0's ledger events: after 6, so its save hook also times the notice save
    ledger_hooks.install(run, worker.start, rank)
    # 8. the update reached (for a crash report) and chaos's injected crash, every update
    crash.install(run, rank, progress)
    # 9. a rehearsal's pace (chaos JOB pace): a sleep between updates, timed by nothing above
    pace.install(run)
    # 10. the data position converted on a load at another width (each sample once per epoch),
    #    and --audit-samples: it patches the data iterator, train() and Trainer.train_step,
    #    which no step above touches, and nothing above depends on it
    data_position.install(run, worker.start, rank, audit=worker.audit_samples)
    # 11. the data loaders stop when a step says stop: the outermost validate-and-save wrapper,
    #     so every hook inside (the notice's save, the ledger's events) has run first
    loaders.install()
    # 12. the profile window (HPC_TRAIN_PROFILE): the outermost train-step wrapper, so the
    #     hooks above are inside what it measures, as in any run
    profile.install(run, rank, worker.profile)
    # 13. rank 0's curves (--tensorboard, --wandb-project): it wraps fairseq's progress-bar
    #     factory, which no step above touches (train.log's lines are printed as before), and
    #     the save outermost, after 4 and 7: on the notice's save it finishes W&B's run once the
    #     snapshot is taken, before 6 writes the stop marker; last, so that W&B's start (a
    #     service process) follows everything a start needs in place
    tracking.install(run, worker, rank)
    return heartbeat


def main(argv: list[str] | None = None) -> None:
    preemption.install_handler()  # first; a notice before it: the launcher's record
    setup_logging()  # before fairseq's import: the root logger is the first configurer's
    quiet_known_warnings()
    lean_import.import_fairseq()  # without scikit-learn and SciPy: ~1.3 s of CPU less a start
    worker = WorkerEnv.from_env(os.environ)  # the launcher's word, parsed once
    rank = rank_of(os.environ)
    given, asked_levers = speed.split_args(sys.argv[1:] if argv is None else argv)
    args = given + distributed_args(os.environ)
    run = RunDir(save_dir_of(worker, args))
    log_to_file(run.train_log)
    say_image(rank)
    progress = {"update": 0}
    install_extensions(run, worker, rank, progress)
    start_process_group(os.environ, args)
    speed.install(asked_levers, cpu="--cpu" in args)  # after the GPU is bound: its capability
    sys.argv = ["fairseq-train", *args]
    try:
        run_fairseq(args)
    except BaseException as err:  # the launcher reads why (and at which update) this rank died
        crash.report(run, worker.start, rank, err, progress["update"])
        loaders.stop_all()  # not torch's exit hook: 5 s per loader process (worker.loaders)
        raise
    async_save.flush()  # the last save is durable before the worker exits
    loaders.stop_all()  # any loader still there (a run ended by its last epoch; step 11)
    stop_process_group()


def fairseq_config(args: list[str]) -> Any:
    """fairseq-train's arguments parsed into its config, with bf16 off TPUs allowed (and the
    speed levers' argument left out: ``speed.split_args``).

    fairseq 0.12's ``--bf16`` implies ``--tpu`` (bf16 was a TPU feature then), and with ``tpu``
    set the trainer asks torch_xla for its device. Unless ``--tpu`` was asked for, that implied
    flag is cleared: the model runs in bf16 on its GPU with fp32 master weights (fairseq's
    FP16Optimizer, no loss scaling).
    """
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args, _ = speed.split_args(args)  # the toolkit's lever argument is not fairseq's
    parsed = options.parse_args_and_arch(options.get_training_parser(), input_args=args)
    if parsed.bf16 and "--tpu" not in args:
        parsed.tpu = False
    return convert_namespace_to_omegaconf(parsed)


def run_fairseq(args: list[str]) -> None:
    """fairseq_cli.train.cli_main on ``fairseq_config`` (its plasma-store and profiler options,
    which this stack does not use, are left out)."""
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli.train import main as fairseq_main

    distributed_utils.call_main(fairseq_config(args), fairseq_main)


if __name__ == "__main__":
    main()
