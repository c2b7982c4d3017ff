"""Finding a run again and saying where it stands: a library for ``status``, ``logs``, ``plot``,
``metrics`` and the ``doctor``.

A run is a save dir. The user names it by its path or by a job id: ``submit`` recorded every
job it submitted in the user's index (``hpc_core.ledger.user_index``), and Slurm, while it still
remembers the job, knows where its task logs go (``<save-dir>/slurm/``). What a run did comes
from its ledger; its losses from ``train.log``; the job's state from Slurm, and from the ledger
once Slurm has forgotten the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train.contract import HELD_CAUSES, HOLD_COMMENT, Cause
from hpc_train.planning import goodput
from hpc_train.runs import follow, storage
from hpc_train.runs.named_nodes import NodeNote, node_notes


class RunNotFound(ValueError):
    """The argument names no run this user has (one line for the user)."""


@dataclass(frozen=True)
class Run:
    save_dir: Path
    job: str | None = None  # the newest job that trained it, when known
    name: str = ""
    max_update: int | None = None

    @property
    def dir(self) -> RunDir:
        return RunDir(self.save_dir)


def _is_run_dir(path: Path) -> bool:
    run = RunDir(path)
    return run.state.is_dir() or run.train_log.exists() or run.slurm_logs.is_dir()


def from_index(entry: dict[str, Any]) -> Run:
    max_update = entry.get("max_update")
    return Run(
        Path(entry["save_dir"]),
        str(entry["job"]),
        str(entry.get("name", "")),
        int(max_update) if max_update is not None else None,
    )


def resolve(arg: str, warn: Callable[[str], None] | None = None) -> Run:
    """A save dir, or a job id (the user's index, then Slurm's StdOut path for the job)."""
    path = Path(arg).expanduser()
    if path.is_dir():
        if not _is_run_dir(path):
            raise RunNotFound(f"{arg}: not a run directory (no train.log, slurm/ or .hpc-train/)")
        submitted = [e for e in ledger.read(RunDir(path).ledger, warn) if e.kind == Kind.SUBMITTED]
        last = submitted[-1] if submitted else None
        return Run(
            path.resolve(),
            last.job if last else None,
            str(last.get("name", "")) if last else "",
            int(last.get("max_update")) if last and last.get("max_update") is not None else None,
        )
    if not arg.isdigit():
        raise RunNotFound(f"{arg}: no such directory, and not a job id")
    for entry in reversed(ledger.indexed_runs(warn)):
        if str(entry["job"]) == arg:
            return from_index(entry)
    try:
        info = slurm.job_info(arg)
    except slurm.SlurmError:
        info = None
    out = Path(info.get("StdOut", "")) if info else None
    if out is not None and out.parent.name == RunDir(Path("/")).slurm_logs.name:
        return Run(out.parent.parent, arg, info.get("JobName", "") if info else "")
    raise RunNotFound(f"job {arg}: not in your run index ({ledger.user_index()}) nor in Slurm")


def user_runs(warn: Callable[[str], None] | None = None) -> list[Run]:
    return [from_index(entry) for entry in ledger.indexed_runs(warn)]


@dataclass
class RunStatus:
    run: Run
    state: str
    nodes: str
    updates: int
    max_update: int | None
    last_loss: float | None
    checkpoint_update: int | None
    checkpoint_age_s: float | None
    restarts: list[tuple[int, str]] = field(default_factory=list)
    goodput: goodput.Goodput | None = None
    eta_s: float | None = None
    nodes_named: list[NodeNote] = field(default_factory=list)
    blocked: str | None = None  # why its requeue cannot start (``blocked_requeue``)
    spares: list[str] = field(default_factory=list)  # hot spares standing by in this start
    storage: storage.SaveDir | None = None  # room, checkpoint size, last verified, set aside
    held: str | None = None  # why the job waits for ``scontrol release`` (``held_why``)

    def as_json(self) -> dict[str, Any]:
        return {
            "save_dir": str(self.run.save_dir),
            "job": self.run.job,
            "name": self.run.name,
            "state": self.state,
            "nodes": self.nodes,
            "updates": self.updates,
            "max_update": self.max_update,
            "last_loss": self.last_loss,
            "checkpoint_update": self.checkpoint_update,
            "checkpoint_age_s": self.checkpoint_age_s,
            "restarts": [{"resumed_at": u, "previous": why} for u, why in self.restarts],
            "goodput": self.goodput.as_json() if self.goodput else None,
            "eta_s": self.eta_s,
            "nodes_named": [n.as_json() for n in self.nodes_named],
            "blocked": self.blocked,
            "spares": self.spares,
            "storage": self.storage.as_json() if self.storage else None,
            "held": self.held,
        }


def slurm_states(
    jobs: Sequence[str | None], warn: Callable[[str], None] | None = None
) -> dict[str, slurm.JobState]:
    """What Slurm says of each job now, in one query for all of them; {} when there is no job
    or no controller to ask (never waited for: the ledger says then)."""
    wanted = [job for job in jobs if job is not None]
    if not wanted:
        return {}
    why = slurm.unreachable()
    try:
        if why is None:
            return slurm.job_states(wanted)
    except slurm.SlurmError as err:
        why = str(err)
    if warn is not None:
        warn(f"Slurm not asked for the jobs' states ({why}): states from the ledgers")
    return {}


COMPLETED = "COMPLETED"  # Slurm's word for a job that ended well; the ledger's ``finished``


def ledger_state(events: list[ledger.Event]) -> str:
    """The run's state by its own record (for a job Slurm has forgotten)."""
    ends = [
        e for e in events if e.kind in (Kind.FINISHED, Kind.STOPPED, Kind.STARTED, Kind.SUBMITTED)
    ]
    if not ends:
        return "UNKNOWN"
    last = ends[-1]
    if last.kind == Kind.FINISHED:
        return COMPLETED
    if last.kind == Kind.STOPPED:
        cause = last.get("cause")
        return "CANCELLED" if cause == Cause.CANCELLED else f"STOPPED ({cause})"
    return "ENDED?" if last.kind == Kind.STARTED else "SUBMITTED"


def status_of(
    run: Run,
    now: float | None = None,
    job_state: slurm.JobState | None = None,
    warn: Callable[[str], None] | None = None,
) -> RunStatus:
    """Where ``run`` stands; ``job_state`` is Slurm's word (None: ask the ledger only)."""
    now = time.time() if now is None else now
    events = ledger.read(run.dir.ledger, warn)
    summary = follow.run_summary(run.dir, run.max_update)
    alive = job_state is not None and not job_state.finished and job_state.state != "GONE"
    if job_state is not None and job_state.state != "GONE":
        state = job_state.state
    else:
        state = ledger_state(events)
    end = now if alive or not events else max(e.time for e in events)
    saves = [e for e in events if e.kind == Kind.CHECKPOINT]
    ckpt_update = int(saves[-1].get("update", 0)) if saves else None
    ckpt_age = now - saves[-1].time if saves else None
    if not saves and run.dir.checkpoint_last.exists():
        ckpt_age = now - run.dir.checkpoint_last.stat().st_mtime
    spu = seconds_per_update(events, summary.updates, end)
    max_update = run.max_update
    eta = (max_update - summary.updates) * spu if alive and spu and max_update else None
    return RunStatus(
        run=run,
        state=state,
        nodes=job_state.nodes if alive and job_state else "",
        updates=summary.updates,
        max_update=max_update,
        last_loss=summary.final_loss,
        checkpoint_update=ckpt_update,
        checkpoint_age_s=ckpt_age,
        restarts=goodput.restarts(events),
        goodput=goodput.account(events, end) if events else None,
        eta_s=eta,
        nodes_named=node_notes(events),
        blocked=blocked_requeue(events),
        held=held_why(events, job_state),
        spares=standing_by(events) if alive else [],
        storage=storage.of(run.dir, events, storage.measure(run.dir)),
    )


def blocked_requeue(events: Sequence[ledger.Event]) -> str | None:
    """Why the run's requeue cannot start (the launcher's ``requeue_blocked``: too few usable
    nodes, each named), while no start has followed it; else None."""
    for event in reversed(events):
        if event.kind == Kind.STARTED:
            return None
        if event.kind == Kind.REQUEUE_BLOCKED:
            return str(event.get("why", "too few usable nodes"))
    return None


def held_why(events: Sequence[ledger.Event], job: slurm.JobState | None) -> str | None:
    """Why the run's job is held (task 0's one line: what failed, the figures, the release
    command): the ledger's last stop if it held the job and no start followed; else, for a
    pending job, its Slurm Comment (the ledger's line may not have reached a full or read-only
    save dir). None when it is not held."""
    for event in reversed(events):
        if event.kind == Kind.STARTED:
            break
        if event.kind == Kind.STOPPED:
            if event.get("cause") in HELD_CAUSES:
                return str(event.get("why"))
            break
    if job is not None and job.state == "PENDING" and job.comment.startswith(HOLD_COMMENT):
        return job.comment.removeprefix(HOLD_COMMENT)
    return None


def standing_by(events: Sequence[ledger.Event]) -> list[str]:
    """The hot spares of the current start: the last ``started`` or ``restarted`` says."""
    for event in reversed(events):
        if event.kind in (Kind.STARTED, Kind.RESTARTED):
            return list(event.get("spares") or [])
    return []


def seconds_per_update(events: list[ledger.Event], updates: int, now: float) -> float | None:
    """Mean seconds per update of the current start (first update .. now)."""
    starts = [e for e in events if e.kind == Kind.STARTED]
    firsts = [e for e in events if e.kind == Kind.FIRST_UPDATE]
    if not starts or not firsts or firsts[-1].time < starts[-1].time:
        return None
    done = updates - int(firsts[-1].get("update", 0))
    return (now - firsts[-1].time) / done if done > 0 else None
