"""The run directory (``--save-dir``): every path under it, the files the launcher and the
workers exchange, and the one way to write a file whole.

    <save-dir>/
      train.log                  fairseq's metrics (rank 0), one file across restarts
      checkpoint_last.pt         what every (re)start resumes from
      checkpoint_E_U.pt          interval checkpoints (the fallback)
      checkpoint*.pt.bad-*       a checkpoint that failed verification, kept aside (never
                                 deleted; ``hpc_core.integrity``, ``worker.checkpoints``)
      slurm/                     submitit's per-task logs and pickles
      preflight/                 the all-reduce check's output (``--preflight``)
      .hpc-train/
        resume-<job>-<restart>.json   task 0's decision for that start: resume, geometry
        next-<job>-<restart>.json     task 0's word after a bad end: restart in the allocation
                                      (on which nodes), requeue, or stop; <job> is ``41.1`` for
                                      the first in-job restart of job 41
        nodes/<job>-<restart>-task<t>.json  what each node's launcher found (GPUs), for task 0
        nodes/<job>-<restart>-task<t>.exit.json  how torchrun ended there (status, root cause)
        stopped-<job>-<restart>.json  a worker's stop marker: it saved on notice at an update
        heartbeats/<job>-<restart>/<node>/  rank-<r>.json: each rank's last completed update
                                      (every update); rank-<r>.stacks: its stacks on SIGUSR1;
                                      GPU ranks: nccl_trace_rank_<r> (the NCCL flight recorder's
                                      dump), nccl_trace_pipe_rank_<r>.pipe (a write: dump now)
        incidents/<job>-<restart>/    a hang's evidence: hang.json (who declared it), node-<n>.json
                                      (each node's ranks), stacks-rank<r>.txt, suspect.json,
                                      nccl_trace_rank_<r> (GPU ranks)
        ledger.jsonl                  one line per stage of the run (``hpc_core.ledger``)
        failures/<job>-<restart>-rank<r>.json  the exception that ended a worker, at which update
        chaos-crash.json              ``chaos JOB crash``: the update at which a worker raises
        chaos-slow-save.json          ``chaos JOB slow-save``: seconds every checkpoint write sleeps
        chaos-pace.json               ``chaos JOB pace``: the least seconds an update takes
        audit/<job>-<restart>/rank-<r>.jsonl  ``--audit-samples``: the sample ids each rank trained
        audit/plan-epoch<e>.json      the sample ids of epoch e's batch plan
        quarantine.json               nodes blamed twice within a day: kept out of this run

With ``--local-save-dir ROOT`` (tiered saves, ``hpc_train.worker.local_tier``) each node also keeps
the newest checkpoint it wrote in ``RunDir.local_tier(ROOT)``: ``ROOT/<save-dir name>-<hash>/``,
same file names, never read at resume.

Writes are atomic: a temporary sibling, fsync, rename, fsync of the directory. A reader sees the
old file or the new one, whole, never a mix; a write killed half-way leaves only a ``.*.tmp``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

TRAIN_LOG = "train.log"
LAST = "checkpoint_last.pt"
INTERVAL_RE = re.compile(r"checkpoint_(\d+)_(\d+)\.pt")
TASK_LOG_RE = re.compile(r"(\d+)_(\d+)_log\.(out|err)")
STATE = ".hpc-train"
BAD = ".bad-"  # a checkpoint set aside: ``<name>.bad-<time>-<pid>`` (``set_aside_name``)
HANG_DECLARED = "hang.json"  # in an incident dir: the first node that saw the hang
SUSPECT = "suspect.json"  # in an incident dir: task 0's verdict (node, rank, why, drained)


# --- atomic writes ----------------------------------------------------------------------------


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_sibling(path: Path) -> Path:
    """``.<name>.<pid>.tmp`` beside ``path``: hidden, unique per writer, easy to clean up."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextmanager
def atomic_writer(
    path: Path | str,
    mode: str = "wb",
    durable: bool = True,
    check: Callable[[Path], None] | None = None,
) -> Iterator[IO[Any]]:
    """Open a temporary sibling for writing; on success fsync it, rename it over ``path`` and
    fsync the directory. On an exception the temporary is removed and ``path`` is untouched.

    ``durable=False`` skips both fsyncs: still whole-or-nothing for a reader, but may be lost
    in a crash of the machine (a heartbeat written every update, not a checkpoint).

    On the shared file system each call is metadata operations (FSx for Lustre's scarce
    resource; every rank writes a heartbeat three times an update): a write is two, the
    temporary's create and the rename. The folder is made only when the create finds it
    missing, and the temporary removed only when the write failed (before: a mkdir, a stat and
    an unlink that found nothing, every time; counted by strace in bench-scale).

    ``check``: called with the temporary once it is written and synced, before the rename; an
    exception from it leaves ``path`` untouched (a copy verified before it takes the name)."""
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        fh = open(tmp, mode)  # noqa: SIM115  closed below, before the rename
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(tmp, mode)  # noqa: SIM115
    try:
        with fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write(path: Path | str, data: str | bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` whole or not at all (see ``atomic_writer``)."""
    with atomic_writer(path, "wb", durable) as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def atomic_copy(
    src: Path | str,
    dst: Path | str,
    overwrite: bool = True,
    check: Callable[[Path], None] | None = None,
) -> bool:
    """Make ``dst`` a whole copy of ``src`` atomically: hard link (or copy + fsync), rename.
    ``check``: called with a copy (never a link: one inode, the same bytes) before the rename;
    an exception from it leaves ``dst`` untouched."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and not overwrite:
        return False
    tmp = temp_sibling(dst)
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)  # same inode, no second write of gigabytes
        except OSError:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            if check is not None:
                check(tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(dst.parent)
    return True


# --- files the launcher and the workers exchange (their schemas: hpc_train.contract) ---------


def heartbeat_file(directory: Path, rank: int) -> Path:
    """A rank's heartbeat in the directory its launcher passed (``hpc_train.contract``)."""
    return directory / f"rank-{rank}.json"


def stacks_file(directory: Path, rank: int) -> Path:
    """Where a rank's faulthandler writes its Python stacks when its launcher asks (SIGUSR1)."""
    return directory / f"rank-{rank}.stacks"


NCCL_TRACE_PREFIX = "nccl_trace_rank_"  # PyTorch's flight recorder appends the global rank
NCCL_PIPE_PREFIX = "nccl_trace_pipe_rank_"  # ... and "<rank>.pipe" to the FIFO it makes


def nccl_trace_prefix(directory: Path) -> Path:
    """GPU ranks: where PyTorch's NCCL flight recorder dumps (this + the rank), in a heartbeat
    directory; copied into the incident dir on a hang."""
    return directory / NCCL_TRACE_PREFIX


def nccl_pipe_prefix(directory: Path) -> Path:
    return directory / NCCL_PIPE_PREFIX


def nccl_pipe(directory: Path, rank: int) -> Path:
    """The FIFO a GPU rank makes (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``): a write to it dumps."""
    return directory / f"{NCCL_PIPE_PREFIX}{rank}.pipe"


def nccl_traces(directory: Path) -> list[Path]:
    """The flight-recorder dumps in a heartbeat directory (none on CPU ranks)."""
    if not directory.is_dir():
        return []
    found = directory.glob(f"{NCCL_TRACE_PREFIX}*")
    return sorted(p for p in found if p.name.removeprefix(NCCL_TRACE_PREFIX).isdigit())


def incident_report(incident: Path, node: str) -> Path:
    """One node's report in an incident dir: its ranks' heartbeats and which gave a stack."""
    return incident / f"node-{node}.json"


def incident_reports(incident: Path) -> list[Path]:
    return sorted(incident.glob("node-*.json")) if incident.is_dir() else []


def incident_stacks(incident: Path, rank: int) -> Path:
    return incident / f"stacks-rank{rank}.txt"


@dataclass(frozen=True)
class RunDir:
    """The layout of one save dir; every path under it comes from here."""

    root: Path

    @property
    def train_log(self) -> Path:
        return self.root / TRAIN_LOG

    @property
    def profile(self) -> Path:
        """Rank 0's profile window (``HPC_TRAIN_PROFILE``; hpc_train.worker.profile), as JSON."""
        return self.root / "profile.json"

    @property
    def slurm_logs(self) -> Path:
        """Where Slurm/submitit write the per-task logs of this run."""
        return self.root / "slurm"

    @property
    def tensorboard(self) -> Path:
        """``--tensorboard``: rank 0's TensorBoard logdir, one for every start of the run."""
        return self.root / "tensorboard"

    @property
    def wandb(self) -> Path:
        """``--wandb-project``: where W&B writes (it is given the save dir, and makes this
        folder in it): one ``run-*`` or ``offline-run-*`` folder per start."""
        return self.root / "wandb"

    @property
    def tracking_record(self) -> Path:
        """Where rank 0 says it logs the run's curves (``contract.TrackingRecord``)."""
        return self.state / "tracking.json"

    @property
    def tracking_steps(self) -> Path:
        """The last step rank 0 logged under each tag, across starts (``worker.tracking``)."""
        return self.state / "tracking-steps.json"

    @property
    def preflight(self) -> Path:
        return self.root / "preflight"

    @property
    def state(self) -> Path:
        return self.root / STATE

    @property
    def checkpoint_last(self) -> Path:
        return self.root / LAST

    @property
    def ledger(self) -> Path:
        return self.state / "ledger.jsonl"

    @property
    def quarantine(self) -> Path:
        """Nodes blamed twice within the quarantine window (``hpc_train.faults.quarantine``)."""
        return self.state / "quarantine.json"

    @property
    def chaos_crash(self) -> Path:
        """``chaos JOB crash``: the update (and rank) at which the workers are to raise."""
        return self.state / "chaos-crash.json"

    @property
    def chaos_slow_save(self) -> Path:
        """``chaos JOB slow-save``: the seconds each background checkpoint write sleeps first."""
        return self.state / "chaos-slow-save.json"

    @property
    def chaos_pace(self) -> Path:
        """``chaos JOB pace``: the least seconds each update takes (the ranks sleep the rest)."""
        return self.state / "chaos-pace.json"

    @property
    def oci_bundle(self) -> Path:
        """``submit --container DIR`` on Slurm's own OCI support: the run's bundle (config.json
        and an empty rootfs of mount points, ``hpc_train.job.container.write_bundle``)."""
        return self.state / "oci"

    @property
    def audit(self) -> Path:
        """``--audit-samples``: the sample ids each rank trained (``hpc_train.runs.audit``)."""
        return self.state / "audit"

    def audit_file(self, label: str, rank: int) -> Path:
        """One rank's audit lines for one start (``label``: ``<job>-<restart>``)."""
        return self.audit / label / f"rank-{rank}.jsonl"

    def audit_plan(self, epoch: int) -> Path:
        """The sample ids of an epoch's batch plan: what the epoch is to train, once each."""
        return self.audit / f"plan-epoch{epoch}.json"

    def failure_report(self, job_id: str, restart: int, rank: int) -> Path:
        """A worker's last words: the exception that ended it, at which update."""
        return self.state / "failures" / f"{job_id}-{restart}-rank{rank}.json"

    def failure_reports(self, job_id: str, restart: int) -> list[Path]:
        return sorted((self.state / "failures").glob(f"{job_id}-{restart}-rank*.json"))

    def task_log(self, job_id: str, task: int, stream: str = "out") -> Path:
        """submitit's log of one task (``stream``: out or err); requeues append to it."""
        return self.slurm_logs / f"{job_id}_{task}_log.{stream}"

    def task_logs(self, job_id: str | None = None, stream: str = "out") -> list[Path]:
        """Every task log (of ``job_id``, or of every job of this run), by job, then task."""
        found = []
        for path in self.slurm_logs.glob(f"*_log.{stream}"):
            m = TASK_LOG_RE.fullmatch(path.name)
            if m and (job_id is None or m.group(1) == str(job_id)):
                found.append(((int(m.group(1)), int(m.group(2))), path))
        return [path for _, path in sorted(found)]

    def interval_checkpoints(self) -> list[Path]:
        """``checkpoint_E_U.pt`` files, newest update first."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(2)), p) for p in self.root.glob("checkpoint_*_*.pt")
                 if (m := INTERVAL_RE.fullmatch(p.name))]  # fmt: skip
        return [p for _, p in sorted(found, key=lambda t: t[0], reverse=True)]

    def checkpoint_files(self) -> list[Path]:
        """Every whole checkpoint file here (``checkpoint*.pt``), by name."""
        return sorted(self.root.glob("checkpoint*.pt")) if self.root.is_dir() else []

    def local_tier(self, local_root: Path) -> Path:
        """This run's directory on node-local disk under ``local_root`` (tiered saves): the save
        dir's name plus a hash of its path, so two runs never share one."""
        digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:8]
        return local_root / f"{self.root.name}-{digest}"

    def set_aside_files(self) -> list[Path]:
        """Checkpoints that failed verification, moved aside (``set_aside_name``), by name."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob(f"checkpoint*.pt{BAD}*") if p.is_file())

    def partial_writes(self) -> list[Path]:
        """Temporaries of checkpoint writes that were killed half-way."""
        return sorted(self.root.glob(".checkpoint*.tmp")) if self.root.is_dir() else []

    def stop_marker(self, job_id: str, restart: int) -> Path:
        return self.state / f"stopped-{job_id}-{restart}.json"

    def notice_pending(self, job_id: str, restart: int) -> Path:
        """A notice a launcher received in this start: the ranks that had no handler yet (torchrun
        and its workers still starting) learn of it here at their next update."""
        return self.state / f"notice-{job_id}-{restart}.json"

    def heartbeats(self, job_id: str, restart: int, node: str) -> Path:
        """One node's heartbeat directory in this start (``heartbeat_file``, ``stacks_file``):
        each launcher reads its own ranks' files only."""
        return self.state / "heartbeats" / f"{job_id}-{restart}" / node

    def heartbeat(self, job_id: str, restart: int, node: str, rank: int) -> Path:
        return heartbeat_file(self.heartbeats(job_id, restart, node), rank)

    def incident(self, job_id: str, restart: int) -> Path:
        """The evidence of a hang in this start: stacks, node reports, the suspect."""
        return self.state / "incidents" / f"{job_id}-{restart}"

    def launcher_beat(self, job_id: str, restart: int, task: int) -> Path:
        """One node's launcher, alive (``hpc_train.contract.LauncherBeat``): written every few
        seconds, read by the launcher that watches it."""
        return self.state / "launchers" / f"{job_id}-{restart}-task{task}.json"

    def node_report(self, job_id: str, restart: int, task: int) -> Path:
        """What one node's launcher found at a start (its GPUs), for task 0's decision."""
        return self.state / "nodes" / f"{job_id}-{restart}-task{task}.json"

    def node_exit(self, job_id: str, restart: int, task: int) -> Path:
        """How torchrun ended on one node in a start (``hpc_train.faults.agent_exit``)."""
        return self.state / "nodes" / f"{job_id}-{restart}-task{task}.exit.json"

    def round_verdict(self, job_id: str, restart: int) -> Path:
        """Task 0's word to every node once a start ended badly: restart in the allocation on
        these nodes, requeue, or stop (``hpc_train.contract.RoundVerdict``)."""
        return self.state / f"next-{job_id}-{restart}.json"

    @property
    def bells(self) -> Path:
        """Each node's doorbell (``hpc_core.doorbell``): a file a node, its launcher's port."""
        return self.state / "bells"

    def resume_decision(self, job_id: str, restart: int) -> Path:
        return self.state / f"resume-{job_id}-{restart}.json"


def set_aside_name(path: Path) -> Path:
    """Where a checkpoint that failed verification is moved, beside itself (never deleted):
    ``<name>.bad-<time>-<pid>``; no longer ``checkpoint*.pt``, so nothing resumes from it."""
    return path.with_name(f"{path.name}{BAD}{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
