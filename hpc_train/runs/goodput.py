"""Goodput from a run's ledger: ETTR and where the rest of the wall time went. Pure.

ETTR (effective training time ratio) = productive training time / wall time, wall time counted
from submission to the end (or to now, for a run still going). The rest, by cause:

    queue         waiting for nodes: submission -> first start, and each requeue -> next start
    start-up      a start -> its first update (imports, rendezvous, data, checkpoint load)
    checkpoints   the training stall of every save (periodic, end of epoch, on notice)
    recomputed    updates trained again after resuming from an older checkpoint, at the run's
                  mean seconds per update (0 when every stop saved on notice)
    interrupted   a start that ended without a stop recorded (node failure, a killed step):
                  from its last recorded progress to the next start, counted with the queue

Each start is one segment of the ledger: ``started`` .. (``first_update``) .. its end, which is
the ``stopped``/``finished`` event of that start, else the next start, else now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from hpc_core.ledger import Event

ENDS = ("stopped", "finished")


@dataclass(frozen=True)
class Segment:
    restart: int
    started: float
    first_update: float | None
    ended: float
    cause: str  # how this start ended: notice, crash, cancelled, finished, unknown, running
    checkpoint_s: float


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    queue_s: float
    startup_s: float
    checkpoint_s: float
    recomputed_s: float
    productive_s: float
    restarts: int

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
            f"recomputed {self.recomputed_s:.0f} s"
        )


def segments(events: Sequence[Event], now: float) -> list[Segment]:
    """One segment per ``started`` event, in order (events of other jobs' starts included: a
    save dir resumed by a new job is one run)."""
    ordered = sorted(events, key=lambda e: e.time)
    starts = [i for i, e in enumerate(ordered) if e.kind == "started"]
    out = []
    for n, i in enumerate(starts):
        start = ordered[i]
        stop = starts[n + 1] if n + 1 < len(starts) else len(ordered)
        inside = ordered[i + 1 : stop]
        first = next((e.time for e in inside if e.kind == "first_update"), None)
        end = next((e for e in inside if e.kind in ENDS), None)
        if end is not None:
            ended, cause = end.time, str(end.get("cause", end.kind))
        elif n + 1 < len(starts):
            ended = max([start.time, *(e.time for e in inside)])
            cause = "unknown"
        else:
            ended, cause = now, "running"
        saves = sum(float(e.get("seconds", 0.0)) for e in inside if e.kind == "checkpoint")
        out.append(Segment(start.restart, start.time, first, ended, cause, saves))
    return out


def account(
    events: Sequence[Event],
    now: float,
    recomputed_updates: int = 0,
    seconds_per_update: float | None = None,
) -> Goodput:
    """The goodput of a run from its ledger; ``now`` ends a run still going (pass the time of
    its last event for a run that is over)."""
    segs = segments(events, now)
    submitted = [e.time for e in events if e.kind == "submitted"]
    begin = min([*submitted, *(s.started for s in segs)], default=now)
    end = max(segs[-1].ended if segs else now, begin)
    startup = sum(((s.first_update or s.ended) - s.started) for s in segs)
    training = sum(s.ended - s.first_update for s in segs if s.first_update is not None)
    checkpoint = sum(s.checkpoint_s for s in segs)
    recomputed = recomputed_updates * (seconds_per_update or 0.0)
    busy = sum(s.ended - s.started for s in segs)
    productive = max(0.0, training - checkpoint - recomputed)
    return Goodput(
        wall_s=end - begin,
        queue_s=max(0.0, (end - begin) - busy),
        startup_s=startup,
        checkpoint_s=checkpoint,
        recomputed_s=recomputed,
        productive_s=productive,
        restarts=max(0, len(segs) - 1),
    )


def restarts(events: Sequence[Event]) -> list[tuple[int, str]]:
    """(update resumed at, why the previous start ended) for every restart, from the ledger."""
    starts = [e for e in sorted(events, key=lambda e: e.time) if e.kind == "started"]
    return [(int(e.get("resume_at", 0)), str(e.get("previous", ""))) for e in starts[1:]]


def short_cause(why: str) -> str:
    """The class of a start's end from the launcher's words: "saved on notice (SIGUSR2) at
    update 60" -> "saved on notice"; "no save on notice (node failure, ...): ..." -> "no save
    on notice"."""
    return why.split(" (")[0].split(":")[0].strip() or "unknown"
