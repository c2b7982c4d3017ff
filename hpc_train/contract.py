"""What crosses a process boundary: every variable, file and decision passed between the
launcher on each node and its training ranks, or between task 0's launcher and the others.

The paths are ``hpc_core.rundir.RunDir``'s and the ledger's kinds ``hpc_core.ledger.Kind``'s (with
their fields: ``hpc_core.ledger`` checks each line's kind, and may not import this package); the
other names and schemas are here. Each has a row below, with who writes it and who reads it.
Nothing else names an ``HPC_TRAIN_*`` variable a rank reads.

| what | schema | written by | read by |
|---|---|---|---|
| the ranks' environment (``HPC_TRAIN_*``) | ``WorkerEnv`` | each launcher, per start (``to_env``) | every rank, once (``worker.train``: ``from_env``) |
| ``.hpc-train/nodes/<job>-<restart>-task<t>.json`` | ``NodeReport`` | each launcher (its GPUs, its GPU check's failure) | task 0 (``launch.starts``) |
| ``.hpc-train/resume-<job>-<restart>.json`` | ``StartDecision`` | task 0, once per start | every launcher of that start |
| ``.hpc-train/next-<job>-<restart>.json`` | ``RoundVerdict`` (its ``RoundAction``) | task 0, when a start ends badly (and when it ends at all, with hot spares) | every launcher of that start and the spares standing by (restart in the allocation, or not) |
| ``.hpc-train/stopped-<job>-<restart>.json`` | ``StopMarker`` | rank 0, after the save on notice | the launchers (``checkpoint()``, the restart policy) |
| ``.hpc-train/notice-<job>-<restart>.json`` | ``{"signal", "node", "time"}`` (``record_notice``) | a launcher, on USR2 (its torchrun ignores it, its ranks may not have a handler yet) | every rank, each update until it has a notice (``worker.preemption``, ``read_notice``) |
| ``heartbeats/<job>-<restart>/<node>/rank-<r>.json`` | ``Beat`` | each rank, every update (``worker.heartbeat``) | that node's hang monitor, task 0's straggler monitor, ``faults.end_evidence`` |
| ``.hpc-train/launchers/<job>-<restart>-task<t>.json`` | ``LauncherBeat`` | each launcher's pulse thread, every few seconds | task 0 watches every other node's; task 1 watches task 0's (``watch.launchers``) |
| ``rank-<r>.stacks`` | text | a rank's faulthandler on ``STACKS_SIGNAL`` | the hang monitor |
| ``.hpc-train/failures/<job>-<restart>-rank<r>.json`` | ``FailureRecord`` | a rank, as an exception ends it (``worker.crash``) | every launcher at its start's end (``faults.end_evidence``, ``faults.failures``) |
| ``.hpc-train/chaos-crash.json`` | ``CrashRequest`` | ``hpc-train chaos JOB crash`` | every rank, each update (``worker.crash``) |
| ``.hpc-train/chaos-slow-save.json`` | ``{"seconds": S}`` (``ask_slow_saves``) | ``hpc-train chaos JOB slow-save`` | each rank's checkpoint writer, per save (``worker.async_save``) |
| ``.hpc-train/chaos-pace.json`` | ``{"seconds": S}`` (``ask_pace``) | ``hpc-train chaos JOB pace``; the tests' runs, before they are submitted | every rank, each update (``worker.pace``) |
| ``.hpc-train/nodes/<job>-<restart>-task<t>.exit.json`` | ``faults.failures.NodeExit`` | each launcher (launcher to launcher) | task 0 (``faults.end_evidence``) |
| ``.hpc-train/audit/<job>-<restart>/rank-<r>.jsonl`` | ``AuditLine`` (one a line) | each rank (``--audit-samples``) | ``runs.audit`` |
| ``.hpc-train/audit/plan-epoch<e>.json`` (``RunDir.audit_plan``) | the epoch's sample ids, a sorted JSON list | rank 0, at its first step of the epoch (``worker.data_position``, ``--audit-samples``) | ``runs.audit`` (each id once per epoch) |
| ``.hpc-train/ledger.jsonl``, one event a line (the kinds below) | ``hpc_core.ledger.Event``; each kind and its fields: ``hpc_core.ledger.Kind`` | submit, task 0's launcher, rank 0 (``worker.ledger_hooks``) | ``runs``, ``costs``, the launcher, the benchmarks |
| ``ledger.jsonl``: ``submitted`` | ``Kind.SUBMITTED`` | ``submit`` | ``runs`` (``index``, ``goodput``, ``metrics``: the doctor's limits) |
| ``ledger.jsonl``: ``started`` | ``Kind.STARTED`` | task 0 (``launch.lifecycle``) | ``runs`` (``index``, ``goodput``, ``metrics``, ``doctor``), ``launch.starts``, ``faults.end_evidence`` |
| ``ledger.jsonl``: ``first_update`` | ``Kind.FIRST_UPDATE`` | rank 0 (``worker.ledger_hooks``) | ``runs`` (``index``, ``goodput``, ``metrics``) |
| ``ledger.jsonl``: ``checkpoint`` | ``Kind.CHECKPOINT`` | rank 0 (``worker.ledger_hooks``) | ``planning.costs`` (the measured saves), ``runs`` (``index``, ``goodput``, ``metrics``, ``storage``) |
| ``ledger.jsonl``: ``verified`` | ``Kind.VERIFIED`` | rank 0, as it loads a checkpoint (``worker.checkpoints``) | ``runs.storage`` (``status``, ``doctor``) |
| ``ledger.jsonl``: ``set_aside`` | ``Kind.SET_ASIDE`` | task 0 choosing the resume (``launch.starts``), rank 0 as it loads (``worker.checkpoints``) | ``runs.storage`` (``status``, ``doctor``) |
| ``ledger.jsonl``: ``notice`` | ``Kind.NOTICE`` | task 0 (``launch.launcher``: ``checkpoint()``) | the user (a record) |
| ``ledger.jsonl``: ``stopped`` | ``Kind.STOPPED`` | task 0, or task 1 for a stuck task 0 (``launch.recovery``, the executor); its ``cause``: a ``Cause`` | ``runs`` (``index``, ``goodput``, ``metrics``), ``launch.starts``, ``launch.launcher``, ``launch.notify``, ``faults.end_evidence`` |
| ``ledger.jsonl``: ``blamed`` | ``Kind.BLAMED`` | task 0, or task 1 for a stuck task 0 (``faults.node_blame.Blamer``, by the executor); its ``cause``: a ``Cause`` | ``faults.suspects`` (the quarantine's count), ``faults.end_evidence``, ``runs`` (``named_nodes``, ``metrics``) |
| ``ledger.jsonl``: ``straggler`` | ``Kind.STRAGGLER`` | task 0's straggler thread (``watch.straggler_monitor``) | ``runs.named_nodes`` |
| ``ledger.jsonl``: ``requeued`` | ``Kind.REQUEUED`` | task 0, or task 1 for a stuck task 0 (``launch.recovery``; on a notice, submitit's requeue recorded there) | ``runs.metrics``, ``launch.notify`` |
| ``ledger.jsonl``: ``requeue_blocked`` | ``Kind.REQUEUE_BLOCKED`` | task 0, or task 1 for a stuck task 0 (``launch.recovery``) | ``runs.index`` |
| ``ledger.jsonl``: ``restarted`` | ``Kind.RESTARTED`` | task 0 (``launch.recovery``) | ``contract.last_round``, ``launch.launcher``, ``faults.end_evidence``, ``runs.index`` |
| ``ledger.jsonl``: ``released`` | ``Kind.RELEASED`` | task 0's release thread (``launch.release``) | the user (a record) |
| ``ledger.jsonl``: ``grown`` | ``Kind.GROWN`` | task 0's grow thread (``launch.lifecycle``) | ``launch.starts`` |
| ``ledger.jsonl``: ``finished`` | ``Kind.FINISHED`` | task 0 (``launch.recovery``) | ``runs`` (``index``, ``goodput``, ``doctor``), ``launch.notify`` |
| ``profile.json`` (``RunDir.profile``) | ``worker.profile_table.ProfileWindow.to_json`` | rank 0, when its ``HPC_TRAIN_PROFILE`` window closes | ``benchmarks.gpu_session``, ``benchmarks.levers_cpu``, the user |
| ``checkpoint_last.pt`` (``hpc_core.rundir.LAST``) | fairseq's checkpoint: a torch zip archive, its digest in its comment (``hpc_core.integrity``) | the ranks (fairseq, atomic, sealed before the rename) | task 0 (``worker.checkpoints.choose_resume``), the rank that loads it (verified: ``worker.checkpoints.install_verified_loads``) |
| ``.hpc-train/tracking.json`` (``RunDir.tracking_record``) | ``TrackingRecord`` | rank 0, at each start (``worker.tracking``, ``--tensorboard``, ``--wandb-project``) | ``runs.tracking`` (``status``, ``logs``: where the curves are) |
| ``.hpc-train/tracking-steps.json`` (``RunDir.tracking_steps``) | ``{tag: last step logged}`` (``write_steps``) | rank 0, before each logging call it lets through (``worker.tracking``) | rank 0 of every later start: nothing logged again |
| ``/opt/hpc-train/image.json`` inside an image (``IMAGE_MARKER``) | one line of JSON | the image's build (``slurm/local/build-image.sh``, the Containerfile) | each rank, at its start (``worker.train``: it says which image it runs in) |

The save dir reaches a rank here (``WorkerEnv.save_dir``), not through fairseq's arguments.

One start's files, its key bound once (the job id, its round's name ``<job>.<round>``, the
restart): ``StartFiles``, which the launcher's parts, the watchers and ``faults`` take whole.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from hpc_core import doorbell
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir, atomic_write
from hpc_core.slurm_env import SlurmEnv

IMAGE_MARKER = "/opt/hpc-train/image.json"  # only an image has it: what it was built from, when


def image_marker(root: Path = Path("/")) -> str | None:
    """The image this process runs in (its ``IMAGE_MARKER``, one line), or None on the host."""
    try:
        return (root / IMAGE_MARKER.lstrip("/")).read_text().strip() or None
    except OSError:
        return None


# --- the ranks' environment ---------------------------------------------------------------------

SAVE_DIR = "HPC_TRAIN_SAVE_DIR"  # the run's save dir (checkpoints, train.log, the ledger)
START = "HPC_TRAIN_START"  # "JOB:RESTART": which start this is, for the ledger and crash reports
STOP_MARKER = "HPC_TRAIN_STOP_MARKER"  # where rank 0 records the save on notice
NOTICE_PENDING = "HPC_TRAIN_NOTICE_PENDING"  # where a launcher records a notice it received
HEARTBEAT_DIR = "HPC_TRAIN_HEARTBEAT_DIR"  # this node's heartbeat dir; unset: --no-watchdog
SYNC_SAVE = "HPC_TRAIN_SYNC_SAVE"  # "1": fairseq's synchronous save (--sync-save)
LOCAL_SAVE_DIR = "HPC_TRAIN_LOCAL_SAVE_DIR"  # tiered saves: this run's dir on node-local disk
SAVE_INTERVAL_AUTO = "HPC_TRAIN_SAVE_INTERVAL_AUTO"  # "<job MTBF s>:<estimated save s>"
AUDIT_SAMPLES = "HPC_TRAIN_AUDIT_SAMPLES"  # "1": each rank records the sample ids it trains
PROFILE = "HPC_TRAIN_PROFILE"  # "<warm-up updates>:<profiled updates>": rank 0's profile window
TENSORBOARD = "HPC_TRAIN_TENSORBOARD"  # --tensorboard: rank 0's logdir (worker.tracking)
WANDB = "HPC_TRAIN_WANDB"  # --wandb-project: rank 0's W&B run, a WandbRun as JSON (never a key)
# task 0's launcher's bell (``hpc_core.doorbell``), a LauncherBell as JSON: rank 0 rings it as it
# writes the stop marker, which task 0's ``checkpoint()`` waits for (at its polls before)
BELL = "HPC_TRAIN_BELL"


@dataclass(frozen=True)
class LauncherBell:
    """A launcher's bell as a rank rings it: registered in ``registry`` under ``node`` for the
    Slurm start ``key`` (``hpc_core.doorbell``; ``Start.bell_key``)."""

    registry: Path
    node: str
    key: str

    def ring(self) -> None:
        doorbell.ring(self.registry, [self.node], self.key)

    def to_json(self) -> str:
        return json.dumps({"registry": str(self.registry), "node": self.node, "key": self.key})

    @classmethod
    def from_json(cls, text: str) -> LauncherBell:
        """ValueError when ``text`` is not one."""
        try:
            found = json.loads(text)
            return cls(Path(found["registry"]), str(found["node"]), str(found["key"]))
        except (TypeError, KeyError, json.JSONDecodeError) as err:
            raise ValueError(f"{BELL}={text!r} is not a launcher's bell ({err})") from None


@dataclass(frozen=True)
class WandbRun:
    """The run's one W&B run, as rank 0 opens it at every start (``job.tracking.wandb_run``
    decides it in the CLI). No key: W&B reads its own (``WANDB_API_KEY``, ``~/.netrc``)."""

    project: str
    run_id: str  # the same for every start of the run (job.tracking.run_id)
    name: str
    mode: str  # online | offline (auto is decided at submit)
    entity: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WandbRun:
        """ValueError when ``text`` is not one."""
        try:
            return cls(**json.loads(text))
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"{WANDB}={text!r} is not a W&B run ({err})") from None


@dataclass(frozen=True)
class WorkerEnv:
    """Everything a rank gets from its launcher, parsed once. A rank started by hand (a test, a
    benchmark) gets the fields it was given: no ``start``, no ledger events, no crash reports."""

    save_dir: Path | None = None  # None: the rank's own --save-dir (worker.train.save_dir_of)
    start: tuple[str, int] | None = None  # (job, restart)
    stop_marker: Path | None = None
    notice_pending: Path | None = None
    heartbeat_dir: Path | None = None
    sync_save: bool = False
    local_save_dir: Path | None = None
    auto_interval: tuple[float, float] | None = None  # (job MTBF s, estimated save s)
    audit_samples: bool = False  # --audit-samples (worker.data_position)
    profile: tuple[int, int] | None = None  # (warm-up, profiled) updates (worker.profile)
    tensorboard: Path | None = None  # rank 0's TensorBoard logdir (worker.tracking)
    wandb: WandbRun | None = None  # rank 0's W&B run (worker.tracking)
    bell: LauncherBell | None = None  # task 0's launcher's, rung with the stop marker

    def to_env(self) -> dict[str, str]:
        env = {SYNC_SAVE: "1" if self.sync_save else "0"}
        if self.audit_samples:
            env[AUDIT_SAMPLES] = "1"
        if self.save_dir is not None:
            env[SAVE_DIR] = str(self.save_dir)
        if self.start is not None:
            env[START] = f"{self.start[0]}:{self.start[1]}"
        if self.stop_marker is not None:
            env[STOP_MARKER] = str(self.stop_marker)
        if self.notice_pending is not None:
            env[NOTICE_PENDING] = str(self.notice_pending)
        if self.heartbeat_dir is not None:
            env[HEARTBEAT_DIR] = str(self.heartbeat_dir)
        if self.local_save_dir is not None:
            env[LOCAL_SAVE_DIR] = str(self.local_save_dir)
        if self.profile is not None:
            env[PROFILE] = f"{self.profile[0]}:{self.profile[1]}"
        if self.auto_interval is not None:
            mtbf_s, save_s = self.auto_interval
            env[SAVE_INTERVAL_AUTO] = f"{mtbf_s:.6g}:{save_s:.6g}"
        if self.tensorboard is not None:
            env[TENSORBOARD] = str(self.tensorboard)
        if self.wandb is not None:
            env[WANDB] = self.wandb.to_json()
        if self.bell is not None:
            env[BELL] = self.bell.to_json()
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerEnv:
        """The launcher's variables in ``env`` (ValueError when one is malformed)."""

        def path(name: str) -> Path | None:
            return Path(env[name]) if env.get(name) else None

        auto = None
        if env.get(SAVE_INTERVAL_AUTO):
            mtbf, _, estimate = env[SAVE_INTERVAL_AUTO].partition(":")
            auto = (float(mtbf), float(estimate or 0))
        if env.get(START) and parse_start(env[START]) is None:
            raise ValueError(f"{START}={env[START]!r} is not JOB:RESTART")
        return cls(
            save_dir=path(SAVE_DIR),
            start=parse_start(env.get(START, "")),
            stop_marker=path(STOP_MARKER),
            notice_pending=path(NOTICE_PENDING),
            heartbeat_dir=path(HEARTBEAT_DIR),
            sync_save=env.get(SYNC_SAVE, "") not in ("", "0"),
            local_save_dir=path(LOCAL_SAVE_DIR),
            auto_interval=auto,
            audit_samples=env.get(AUDIT_SAMPLES, "") not in ("", "0"),
            profile=parse_profile(env.get(PROFILE, "")),
            tensorboard=path(TENSORBOARD),
            wandb=WandbRun.from_json(env[WANDB]) if env.get(WANDB) else None,
            bell=LauncherBell.from_json(env[BELL]) if env.get(BELL) else None,
        )


def record_notice(path: Path, signal_name: str) -> None:
    """Record at ``path`` (``WorkerEnv.notice_pending``) that this node's launcher got a notice."""
    atomic_write(path, json.dumps({"signal": signal_name, "node": node_name(), "time": time.time()}),
                 durable=False)  # fmt: skip


def read_notice(path: Path) -> tuple[str | None, float | None]:
    """(signal name, epoch time) of the launcher's record at ``path``; (None, None) for a record
    that does not say (``record_notice`` writes atomically: no half-written one)."""
    try:
        record = json.loads(path.read_text())
        return str(record["signal"]), float(record["time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def parse_profile(value: str) -> tuple[int, int] | None:
    """(warm-up, profiled) updates from ``HPC_TRAIN_PROFILE``'s "W:N"; None when unset;
    ValueError unless W >= 0 and N >= 1."""
    if not value:
        return None
    warm, sep, count = value.partition(":")
    if not (sep and warm.isdigit() and count.isdigit() and int(count) >= 1):
        raise ValueError(f"{PROFILE}={value!r} is not WARMUP:UPDATES (e.g. 5:3)")
    return int(warm), int(count)


def parse_start(value: str) -> tuple[str, int] | None:
    """(job, restart) from ``HPC_TRAIN_START``'s "JOB:RESTART"; None when absent or malformed."""
    job, sep, restart = value.partition(":")
    return (job, int(restart)) if sep and job and restart.isdigit() else None


def rank_of(env: Mapping[str, str]) -> int:
    """This rank's global rank (torchrun's ``RANK``; 0 outside torchrun)."""
    return int(env.get("RANK", "0"))


def node_name() -> str:
    """The Slurm node this process runs on (emulated nodes share one host name)."""
    return SlurmEnv().nodename or socket.gethostname()


# --- launcher to launcher: one decision per start -----------------------------------------------


@dataclass(frozen=True)
class NodeReport:
    """What one node's launcher found at a start."""

    task: int
    node: str
    gpus: int  # usable GPUs: 0 when CUDA is absent or broken, or the job asks for none
    health: str = ""  # why its GPU check before training failed ('' passed, or not run)


@dataclass(frozen=True)
class StartDecision:
    """Task 0's decision for one start, which every node follows as is: what to resume from
    and the geometry (world, ranks per node, the batch plan), computed once."""

    args: list[str]  # fairseq's resume arguments (``--continue-once PATH`` for a fallback)
    at_update: int  # the update the resumed checkpoint was saved at (0: fresh start)
    reason: str = ""
    ranks_per_node: int = 1
    use_gpu: bool = False
    world_size: int = 0  # nodes x ranks_per_node
    batch_per_device: int = 0  # sequences per rank per step
    update_freq: int = 0  # steps per update: the global batch stays the recipe's
    refused: str = ""  # non-empty: this start does not run (a node short of GPUs, quarantined)
    bad_nodes: list[str] = field(default_factory=list)
    stop: str = ""  # non-empty: the run stops here, FAILED (no progress in restarts)
    held: str = ""  # non-empty: no checkpoint verifies: the job is held (``Cause.CHECKPOINT``)


def write_decision(run: RunDir, job: str, restart: int, decision: StartDecision) -> None:
    atomic_write(run.resume_decision(job, restart), json.dumps(asdict(decision)))


def read_decision(run: RunDir, job: str, restart: int) -> StartDecision | None:
    path = run.resume_decision(job, restart)
    return StartDecision(**json.loads(path.read_text())) if path.exists() else None


def write_node_report(run: RunDir, job: str, restart: int, report: NodeReport) -> None:
    atomic_write(run.node_report(job, restart, report.task), json.dumps(asdict(report)))


def read_node_reports(run: RunDir, job: str, restart: int, nodes: int) -> list[NodeReport] | None:
    """Every node's report for this start, or None while one is missing."""
    reports = []
    for task in range(nodes):
        path = run.node_report(job, restart, task)
        if not path.exists():
            return None
        reports.append(NodeReport(**json.loads(path.read_text())))
    return reports


# --- why a start ended: the cause of the ledger's ``stopped`` (task 0's launcher) -------------


class Cause(StrEnum):
    """Why a start ended, as task 0 says it: the ``cause`` of the ledger's ``stopped`` event
    (``Kind.STOPPED``), which ``hpc-train status``, the goodput and the metrics read; the class
    of a crash (``faults.failures``) and of a restart decision (``launch.restart_policy``). A
    member is the string it names: the ledger's lines are byte for byte what they were, and
    every writer and reader names the member (tests/hpc_train/test_vocabulary.py reads the code).
    """

    NOTICE = "notice"  # USR2 (preemption, the time limit, a spot notice): saved on notice
    CRASH = "crash"  # torchrun failed and no rank said why (a rank killed, a node lost)
    INFRASTRUCTURE = "infrastructure"  # a rank's report: NCCL, gloo, c10d, CUDA, a peer gone
    USER_ERROR = "user error"  # a rank's report: the training code's own exception
    HANG = "hang"  # the watchdog stopped the ranks, or a launcher was found stuck
    STRAGGLER = "straggler"  # --evict-stragglers: a slow node evicted at a save on notice
    BAD_NODE = "bad node"  # a start refused a node (short of GPUs, quarantined)
    NO_PROGRESS = "no progress"  # --max-no-progress-restarts: restarts that never advanced
    NO_NODES = "no nodes"  # a requeue that could not start: too few usable nodes
    CANCELLED = "cancelled"  # scancel: final, never requeued
    GROW = "grow"  # task 0's own notice to grow back wider (--grow-after)
    FINISHED = "finished"  # training reached max-update (the ledger's ``finished`` event)
    STORAGE = "storage"  # the save path failed: ENOSPC, EDQUOT, EROFS, EIO (issue 41)
    CHECKPOINT = (
        "bad checkpoint"  # a checkpoint failed verification as a rank loaded it, or none verifies
    )


# the causes task 0 holds the job for (``scontrol requeuehold``), and the prefix of the held job's
# Comment (``launch.recovery.hold`` writes it, ``runs.index.held_why`` reads it)
HELD_CAUSES = (Cause.STORAGE, Cause.CHECKPOINT)
HOLD_COMMENT = "hpc-train: "


class RoundAction(StrEnum):
    """What task 0's word (``RoundVerdict``) tells the other launchers of a round and the hot
    spares; a member is the string the verdict file holds."""

    RESTART_IN_JOB = "restart"  # train again in this allocation, on the verdict's members
    REQUEUE = "requeue"  # task 0 requeued the job through Slurm: wait for Slurm to end the task
    FAIL = "stop"  # the run fails here (no restart left, or no nodes for one): the task fails
    DONE = "done"  # (to the hot spares; after a cancel, to all) the run ended here: leave


IN_JOB_RESTART = "in-job restart"  # how a round's ``started`` event begins its ``previous``


@dataclass(frozen=True)
class RoundVerdict:
    """Task 0's word once a start ended badly (a crash, a hang): restart training in the
    same allocation on ``members`` (the others leave, the hot spares in ``standby`` wait on),
    requeue through Slurm, or fail; done (to the spares only): the run ended well."""

    action: RoundAction
    why: str
    members: list[str] = field(default_factory=list)
    standby: list[str] = field(default_factory=list)


def write_verdict(run: RunDir, job: str, restart: int, verdict: RoundVerdict) -> None:
    atomic_write(run.round_verdict(job, restart), json.dumps(asdict(verdict)))


def read_verdict(run: RunDir, job: str, restart: int) -> RoundVerdict | None:
    path = run.round_verdict(job, restart)
    if not path.exists():
        return None
    fields = json.loads(path.read_text())
    return RoundVerdict(**{**fields, "action": RoundAction(fields["action"])})


# --- rank 0 to the launchers: the save on notice ------------------------------------------------


@dataclass(frozen=True)
class StopMarker:
    """A worker saved ``checkpoint_last.pt`` at ``update`` on a notice and stopped."""

    update: int
    signal: str | None  # the notice's signal name (``worker.preemption``: whichever rank, or its
    # launcher, had it first); None in markers of earlier versions when a peer rank had it
    time: float = field(default_factory=time.time)


def write_stop(path: Path, marker: StopMarker, bell: LauncherBell | None = None) -> None:
    """Record a save on notice at ``path`` (``WorkerEnv.stop_marker``), then ring ``bell``
    (``WorkerEnv.bell``: task 0's launcher, waiting for it)."""
    atomic_write(path, json.dumps(asdict(marker)))
    if bell is not None:
        bell.ring()


def round_key(job: str, round_: int) -> str:
    """What names the files of round ``round_`` of a job's start: the job id, with ``.<round>``
    for an in-job restart (``41.1``), so no round reads another's files."""
    return job if round_ == 0 else f"{job}.{round_}"


def job_of(name: str) -> str:
    """The Slurm job id in a round's name (``round_key``'s: ``41.1`` -> ``41``): the job the
    ledger's launcher events name, where a rank is told the round (``StartFiles.ranks_start``)."""
    return name.partition(".")[0]


def last_round(events: Sequence[Any], job: str, restart: int) -> int:
    """The last round of ``job``'s start ``restart``: each in-job restart the launcher made is a
    ledger ``restarted`` event with its round (``events``: ``hpc_core.ledger.read``'s)."""
    rounds = [int(e.get("round") or 0) for e in events
              if e.kind == Kind.RESTARTED and (e.job, e.restart) == (job, restart)]  # fmt: skip
    return max(rounds, default=0)


def read_stop(run: RunDir, job: str, restart: int) -> StopMarker | None:
    path = run.stop_marker(job, restart)
    return StopMarker(**json.loads(path.read_text())) if path.exists() else None


# --- ranks to the audit (--audit-samples): the sample ids trained --------------------------------


@dataclass(frozen=True)
class AuditLine:
    """One line of a rank's audit file (``worker.data_position`` writes, ``runs.audit`` reads):
    a start's first line (``resumed``), a training step (``ids``) or an epoch's end (``end``)."""

    epoch: int
    update: int  # the update reached (``resumed``: the update of the save it resumed from)
    position: int  # batches of the epoch's plan consumed by all ranks, as this rank's iterator says
    t: float  # time.time(): the audit replays every rank's lines in this order
    ids: list[int] = field(default_factory=list)  # a step: the sample ids this rank trained
    resumed: bool = False  # this start resumed at ``update``: earlier starts' later lines undone
    end: bool = False  # the epoch's batches are all consumed
    world: int = 0  # the start's ranks (on ``resumed`` lines)


# --- ranks to the watchers: heartbeats ----------------------------------------------------------

STACKS_SIGNAL = signal.SIGUSR1  # a rank's faulthandler writes its Python stacks on this

# what a rank went on to do after its last completed update
TRAIN = "train"  # training the next update
CHECKPOINT = "checkpoint"  # in fairseq's validate_and_save (a save, or before validation)
VALIDATE = "validate"  # validating: a beat after each batch (``hpc_train.worker.validation_beats``)
EPOCH = "epoch"  # the epoch ended: validation, save, then the next epoch's iterator
STOPPING = "stopping"  # max-update reached (or a save on notice): final save, then exit
STARTUP = "startup"  # the rank is up (its stacks armed), no update yet: the start-up allowance


@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat (``hpc_core.rundir.heartbeat_file``)."""

    rank: int
    node: str
    pid: int
    update: int  # the last update it completed
    time: float  # when (time.time())
    phase: str = TRAIN  # what it went on to do
    slowest_s: float | None = None  # the slowest of its recent updates; None: none timed yet
    compute_s: float | None = None  # median own compute per recent update (stragglers)


LAUNCHING, WAITING, ENDING, ENDED = "launching", "waiting", "ending", "ended"


@dataclass(frozen=True)
class LauncherBeat:
    """One node's launcher is alive (``RunDir.launcher_beat``): what it is doing (``LAUNCHING``
    the start, ``WAITING`` on torchrun, ``ENDING`` after it, ``ENDED``: its part of the start is
    over) and since when. Written from a thread: a stopped or frozen launcher writes none."""

    task: int
    node: str
    pid: int
    time: float
    phase: str = LAUNCHING


def write_launcher_beat(run: RunDir, job: str, restart: int, beat: LauncherBeat) -> None:
    atomic_write(run.launcher_beat(job, restart, beat.task), json.dumps(asdict(beat)),
                 durable=False)  # fmt: skip


def read_launcher_beat(run: RunDir, job: str, restart: int, task: int) -> LauncherBeat | None:
    try:
        return LauncherBeat(**json.loads(run.launcher_beat(job, restart, task).read_text()))
    except (OSError, ValueError, TypeError):
        return None  # none yet, or being replaced right now: read it at the next look


def read_beats(directory: Path, node: str | None = None) -> list[Beat]:
    """The latest heartbeat of every rank in ``directory`` (only ``node``'s, if given)."""
    beats = []
    for path in sorted(directory.glob("rank-*.json")) if directory.is_dir() else []:
        try:
            beat = Beat(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # a rank's file being replaced right now: read it at the next poll
        if node is None or beat.node == node:
            beats.append(beat)
    return beats


def start_progress(
    run: RunDir, job: str, restart: int, hosts: Sequence[str]
) -> dict[str, float | int]:
    """How far a start got, from every node's heartbeats: ``reached`` (the last update any rank
    completed) and ``last_progress`` (when); empty without heartbeats (``--no-watchdog``). Task 0
    puts it in the ledger at the start's end, so the goodput never counts a stall as training."""
    beats = [beat for host in hosts for beat in read_beats(run.heartbeats(job, restart, host))]
    if not beats:
        return {}
    reached = max(beat.update for beat in beats)
    return {
        "reached": reached,
        "last_progress": max(beat.time for beat in beats if beat.update == reached),
    }


# --- one start's files, bound to its key once ---------------------------------------------------


@dataclass(frozen=True)
class StartFiles:
    """One start's files in the run directory, bound to the start's key once: the readers and
    writers above, for this start (for one round of it: an in-job restart's files are its
    own). ``job`` is the job id, as the ledger and Slurm know it; the round's ``name``
    (``round_key``: ``41.1``) only names files, so it cannot be passed where a job id is meant.
    The launcher's parts get it as ``Here.files``, the watchers and ``hpc_train.faults`` take it
    as it is."""

    run: RunDir
    job: str  # the Slurm job id
    restart: int  # SLURM_RESTART_COUNT: 0 on the job's first start
    round: int = 0  # in-job restarts within this Slurm start (0: the allocation's first)

    @property
    def name(self) -> str:
        """What names this round's files: the job id, ``.<round>`` after an in-job restart."""
        return round_key(self.job, self.round)

    def previous_start(self, events: Sequence[Any]) -> StartFiles | None:
        """The last round of the job's Slurm start before this one (``last_round`` of
        ``events``, the ledger's), whatever this one's round; None on the job's first start."""
        if self.restart == 0:
            return None
        return StartFiles(self.run, self.job, self.restart - 1,
                          last_round(events, self.job, self.restart - 1))  # fmt: skip

    def round_before(self, events: Sequence[Any]) -> StartFiles | None:
        """The round that ran just before this one: this start's previous round, else the last
        round of the start before (``previous_start``); None on the job's very first round."""
        if self.round > 0:
            return StartFiles(self.run, self.job, self.restart, self.round - 1)
        return self.previous_start(events)

    @property
    def ranks_start(self) -> tuple[str, int]:
        """This start as its ranks are told it (``WorkerEnv.start``: ``HPC_TRAIN_START``)."""
        return self.name, self.restart

    @property
    def stop_marker(self) -> Path:
        return self.run.stop_marker(self.name, self.restart)

    @property
    def notice_pending(self) -> Path:
        return self.run.notice_pending(self.name, self.restart)

    @property
    def incident(self) -> Path:
        return self.run.incident(self.name, self.restart)

    def heartbeats(self, node: str) -> Path:
        return self.run.heartbeats(self.name, self.restart, node)

    def node_exit(self, task: int) -> Path:
        return self.run.node_exit(self.name, self.restart, task)

    def stop(self) -> StopMarker | None:
        return read_stop(self.run, self.name, self.restart)

    def decision(self) -> StartDecision | None:
        return read_decision(self.run, self.name, self.restart)

    def write_decision(self, decision: StartDecision) -> None:
        write_decision(self.run, self.name, self.restart, decision)

    def node_reports(self, nodes: int) -> list[NodeReport] | None:
        return read_node_reports(self.run, self.name, self.restart, nodes)

    def write_node_report(self, report: NodeReport) -> None:
        write_node_report(self.run, self.name, self.restart, report)

    def verdict(self) -> RoundVerdict | None:
        return read_verdict(self.run, self.name, self.restart)

    def write_verdict(self, verdict: RoundVerdict) -> None:
        write_verdict(self.run, self.name, self.restart, verdict)

    def launcher_beat(self, task: int) -> LauncherBeat | None:
        return read_launcher_beat(self.run, self.name, self.restart, task)

    def write_launcher_beat(self, beat: LauncherBeat) -> None:
        write_launcher_beat(self.run, self.name, self.restart, beat)

    def progress(self, hosts: Sequence[str]) -> dict[str, float | int]:
        return start_progress(self.run, self.name, self.restart, hosts)

    def failure_fields(self) -> list[dict[str, Any]]:
        return read_failure_fields(self.run, self.name, self.restart)


# --- ranks to task 0: why a rank died; chaos to the ranks: a crash on purpose -------------------


@dataclass(frozen=True)
class FailureRecord:
    """The exception that ended a rank (``faults.failures`` classifies it; ``faults.storage``
    reads its errno). ``chain``: each exception of its chain (``__cause__``, else
    ``__context__``), outermost first, as ``Type: first line``; ``errno``: the first errno
    found in it (an ``OSError``'s, else ``[Errno N]`` in a message: torch's and fairseq's
    wrappers keep only the text), ``errno_path`` the file that OSError names, if any."""

    rank: int
    update: int  # the last update this rank had reached when it raised
    type: str
    message: str  # the exception's first line
    errno: int | None = None
    errno_path: str | None = None
    chain: tuple[str, ...] = ()
    node: str | None = None  # the node the rank ran on (``node_name``)

    def __post_init__(self) -> None:
        object.__setattr__(self, "chain", tuple(self.chain))  # a list, as JSON reads it back


def write_failure(run: RunDir, job: str, restart: int, record: FailureRecord) -> None:
    atomic_write(run.failure_report(job, restart, record.rank), json.dumps(asdict(record)))


# A report that could not be written (the save dir's file system full or read-only) goes to the
# rank's stderr instead, which torchrun's output reaches the task log by and task 0's launcher
# reads (``faults.agent_exit.Tee``): one line, this text, then the report as JSON.
FAILURE_LINE = "hpc-train: failure report not written "
FAILURE_LINE_RE = re.compile(re.escape(FAILURE_LINE) + r".*?; the report: (\{.*\})\s*$")


def failure_line(record: FailureRecord, path: Path, err: OSError) -> str:
    """The stderr line that stands for a report ``write_failure`` could not write."""
    return f"{FAILURE_LINE}({path}: {type(err).__name__}: {err}); the report: {json.dumps(asdict(record))}"


def failure_of_line(line: str) -> FailureRecord | None:
    """The report in a ``failure_line`` (None: not one, or not whole)."""
    found = FAILURE_LINE_RE.search(line)
    if found is None:
        return None
    try:
        return FailureRecord(**json.loads(found.group(1)))
    except (ValueError, TypeError):
        return None


def read_failure_fields(run: RunDir, job: str, restart: int) -> list[dict[str, Any]]:
    """The fields of every whole failure report of a start (a report cut short is skipped)."""
    out = []
    for path in run.failure_reports(job, restart):
        try:
            fields = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(fields, dict):
            out.append(fields)
    return out


@dataclass(frozen=True)
class CrashRequest:
    """``chaos JOB crash``: ``rank`` raises when it reaches ``update``."""

    update: int
    rank: int = 0


def write_crash_request(run: RunDir, request: CrashRequest) -> None:
    atomic_write(run.chaos_crash, json.dumps(asdict(request)))


def read_crash_request(run: RunDir) -> CrashRequest | None:
    """One stat() unless a crash was asked for (then one read)."""
    path = run.chaos_crash
    if not path.exists():
        return None
    try:
        asked = json.loads(path.read_text())
        return CrashRequest(int(asked["update"]), int(asked.get("rank", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _ask_seconds(path: Path, seconds: float) -> None:
    """A chaos request of ``{"seconds": S}`` at ``path``; 0 withdraws it."""
    if seconds > 0:
        atomic_write(path, json.dumps({"seconds": seconds}))
    else:
        path.unlink(missing_ok=True)


def _asked_seconds(path: Path | None) -> float:
    """The seconds a chaos request at ``path`` asks for (0: none); one stat() when it is absent."""
    if path is None or not path.exists():
        return 0.0
    try:
        return max(0.0, float(json.loads(path.read_text())["seconds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def ask_slow_saves(run: RunDir, seconds: float) -> None:
    """``chaos JOB slow-save``: every background checkpoint write of this run (this start and
    later ones) sleeps ``seconds`` first; 0 ends the rehearsal."""
    _ask_seconds(run.chaos_slow_save, seconds)


def slow_save_s(run: RunDir | None) -> float:
    """The seconds ``ask_slow_saves`` asked for (0: none); one stat() when nothing was asked."""
    return _asked_seconds(None if run is None else run.chaos_slow_save)


def ask_pace(run: RunDir, seconds: float) -> None:
    """``chaos JOB pace``: every update of this run (this start and later ones) takes at least
    ``seconds``, each rank sleeping what its update left of them; 0 ends the rehearsal."""
    _ask_seconds(run.chaos_pace, seconds)


def pace_s(run: RunDir) -> float:
    """The seconds ``ask_pace`` asked for (0: none); one stat() when nothing was asked."""
    return _asked_seconds(run.chaos_pace)


# --- rank 0's experiment tracking: where the curves are, what was logged ------------------------


@dataclass(frozen=True)
class TrackingRecord:
    """Where rank 0 logs the run's curves, as its last start said (``RunDir.tracking_record``):
    the TensorBoard logdir, the W&B run (its URL once W&B gave one: online only), and this
    start's W&B folder (offline: what ``wandb sync`` takes)."""

    tensorboard: str | None = None
    wandb: WandbRun | None = None
    url: str | None = None
    wandb_dir: str | None = None


def write_tracking(run: RunDir, record: TrackingRecord) -> None:
    atomic_write(run.tracking_record, json.dumps(asdict(record)), durable=False)


def read_tracking(run: RunDir) -> TrackingRecord | None:
    """The record, or None: no tracking asked, no start yet, or a record cut short."""
    try:
        fields = json.loads(run.tracking_record.read_text())
        wandb = fields.pop("wandb", None)
        return TrackingRecord(wandb=WandbRun(**wandb) if wandb else None, **fields)
    except (OSError, ValueError, TypeError):
        return None


def write_steps(run: RunDir, steps: Mapping[str, int]) -> None:
    """The last step rank 0 logged under each tag (one file, whole or not at all)."""
    atomic_write(run.tracking_steps, json.dumps(dict(steps), sort_keys=True), durable=False)


def read_steps(run: RunDir) -> dict[str, int]:
    """What every earlier start logged, by tag: {} before the first log (or a record unread)."""
    try:
        said = json.loads(run.tracking_steps.read_text())
        return {str(tag): int(step) for tag, step in said.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
