"""Goodput from a run's ledger: ETTR and where the rest of the wall time went. Pure.

ETTR (effective training time ratio) = productive training time / wall time, wall time counted
from submission to the end (or to now, for a run still going). The rest, by cause:

    queue         waiting for nodes: submission -> first start, and each requeue -> next start
    start-up      a start -> its first update (imports, rendezvous, data, checkpoint load)
    checkpoints   the training stall of every save (periodic, end of epoch, on notice)
    recomputed    updates trained again after resuming from an older checkpoint, at the run's
                  mean seconds per update (0 when every stop saved on notice): from the ledger,
                  the update a start reached (its end event's ``reached``) against the update
                  the next start resumed at (``started``'s ``resume_at``)
    no progress   from a start's last progress (its end event's ``last_progress``: the newest
                  heartbeat of any rank) to its end: a hang's allowance and evidence, a crash's
                  detection, a slow or stuck exit. Never productive.
    interrupted   a start that ended without a stop recorded (node failure, a killed step):
                  from its last recorded progress to the next start, counted with the queue
    in-job restart  a round's end -> the next round's start inside the same allocation
                  (``--restart-in-job``, ``--spares``): the verdict, the drain, the nodes'
                  hand-over; no queue was waited for
    storage       a start the save dir's storage ended (``Cause.STORAGE``: full, over quota,
                  read-only, failing): from its last progress to its end, then the job held
                  until ``scontrol release`` and its next start (counted here, not as queue
                  or no progress)

Every second of the wall is in exactly one of: queue, in-job restart, start-up, checkpoints,
recomputed, no progress, storage, productive (``Goodput.parts`` sums to ``wall_s``).

Each start is one segment of the ledger: ``started`` .. (``first_update``) .. its end, which is
the ``stopped``/``finished`` event of that start, else the next start, else now.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from hpc_core.ledger import Event, Kind
from hpc_train.contract import IN_JOB_RESTART, Cause

ENDS = (Kind.STOPPED, Kind.FINISHED)
REQUEUED = "requeued"
REQUEUED_WHY = (
    "requeued (by Slurm, with no notice: the start ended on SIGTERM and the job started "
    "again): last periodic checkpoint"
)


@dataclass(frozen=True)
class Segment:
    restart: int
    started: float
    first_update: float | None
    ended: float
    cause: str  # how it ended: notice, crash, cancelled, requeued, finished, unknown, running
    checkpoint_s: float
    resume_at: int | None = None  # the update this start resumed from
    reached: int | None = None  # the last update any rank completed (task 0's word at the end)
    last_progress: float | None = None  # when it was completed
    in_job: bool = False  # an in-job restart: it followed the previous start in its allocation

    @property
    def progress_end(self) -> float:
        """The end of this start's training: its last progress, if the launcher said it."""
        if self.last_progress is None or self.first_update is None:
            return self.ended
        return min(self.ended, max(self.first_update, self.last_progress))


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    queue_s: float
    startup_s: float
    checkpoint_s: float
    recomputed_s: float
    productive_s: float
    restarts: int
    no_progress_s: float = 0.0
    recomputed_updates: int = 0
    in_job_restart_s: float = 0.0
    storage_s: float = 0.0

    @property
    def parts(self) -> dict[str, float]:
        """Where the wall time went: the causes and the productive rest (sums to ``wall_s``)."""
        return {
            "queue": self.queue_s, "in-job restart": self.in_job_restart_s,
            "start-up": self.startup_s, "checkpoints": self.checkpoint_s,
            "recomputed": self.recomputed_s, "no progress": self.no_progress_s,
            "storage": self.storage_s, "productive": self.productive_s,
        }  # fmt: skip

    @property
    def ettr(self) -> float | None:
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    def as_json(self) -> dict[str, float | int | None]:
        return {**{k: round(v, 3) for k, v in asdict(self).items()}, "ettr": self.ettr}

    def describe(self) -> str:
        ettr = "n/a" if self.ettr is None else f"{self.ettr:.0%}"
        return (
            f"ETTR {ettr} of {self.wall_s:.0f} s: queue {self.queue_s:.0f} s, "
            f"start-up {self.startup_s:.0f} s, checkpoints {self.checkpoint_s:.0f} s, "
            f"recomputed {self.recomputed_s:.0f} s ({self.recomputed_updates} updates), "
            f"no progress {self.no_progress_s:.0f} s"
            + (f", in-job restarts {self.in_job_restart_s:.0f} s" if self.in_job_restart_s else "")
            + (f", storage {self.storage_s:.0f} s" if self.storage_s else "")
        )


def segments(events: Sequence[Event], now: float) -> list[Segment]:
    """One segment per ``started`` event, in order (events of other jobs' starts included: a
    save dir resumed by a new job is one run)."""
    ordered = sorted(events, key=lambda e: e.time)
    starts = [i for i, e in enumerate(ordered) if e.kind == Kind.STARTED]
    out = []
    for n, i in enumerate(starts):
        start = ordered[i]
        stop = starts[n + 1] if n + 1 < len(starts) else len(ordered)
        inside = ordered[i + 1 : stop]
        first = next((e.time for e in inside if e.kind == Kind.FIRST_UPDATE), None)
        end = next((e for e in inside if e.kind in ENDS), None)
        if end is not None:
            ended, cause = end.time, str(end.get("cause", end.kind))
        elif n + 1 < len(starts):
            ended = max([start.time, *(e.time for e in inside)])
            cause = "unknown"
        else:
            ended, cause = now, "running"
        if (
            cause == Cause.CANCELLED
            and n + 1 < len(starts)
            and same_job(start, ordered[starts[n + 1]])
        ):
            cause = REQUEUED
        saves = sum(float(e.get("seconds", 0.0)) for e in inside if e.kind == Kind.CHECKPOINT)
        said = end.data if end is not None else {}
        out.append(Segment(
            start.restart, start.time, first, ended, cause, saves,
            _int(start.get("resume_at")), _int(said.get("reached")),
            _float(said.get("last_progress")),
            str(start.get("previous", "")).startswith(IN_JOB_RESTART),
        ))  # fmt: skip
    return out


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _recomputed(segs: Sequence[Segment]) -> int:
    """Updates trained twice: each start's reached update past the next start's resume point."""
    return sum(
        max(0, a.reached - b.resume_at)
        for a, b in itertools.pairwise(segs)
        if a.reached is not None and b.resume_at is not None
    )


def _seconds_per_update(segs: Sequence[Segment]) -> float | None:
    """The run's mean training seconds per update, from the starts that said how far they got."""
    spans = [
        (s.progress_end - s.first_update, s.reached - (s.resume_at or 0))
        for s in segs
        if s.first_update is not None and s.reached is not None
    ]
    updates = sum(n for _, n in spans)
    return sum(t for t, _ in spans) / updates if updates > 0 else None


def account(
    events: Sequence[Event],
    now: float,
    recomputed_updates: int | None = None,
    seconds_per_update: float | None = None,
) -> Goodput:
    """The goodput of a run from its ledger; ``now`` ends a run still going (pass the time of
    its last event for a run that is over). ``recomputed_updates`` and ``seconds_per_update``
    override what the ledger says (a run whose launcher did not record its progress)."""
    segs = segments(events, now)
    submitted = [e.time for e in events if e.kind == Kind.SUBMITTED]
    begin = min([*submitted, *(s.started for s in segs)], default=now)
    end = max(segs[-1].ended if segs else now, begin)
    startup = sum(((s.first_update or s.ended) - s.started) for s in segs)
    training = sum(s.progress_end - s.first_update for s in segs if s.first_update is not None)
    stalled = sum(s.ended - s.progress_end for s in segs
                  if s.first_update is not None and s.cause != Cause.STORAGE)  # fmt: skip
    held = _held(segs)
    checkpoint = sum(s.checkpoint_s for s in segs)
    redone = _recomputed(segs) if recomputed_updates is None else recomputed_updates
    per_update = _seconds_per_update(segs) if seconds_per_update is None else seconds_per_update
    recomputed = min(redone * (per_update or 0.0), max(0.0, training - checkpoint))
    busy = sum(s.ended - s.started for s in segs)
    handover = sum(max(0.0, b.started - a.ended) for a, b in itertools.pairwise(segs) if b.in_job)
    productive = max(0.0, training - checkpoint - recomputed)
    return Goodput(
        wall_s=end - begin,
        queue_s=max(0.0, (end - begin) - busy - handover - held),
        in_job_restart_s=handover,
        startup_s=startup,
        checkpoint_s=checkpoint,
        recomputed_s=recomputed,
        productive_s=productive,
        restarts=max(0, len(segs) - 1),
        no_progress_s=stalled,
        recomputed_updates=redone,
        storage_s=held + sum(s.ended - s.progress_end for s in segs
                             if s.first_update is not None and s.cause == Cause.STORAGE),
    )  # fmt: skip


def _held(segs: Sequence[Segment]) -> float:
    """The seconds between a start the storage ended and the next start: the job held."""
    return sum(max(0.0, b.started - a.ended) for a, b in itertools.pairwise(segs)
               if a.cause == Cause.STORAGE and not b.in_job)  # fmt: skip


def restarts(events: Sequence[Event]) -> list[tuple[int, str]]:
    """(update resumed at, why the previous start ended) for every restart, from the ledger.

    A start that ended on a SIGTERM with no notice before it is recorded as cancelled (that is
    what ``scancel`` looks like to the launcher), but ``scontrol requeue`` looks the same: when
    the same Slurm job started again, it was a requeue, whatever the previous start said."""
    ordered = sorted(events, key=lambda e: e.time)
    starts = [e for e in ordered if e.kind == Kind.STARTED]
    ends = {(e.job, e.restart): e for e in ordered if e.kind in ENDS}
    found = []
    for before, start in itertools.pairwise(starts):
        why = str(start.get("previous", ""))
        end = ends.get((before.job, before.restart))
        said = end.get("cause", end.kind) if end is not None else None
        if said == Cause.CANCELLED and same_job(before, start):
            why = REQUEUED_WHY
        found.append((int(start.get("resume_at", 0)), why))
    return found


def same_job(before: Event, after: Event) -> bool:
    """Is ``after`` a later start of the Slurm job of ``before`` (a requeue, or an in-job
    restart, whose ids are ``<job>.<round>``)? A cancelled job never starts again."""
    return before.job.split(".")[0] == after.job.split(".")[0] and after.restart >= before.restart


def short_cause(why: str) -> str:
    """The class of a start's end from the launcher's words: "saved on notice (SIGUSR2) at
    update 60" -> "saved on notice"; "no save on notice (node failure, ...): ..." -> "no save
    on notice"."""
    return why.split(" (")[0].split(":")[0].strip() or "unknown"
