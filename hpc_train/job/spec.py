"""The job spec: one validated value that carries a run from the CLI to every rank.

The submit CLI builds it, ``--dry-run`` renders from it, submitit pickles it into the job, and the
launcher reads it on every (re)start. Nothing here imports torch, fairseq or submitit.

Every field of ``JobSpec`` is a section, a frozen value whose fields carry their options
(``job.fields``), each read by the concern it names: ``training`` (``Training``: what is trained,
on what, where it is saved), ``sizing`` (``job.sizing.Sizing``: how wide, on what, the batch),
``slurm`` (``SlurmJob``: what the job asks of Slurm), ``recovery`` (``Recovery``: restarts,
growing back, in-job rounds, spares, and what follows a blame), ``saves`` (``Saves``), ``notify``
(``Notifications``), ``watch`` (``job.limits.Watch``: the watchers' ``HangLimits`` and
``StragglerLimits`` as they are), ``container`` (``Container``) and ``speed``
(``job.levers.Speed``: one setting per lever), ``tracking`` (``job.tracking.Tracking``:
TensorBoard, W&B). ``JobSpec`` itself derives what needs more than
one section (the recipe, the updates, the batch plan, the container's mounts).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from hpc_core.instances import INSTANCE_TYPES
from hpc_core.rundir import RunDir
from hpc_train.job import batch, container, devices, levers, presets
from hpc_train.job.container import Mount
from hpc_train.job.fields import SpecError, nested, option, seconds
from hpc_train.job.levers import Speed
from hpc_train.job.limits import Watch
from hpc_train.job.sizing import Sizing
from hpc_train.job.tracking import Tracking


def parse_time(text: str) -> int:
    """Slurm time formats → minutes: ``90``, ``H:MM:SS``, ``D-HH[:MM[:SS]]``."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise SpecError(f"--time {text!r}: expected minutes, H:MM:SS or D-HH:MM:SS")
    days, first, second, third = (int(g) if g else None for g in m.groups())
    assert first is not None  # the pattern requires it
    minutes: float
    if days is None and second is None:
        minutes = first  # plain minutes
    elif days is None and third is None:
        minutes = first + (second or 0) / 60  # MM:SS
    elif days is None:
        minutes = first * 60 + (second or 0) + (third or 0) / 60  # H:MM:SS
    else:
        minutes = days * 1440 + first * 60 + (second or 0) + (third or 0) / 60
    return max(1, round(minutes))


SIGNAL_DELAY_S = 90  # submitit sends USR2 this long before the time limit (the notice)

MAIL_TYPES = frozenset({
    "NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT",
    "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS",
})  # fmt: skip


def parse_mail_type(text: str) -> str:
    """sbatch's --mail-type: a comma list of Slurm's event names (checked here, not by sbatch)."""
    types = [t.strip().upper() for t in text.split(",") if t.strip()]
    unknown = [t for t in types if t not in MAIL_TYPES]
    if not types or unknown:
        raise SpecError(
            f"--mail-type {text!r}: expected a comma list of {', '.join(sorted(MAIL_TYPES))}"
        )
    return ",".join(types)


def parse_save_interval(text: str) -> str:
    """``--save-interval``: ``preset``, ``auto`` or a whole number of updates >= 1."""
    value = text.strip().lower()
    if value in {"preset", "auto"} or (value.isdigit() and int(value) >= 1):
        return value
    raise SpecError(f"--save-interval {text!r}: expected N >= 1, preset or auto")


def parse_local_save_dir(path: Path) -> Path:
    """A node-local directory: absolute (it is resolved on each node, not here)."""
    if not path.is_absolute():
        raise SpecError(
            f"--local-save-dir {path}: must be an absolute path on the nodes' local disk, "
            "e.g. /scratch/hpc-train"
        )
    return path


def parse_container(text: str) -> str:
    """``--container``: a registry reference, a squashfs file or an OCI image directory
    (``job.container``)."""
    try:
        return container.parse_image(text)
    except container.ContainerError as err:
        raise SpecError(str(err)) from None


def parse_container_mounts(text: str) -> tuple[Mount, ...]:
    """``--container-mounts``: ``SRC:DST[:FLAGS][,...]``, DST absolute (``job.container``)."""
    try:
        return container.parse_mounts(text)
    except container.ContainerError as err:
        raise SpecError(str(err)) from None


def _absolute_path(path: Path) -> Path:
    return path.resolve()


@dataclass(frozen=True)
class Training:
    """What is trained, on what and where it is saved (``JobSpec.training``): the preset's
    recipe, the corpus, the save dir, the updates, the sample audit, fairseq's own arguments."""

    preset: str = option(
        "--preset", f"training recipe, one of: {', '.join(presets.PRESETS)}", metavar="NAME"
    )
    data: Path = option(
        "--data", "binarized corpus (fairseq-preprocess output, e.g. from hpc_train.data)",
        type=Path, parse=_absolute_path, metavar="DIR",
    )  # fmt: skip
    save_dir: Path = option(
        "--save-dir", "checkpoints, train.log and task logs; shared storage (Lustre)",
        type=Path, parse=_absolute_path, metavar="DIR",
    )  # fmt: skip
    max_update: int | None = option(
        "--max-update", "training updates", default=None, type=int,
        default_text="the preset's", metavar="N",
    )  # fmt: skip
    audit_samples: bool = option(
        "--audit-samples", "each rank records the sample ids it trains, per epoch (under "
        "<save-dir>/.hpc-train/audit/); `python -m hpc_train.runs.audit SAVE_DIR` checks that "
        "every sample of an epoch was trained exactly once across restarts and width changes",
        default=False,
    )  # fmt: skip
    hollow: bool = option(
        "--hollow", "a STAND-IN FOR THE MODEL, to measure the control plane at scale only "
        "(make bench-scale): each rank is hpc_train.worker.hollow (the real launcher, torchrun, "
        "heartbeats, saves on notice, checkpoints of a small real state, one gloo all-reduce per "
        "update; no fairseq); no training figure ever comes from such a run", default=False,
    )  # fmt: skip
    extra_args: tuple[str, ...] = field(default=())  # after `--`: fairseq-train, unchanged


@dataclass(frozen=True)
class SlurmJob:
    """What the job asks of Slurm beyond its nodes (``JobSpec.slurm``): the partition, the time
    limit, the job's name, CPUs per task, and the all-reduce check before training."""

    partition: str | None = option(
        "--partition", "Slurm partition", default=None, default_text="the cluster's default",
        metavar="PARTITION",
    )  # fmt: skip
    time_limit_min: int = option(
        "--time", "time limit: minutes, H:MM:SS or D-HH:MM:SS", default=24 * 60,
        parse=parse_time, default_text="24:00:00", metavar="LIMIT",
    )  # fmt: skip
    job_name: str = option("--job-name", "Slurm job name", default="hpc-train", metavar="NAME")
    cpus_per_task: int | None = option(
        "--cpus-per-task", "CPUs for each node's task", default=None, type=int, metavar="N",
        default_text="all cores of the instance type on GPU nodes, Slurm's default on CPU nodes",
    )  # fmt: skip
    preflight: bool = option(
        "--preflight", "all-reduce health check of the allocation before training", default=False
    )
    node_check: str = option(
        "--node-check",
        "each node's GPUs checked through NVML (nccl_checks gpu) at every start, before training; "
        "a node that fails is blamed on that evidence, drained and left out",
        default="auto", choices=("auto", "on", "off"),
        default_text="auto: on where ParallelCluster's DCGM check in the prolog is off "
        "(p3dn.24xlarge: docs/on-aws.md), off elsewhere",
    )  # fmt: skip


@dataclass(frozen=True)
class Recovery:
    """What follows a failure, a notice or a narrow start (``JobSpec.recovery``): the restart
    budget, growing back, in-job restarts and hot spares (``launch.restart_policy``), and what
    follows a blame: drained or not, a straggler evicted (the policy and its executor,
    ``launch.recovery``)."""

    max_restarts: int = option(
        "--max-restarts",
        "restarts allowed in all: preemptions, node failures, crashes and time-limit requeues",
        default=20, type=int, metavar="N",
    )  # fmt: skip
    grow_after: float = seconds(
        "--grow-after",
        "with --nodes MIN-MAX on fewer than MAX: grow once free nodes of the partition stay idle "
        "this many seconds and Slurm would start them now (save on notice, requeue wider; "
        "0: never)",
        300.0,
    )
    restart_in_job: bool = option(
        "--restart-in-job",
        "after a crash or a hang, restart training inside the allocation on its healthy nodes "
        "(the blamed node drained and left out) instead of a requeue through Slurm; a requeue "
        "still follows when fewer than MIN healthy nodes remain",
        default=False,
    )  # fmt: skip
    spares: int = option(
        "--spares",
        "hot spares: up to K more nodes allocated and kept idle; a node blamed for a crash, a "
        "hang, a lost node or a straggler is replaced by one inside the allocation, at the same "
        "width (implies --restart-in-job; needs a fixed --nodes N; the spares are billed). Best "
        "effort: a start takes the spares that are free and never waits for them",
        default=0, type=int, metavar="K",
    )  # fmt: skip
    nodes_replaced: str = option(
        "--nodes-replaced",
        "does the cluster replace a node that is drained or down (ParallelCluster's "
        "clustermgtd does)? yes: a requeue short of usable nodes waits for the replacements, "
        "and a blamed node is drained but not excluded by name (its replacement is another "
        "machine); no: such a requeue stops the run with the reason; auto: yes where every node "
        "of the partition has a ParallelCluster name",
        default="auto", choices=("auto", "yes", "no"),
    )  # fmt: skip
    max_no_progress_restarts: int = option(
        "--max-no-progress-restarts",
        "stop the run (FAILED, with the reason) after N restarts in a row that resumed from the "
        "same checkpoint: none advanced it (0: never)",
        default=3, type=int, metavar="N",
    )  # fmt: skip
    no_drain: bool = option(
        "--no-drain", "never drain a blamed node, whatever it is blamed for (a hang, a crash, a "
        "lost node, a straggler, a failed health check); where its blame's verdict leaves it "
        "out, it is still left out of the restart and excluded from the requeued job",
        default=False,
    )  # fmt: skip
    evict_stragglers: bool = option(
        "--evict-stragglers", "a straggler is a bad node: all ranks save at the next update, "
        "it is drained (unless --no-drain), the job requeued without it", default=False,
    )  # fmt: skip

    @property
    def in_job_restarts(self) -> bool:
        """Recover inside the allocation (``--restart-in-job``, or spares to swap in)."""
        return self.restart_in_job or self.spares > 0


@dataclass(frozen=True)
class Saves:
    """When and where checkpoints are written (``JobSpec.saves``)."""

    keep_checkpoints: int = option(
        "--keep-checkpoints", "interval checkpoints kept (checkpoint_last.pt always)",
        default=3, type=int, metavar="N",
    )  # fmt: skip
    interval: str = option(
        "--save-interval", "updates between periodic saves: N, `preset`, or `auto` (Daly's "
        "interval from this run's measured save and update times and --mtbf-hours, see "
        "hpc_train/worker/save_interval.py)", default="preset", metavar="N|preset|auto",
    )  # fmt: skip
    mtbf_hours: float = option(
        "--mtbf-hours", "one node's mean time between failures (spot reclaims included) for "
        "--save-interval auto: an assumption, put your cluster's", default=2000.0, type=float,
        metavar="H",
    )  # fmt: skip
    sync: bool = option(
        "--sync-save", "save checkpoints inside the training loop (default: snapshot to host "
        "memory, write in the background, see hpc_train/worker/async_save.py)", default=False,
    )  # fmt: skip
    local_dir: Path | None = option(
        "--local-save-dir", "tiered saves: periodic checkpoints are written to this node-local "
        "disk first (instance-store NVMe, e.g. /scratch/hpc-train; absolute, as the nodes see "
        "it) and copied to --save-dir in the background; resume reads --save-dir only, a save "
        "on notice goes straight there", default=None, type=Path, parse=parse_local_save_dir,
        metavar="DIR", default_text="off: saves go straight to --save-dir",
    )  # fmt: skip

    def __post_init__(self) -> None:
        # --save-interval is parsed here, once however the spec was built (the CLI, a
        # benchmark, dataclasses.replace): everyone after reads the canonical value
        object.__setattr__(self, "interval", parse_save_interval(self.interval))


@dataclass(frozen=True)
class Notifications:
    """Who hears of the run's events (``JobSpec.notify``): Slurm's mail, and a command."""

    mail_user: str | None = option(
        "--mail-user", "Slurm mails this address on the --mail-type events", default=None,
        metavar="ADDR",
    )  # fmt: skip
    mail_type: str | None = option(
        "--mail-type", "Slurm's mail events, e.g. END,FAIL,REQUEUE", default=None,
        parse=parse_mail_type, metavar="TYPES", default_text="Slurm's (none)",
    )  # fmt: skip
    command: str | None = option(
        "--notify", "a command (sh -c) run on the node on finish, failure and each requeue, "
        "the ledger event as JSON on its stdin", default=None, metavar="CMD",
    )  # fmt: skip


@dataclass(frozen=True)
class Container:
    """The image the launcher and the ranks run in (``JobSpec.container``, ``job.container``);
    ``image`` None: the nodes' own Python environment."""

    image: str | None = option(
        "--container", "run the launcher and the ranks inside this image (docs/containers.md): "
        "through pyxis (srun --container-image) a registry reference in enroot's form, "
        "docker://[USER@][REGISTRY#]IMAGE[:TAG], or a squashfs file from `enroot import` "
        "(bootstrap/container/import.sh), e.g. /lustre/images/hpc-train.sqsh; through Slurm's "
        "own OCI support (srun --container, runc) an OCI image directory, e.g. the local "
        "cluster's .local/images/hpc-train (slurm/local/build-image.sh); the save dir, the "
        "data, --local-save-dir (it must exist on every node) and the nodes' Slurm client are "
        "mounted at their own paths", default=None, parse=parse_container, metavar="IMAGE",
        default_text="off: the bootstrap's Python environment on the nodes",
    )  # fmt: skip
    mounts: tuple[Mount, ...] = option(
        "--container-mounts", "more bind mounts for --container, SRC:DST[:FLAGS][,...] (pyxis's form) "
        "(SRC must exist, DST absolute), e.g. /lustre/tokenizers:/tokenizers:ro",
        default=(), parse=parse_container_mounts, metavar="SRC:DST[,...]", default_text="none",
    )  # fmt: skip


@dataclass(frozen=True)
class JobSpec:
    """A run: one section per concern, each holding its options in the order ``--help`` shows
    them (``job.options`` walks them); what needs more than one section is derived here."""

    training: Training = nested(Training, required=True)
    sizing: Sizing = nested(Sizing)
    slurm: SlurmJob = nested(SlurmJob)
    recovery: Recovery = nested(Recovery)
    saves: Saves = nested(Saves)
    notify: Notifications = nested(Notifications)
    watch: Watch = nested(Watch)
    container: Container = nested(Container)
    speed: Speed = nested(Speed)
    tracking: Tracking = nested(Tracking)

    @property
    def recipe(self) -> presets.Preset:
        return presets.get(self.training.preset)

    @property
    def updates(self) -> int:
        return self.recipe.updates(self.training.max_update)

    @property
    def save_interval_updates(self) -> int:
        """fairseq's ``--save-interval-updates`` at start (``auto`` starts from the preset's)."""
        if self.saves.interval.isdigit():
            return int(self.saves.interval)
        return self.recipe.save_interval_updates

    @property
    def run_dir(self) -> RunDir:
        """The save dir's layout: logs, checkpoints, markers (``hpc_core.rundir``)."""
        return RunDir(self.training.save_dir)

    @property
    def sequences_per_update(self) -> int:
        return self.sizing.sequences_per_update(self.recipe)

    @property
    def checks_nodes(self) -> bool:
        """Each node's launcher checks its GPUs before training (``--node-check``; auto: where
        ParallelCluster's DCGM check in the prolog is unfit, ``InstanceType.dcgm_prolog``)."""
        sizing, asked = self.sizing, self.slurm.node_check
        if sizing.gpus_per_node <= 0 or asked == "off":
            return False
        itype = INSTANCE_TYPES.get(sizing.instance_type)  # an unknown one is refused at submit
        return asked == "on" or (itype is not None and not itype.dcgm_prolog)

    @property
    def allocation_arg(self) -> str:
        """sbatch's --nodes, the hot spares included (``Sizing.allocation_arg``)."""
        return self.sizing.allocation_arg(self.recovery.spares)

    def spares_in(self, allocated: int) -> int:
        """The hot spares in an allocation of ``allocated`` nodes (``Sizing.spares_in``)."""
        return self.sizing.spares_in(allocated, self.recovery.spares)

    def device_batch(self, gpu: bool, world_size: int) -> int:
        return self.sizing.device_batch(self.recipe, gpu, world_size)

    def batch_plan(self, world_size: int, gpu: bool) -> batch.BatchPlan:
        """The batch plan on ``world_size`` ranks (``Sizing.batch_plan`` with the recipe)."""
        return self.sizing.batch_plan(self.recipe, world_size, gpu)

    def lever_cc(self, gpu: bool) -> levers.CC | None:
        """The compute capability the levers are chosen for: the instance type's GPU; None for
        CPU ranks."""
        return levers.compute_capability(self.sizing.instance_type) if gpu else None

    def lever_choices(self, gpu: bool) -> tuple[levers.Choice, ...]:
        return levers.choose(self.lever_cc(gpu), self.speed.settings())

    @property
    def container_mount_list(self) -> tuple[Mount, ...]:
        """Every mount of the job's container (``job.container.job_mounts``); () without one."""
        image = self.container.image
        if image is None:
            return ()
        return container.job_mounts(
            self.training.save_dir,
            self.training.data,
            self.saves.local_dir,
            self.container.mounts,
            container.client_mounts(image),
        )

    @property
    def container_srun_args(self) -> list[str]:
        """The container options of the job's srun (``job.container``: pyxis's, or Slurm's own
        ``--container`` with the run's OCI bundle); [] without --container."""
        if self.container.image is None:
            return []
        return container.srun_args(
            self.container.image,
            self.container_mount_list,
            self.training.save_dir,
            self.run_dir.oci_bundle,
        )


def is_binarized(data: Path) -> bool:
    """A fairseq-preprocess'ed masked-LM corpus: dict.txt and train.{bin,idx}."""
    return all((data / name).is_file() for name in ("dict.txt", "train.bin", "train.idx"))


def check_data(data: Path) -> None:
    if not data.exists():
        raise SpecError(f"--data {data}: no such directory")
    if not is_binarized(data):
        raise SpecError(
            f"--data {data}: not a binarized fairseq corpus (needs dict.txt, train.bin, "
            "train.idx; prepare one with `python -m hpc_train.data`)"
        )


def check_writable(save_dir: Path) -> None:
    """The save dir, or the nearest directory that would hold it, must be writable."""
    probe = save_dir
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise SpecError(f"--save-dir {save_dir}: not writable ({probe} is not a writable dir)")


def check_container(spec: JobSpec, check_paths: bool) -> None:
    """``--container``: the mounts' paths and destinations; with ``check_paths`` a file image's
    existence and squashfs magic, and each ``--container-mounts`` source's existence."""
    image, mounts = spec.container.image, spec.container.mounts
    if image is None:
        if mounts:
            raise SpecError("--container-mounts needs --container IMAGE")
        return
    if spec.slurm.preflight:
        raise SpecError(
            "--preflight with --container: not yet (the check would run outside the image); "
            "run `python -m nccl_checks allreduce` with the image on its own"
        )
    try:
        spec.container_srun_args  # noqa: B018 - builds the mount list: ',' ':' and clashes
        if check_paths:
            container.check_image_file(image)
            container.check_mount_sources(mounts)
    except container.ContainerError as err:
        raise SpecError(str(err)) from None


def check_options(spec: JobSpec) -> None:
    """The recovery, save and watch options, each in its range (SpecError, one line)."""
    recovery, saves = spec.recovery, spec.saves
    hang, stragglers = spec.watch.hang, spec.watch.stragglers
    if recovery.spares < 0:
        raise SpecError(f"--spares {recovery.spares}: must be >= 0")
    if recovery.spares and spec.sizing.nodes_min != spec.sizing.nodes_max:
        raise SpecError(f"--spares needs a fixed --nodes N (got {spec.sizing.nodes_arg})")
    if recovery.grow_after < 0:
        raise SpecError(f"--grow-after {recovery.grow_after:g}: must be >= 0 (0: never grow)")
    restarts = (recovery.max_restarts, recovery.max_no_progress_restarts)
    if min(restarts) < 0 or saves.keep_checkpoints < 1:
        raise SpecError(
            "--max-restarts and --max-no-progress-restarts must be >= 0, --keep-checkpoints >= 1"
        )
    if hang.factor < 1 or min(hang.floor_s, hang.save_s, hang.startup_s) <= 0:
        raise SpecError("--hang-factor must be >= 1 and the --hang-*-timeout* values > 0")
    if stragglers.threshold <= 0 or stragglers.window_s <= 0:
        raise SpecError("--straggler-threshold and --straggler-window must be > 0")
    if saves.mtbf_hours <= 0:
        raise SpecError(f"--mtbf-hours {saves.mtbf_hours:g}: must be > 0")
    if saves.local_dir is not None and saves.sync:
        raise SpecError("--local-save-dir needs async saves: drop --sync-save")


def validate(spec: JobSpec, check_paths: bool = True) -> batch.BatchPlan:
    """Check everything that can be checked before submitting; return the largest-world plan.

    Raises SpecError (one line). ``check_paths=False`` skips the data and save-dir checks
    (``--dry-run`` on a machine without the data).
    """
    try:
        presets.get(spec.training.preset)
    except ValueError as err:
        raise SpecError(str(err)) from None
    sizing = spec.sizing
    if sizing.nodes_min < 1 or sizing.nodes_max < sizing.nodes_min:
        raise SpecError(f"--nodes {sizing.nodes_arg}: need 1 <= MIN <= MAX")
    if sizing.gpus_per_node < 0:
        raise SpecError("--gpus-per-node must be >= 0 (0: CPU ranks, one per node)")
    if sizing.gpus_per_node and sizing.instance_type not in INSTANCE_TYPES:
        known = ", ".join(sorted(INSTANCE_TYPES))
        raise SpecError(f"--instance-type {sizing.instance_type}: unknown (known: {known})")
    if spec.updates < 1:
        raise SpecError("--max-update must be >= 1")
    if spec.sequences_per_update < 1:
        raise SpecError("--global-batch must be >= 1")
    check_options(spec)
    if sizing.batch_per_device is not None and sizing.batch_per_device < 1:
        raise SpecError("--batch-per-device must be >= 1")
    problem = devices.precision_problem(sizing.instance_type, sizing.gpu_precision)
    if sizing.gpus_per_node and problem:
        raise SpecError(problem)
    gpu = sizing.gpus_per_node > 0
    gpu_text = f"the GPU of {sizing.instance_type}" if gpu else "a CPU rank"
    if lever_problem := levers.problem(spec.lever_cc(gpu), spec.speed.settings(), gpu_text):
        raise SpecError(lever_problem)
    try:
        plan = spec.batch_plan(sizing.largest_world(gpu), gpu)
    except ValueError as err:
        raise SpecError(f"--global-batch: {err}") from None
    check_container(spec, check_paths)
    if check_paths:
        check_data(spec.training.data)
        check_writable(spec.training.save_dir)
    return plan
