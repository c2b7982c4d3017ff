"""A run's ledger, and the user's index of runs: JSON lines, appended, never rewritten.

``<save-dir>/.hpc-train/ledger.jsonl`` (``RunDir.ledger``) gets one line per stage of a run, written
by the one process that saw it happen. What a line may say is ``Kind``: every kind of event, who
writes it and the fields it carries; writers and readers name a kind by its member
(``Kind.STARTED``), never by its string (tests/hpc_train/test_ledger_kinds.py reads the code for
it), and ``contract.py``'s table lists each kind with its writer and its readers.

Each append is one ``write`` of one whole line on a file opened with ``O_APPEND``, then fsync: a
reader sees whole lines or nothing of a line; a line cut short by a crash is skipped when read,
with a warning, as is any line that is not a JSON object (the ledger is a record, never a
reason to fail). A line that cannot be written (the save dir's file system full or read-only)
is said on stderr, whole, and the writer goes on (``record``): the ledger is never what ends a
rank or a launcher. The per-user index (``user_index()``) lists the runs ``submit`` recorded, so
``hpc-train status`` finds them again after the terminal is gone.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

SUBMIT = "the submit command"
TASK0 = "task 0's launcher"  # or task 1's, acting for a stuck task 0 (stopped, blamed, requeued)
RANK0 = "rank 0 (worker.ledger_hooks)"


class Kind(StrEnum):
    """A kind of ledger event: its name on the line (``"event"``), the process that writes it
    and the fields of its ``data`` (a writer passes no other; a reader asks for a field with
    ``Event.get``). A member is the string it names: it is written, compared and printed as is."""

    writer: str
    fields: tuple[str, ...]

    def __new__(cls, name: str, writer: str, fields: str) -> Kind:
        kind = str.__new__(cls, name)
        kind._value_ = name
        kind.writer, kind.fields = writer, tuple(fields.split())
        return kind

    # the run's first line: what was asked (--nodes, the updates, the preset, the name), and the
    # hang limits and whether the in-job watchdog is on (the doctor judges a stall by them)
    SUBMITTED = "submitted", SUBMIT, "nodes max_update preset name hang_limits watchdog"
    # a (re)start: its hosts, world, update_freq, the update it resumes at, why the previous
    # start ended (``previous``), the hot spares standing by
    STARTED = "started", TASK0, "nodes world update_freq resume_at previous spares"
    FIRST_UPDATE = "first_update", RANK0, "update"  # the first update trained in this start
    # every save: its update, the training stall (seconds), bytes, notice (a save on notice);
    # with async saves snapshot_s, write_s (copy_s: tiered, local -> save dir), once on disk
    # sha256: the digest recorded in the file as it was written (``hpc_core.integrity``)
    CHECKPOINT = "checkpoint", RANK0, "update seconds bytes notice snapshot_s write_s copy_s sha256"
    # the checkpoint a start resumed from, verified as it loaded (``worker.checkpoints``): its
    # update, the digest recorded in it (None: none, CRCs only), the verification's and the
    # load's seconds (side by side)
    VERIFIED = "verified", RANK0, "file update sha256 bytes verify_s load_s"
    # a checkpoint that failed verification, moved aside (never deleted): its name, where it
    # went, why; by task 0 choosing the resume, or by rank 0 as it loaded it
    SET_ASIDE = "set_aside", f"{TASK0} or {RANK0}", "file moved_to why"
    NOTICE = "notice", TASK0, "signal"  # USR2: preemption, the time limit, a spot notice
    # a start's bad or early end: cause (hpc_train.contract.Cause: notice, crash, hang ...), why;
    # reached, last_progress: how far the start got
    STOPPED = "stopped", TASK0, "cause why returncode error saved reached last_progress"
    # a node blamed: its machine, why, the evidence and the verdict on it, drained; rank (a hang's
    # or a crash's suspect); cause: the cause of the stop it was blamed for (a straggler evicted)
    BLAMED = "blamed", TASK0, "node machine why evidence verdict drained rank cause"
    STRAGGLER = "straggler", TASK0, "node ratio seconds compute_s median_s"  # a slow node
    REQUEUED = "requeued", TASK0, "by"  # by task 0 (a crash, a hang) or submitit (a notice)
    # a requeue that could not start: too few usable nodes (which, and why); waiting
    REQUEUE_BLOCKED = "requeue_blocked", TASK0, "why waiting"
    # an in-job restart: why, the nodes it trains on (members), left_out, its round; the hot
    # spares swapped in (spare_in) and those standing by (spares)
    RESTARTED = "restarted", TASK0, "why members left_out round spare_in spares"
    RELEASED = "released", TASK0, "node"  # a node left out, given back from the job
    GROWN = "grown", TASK0, "from to why"  # from, to: nodes; why: idle nodes Slurm would start
    FINISHED = "finished", TASK0, "why reached last_progress"  # training reached max-update


EVENTS: tuple[Kind, ...] = tuple(Kind)
INDEX_ENV = "HPC_TRAIN_STATE_HOME"  # overrides where the user's index lives (tests, shared homes)


@dataclass(frozen=True)
class Event:
    kind: str
    time: float  # seconds since the epoch
    job: str
    restart: int
    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line: a single O_APPEND write, then fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: Path, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every whole JSON-object line of ``path`` (none if it does not exist); others skipped."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            records.append(value)
        elif warn is not None:
            warn(f"{path}:{number}: not a ledger record, skipped: {line[:80]!r}")
    return records


def record(
    path: Path, kind: Kind, job: str, restart: int, when: float | None = None, **data: Any
) -> Event:
    """Append one event to the ledger at ``path`` (``when``: its time, now by default); an
    unknown kind, or a field its kind does not have (``Kind.fields``), is refused before
    anything is written."""
    if kind not in EVENTS:
        raise ValueError(f"unknown ledger event {kind!r} (one of {', '.join(EVENTS)})")
    unknown = sorted(set(data) - set(next(k.fields for k in EVENTS if k == kind)))
    if unknown:
        raise ValueError(f"ledger event {kind} has no field {', '.join(unknown)}")
    event = Event(kind, time.time() if when is None else when, str(job), int(restart), data)
    line = {"event": kind, "time": event.time, "job": event.job, "restart": restart, **data}
    try:
        append_line(path, line)
    except OSError as err:  # the save dir's file system full or read-only: said, not fatal
        print(f"hpc-train: ledger not written ({path}: {type(err).__name__}: {err}); the event: "
              f"{json.dumps(line, sort_keys=True)}", file=sys.stderr, flush=True)  # fmt: skip
    return event


def read(path: Path, warn: Callable[[str], None] | None = None) -> list[Event]:
    """The ledger's events in the order they were written; unreadable lines skipped."""
    events = []
    for raw in read_lines(path, warn):
        kind, when = raw.pop("event", None), raw.pop("time", None)
        if kind not in EVENTS or not isinstance(when, int | float):
            if warn is not None:
                warn(f"{path}: a record without a known event and time, skipped: {kind!r}")
            continue
        job, restart = str(raw.pop("job", "")), raw.pop("restart", 0)
        events.append(Event(kind, float(when), job, int(restart or 0), raw))
    return events


def user_index() -> Path:
    """The user's run index: $HPC_TRAIN_STATE_HOME, else $XDG_STATE_HOME/hpc-train, else
    ~/.local/state/hpc-train; the file is ``runs.jsonl`` in it."""
    base = os.environ.get(INDEX_ENV)
    if not base:
        xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        base = str(Path(xdg) / "hpc-train")
    return Path(base) / "runs.jsonl"


def index_run(job: str, save_dir: Path, name: str, max_update: int) -> None:
    """Remember a submitted run in the user's index (one line; the newest line for a job wins)."""
    append_line(
        user_index(),
        {
            "job": str(job),
            "save_dir": str(save_dir),
            "name": name,
            "max_update": max_update,
            "time": time.time(),
        },
    )


def indexed_runs(warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The user's runs, oldest first, one per job id."""
    runs: dict[str, dict[str, Any]] = {}
    for entry in read_lines(user_index(), warn):
        if "job" in entry and "save_dir" in entry:
            runs.pop(str(entry["job"]), None)
            runs[str(entry["job"])] = entry
    return list(runs.values())
