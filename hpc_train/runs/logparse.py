"""Reading fairseq's training log: every format it prints, summed up into one ``RunSummary``.

Pure: lines in, numbers out (no files, no Slurm). The formats, as fairseq's progress bars
(``fairseq/logging/progress_bar.py``) write them through its log format
``%(asctime)s | %(levelname)s | %(name)s | %(message)s``:

    --log-format json     ... | train_inner | {"epoch": 1, "update": 0.323, "loss": "13.2", ..., "num_updates": "10", ...}
                          ... | train | {"epoch": 1, "train_loss": "13", ..., "train_num_updates": "31", ...}
                          ... | valid | {"epoch": 1, "valid_loss": "12.9", ..., "valid_num_updates": "31"}
    --log-format simple   ... | train_inner | epoch 001:     10 / 31 loss=13.2, ..., num_updates=10, ...
    (and tqdm's prints)   ... | train | epoch 001 | loss 13 | ... | num_updates 31 | ...
                          ... | valid | epoch 001 | valid on 'valid' subset | loss 12.9 | ... | num_updates 31

and fairseq's ``Loaded checkpoint PATH (epoch E @ U updates)`` on each (re)start. Lines from
several ranks may be interleaved (also with ``srun --label``'s ``N:`` prefix): an update logged
twice in one stretch of training counts once. After a resume at update r, the updates above r
that the interrupted stretch had reached are trained again: ``recomputed_updates``. Anything
else is ignored, and so is a line cut short: a JSON object cut anywhere does not parse, and a log
still being written is read through ``complete_lines`` (its unterminated last line waits).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

RESUME_RE = re.compile(r"[Ll]oaded checkpoint (\S+) \(epoch (\d+) @ (\d+) updates\)")
# checkpoint_utils, on each save: "Saved checkpoint PATH (epoch 1 @ 30 updates, score None) ..."
SAVED_RE = re.compile(r"Saved checkpoint \S+ \(epoch \d+ @ (\d+) updates")
# fairseq_cli.train: "Stopping training due to num_updates: 30 >= max_update: 30"
STOPPING_RE = re.compile(r"num_updates: (\d+) >= max_update: (\d+)")
STAMP_RE = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[,.](\d{1,6}))?")
# srun --label ("3: "), torchrun's --tee/log prefixes ("[default3]:", "[rank3]:")
RANK_RE = re.compile(r"^\s*(?:\[(?:rank|default)?(\d+)\]:|(\d+):(?=\s))")
# SimpleProgressBar.log: "{prefix}:  {i:5d} / {size:d} {k=v, k=v, ...}"
SIMPLE_INTERVAL_RE = re.compile(r"epoch \d+:\s+\d+ / \d+ (.*)$")
SIMPLE_FIELD_RE = re.compile(r"(\w+)=([^,\s]+)(?=, |$)")
EPOCH_SEGMENT_RE = re.compile(r"epoch \d+")
SUBSET_SEGMENT_RE = re.compile(r"valid on '([^']+)' subset")
PIPE_FIELD_RE = re.compile(r"(\w+) (\S+)")
TAG_RE = re.compile(r"\|\s*([\w.]+)\s*\|\s*$")  # the logger name just before the JSON object
# Two "Loaded checkpoint" lines for the same update this close together are one start logged by
# two ranks (a real restart takes a requeue and a fresh Python: longer than this).
SAME_START_S = 30.0


def parse_metrics(line: str) -> dict[str, float] | None:
    """The JSON metrics object on a fairseq log line (any prefix), numbers as floats."""
    raw = json_object(line)
    if raw is None:
        return None
    out: dict[str, float] = {}
    for key, value in raw.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def json_object(line: str) -> dict[str, Any] | None:
    """The JSON object that ends a log line, or None. A line glued to the cut-off remains of
    another (a crash mid-write) still yields its own object."""
    starts = [line.find("{")]
    if (glued := line.rfind("| {")) > starts[0]:
        starts.append(glued + 2)
    for start in starts:
        if start < 0:
            continue
        try:
            raw = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(raw, dict):
            return raw
    return None


def _floats(pairs: Iterable[tuple[str, str]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in pairs:
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class Record:
    """One metrics line: ``kind`` is train_inner (a log interval), train (end of epoch) or
    valid; ``metrics`` use fairseq's plain names (loss, num_updates, wps, ...) whatever the
    format, with the train_/valid_ prefix of the JSON end-of-epoch lines taken off."""

    kind: str
    metrics: dict[str, float]

    @property
    def update(self) -> int | None:
        n = self.metrics.get("num_updates")
        return None if n is None else int(n)

    @property
    def loss(self) -> float | None:
        return self.metrics.get("loss")


def _unprefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    cut = len(prefix) + 1
    return {k[cut:]: v for k, v in metrics.items() if k.startswith(prefix + "_")}


def parse_json_record(line: str) -> Record | None:
    metrics = parse_metrics(line)
    if not metrics:
        return None
    if "train_num_updates" in metrics or "train_loss" in metrics:
        return Record("train", _unprefixed(metrics, "train"))
    if "loss" in metrics and "num_updates" in metrics:
        return Record("train_inner", metrics)
    tag = TAG_RE.search(line[: line.find("{")])
    for subset in (tag.group(1) if tag else "", "valid"):
        if subset and subset not in {"train", "train_inner"} and f"{subset}_loss" in metrics:
            return Record("valid", _unprefixed(metrics, subset))
    return None


def parse_simple_record(line: str) -> Record | None:
    interval = SIMPLE_INTERVAL_RE.search(line)
    if interval:
        metrics = _floats(SIMPLE_FIELD_RE.findall(interval.group(1)))
        return Record("train_inner", metrics) if "loss" in metrics else None
    segments = [s.strip() for s in line.split(" | ")]
    at = next((i for i, s in enumerate(segments) if EPOCH_SEGMENT_RE.fullmatch(s)), None)
    if at is None:
        return None
    kind, pairs = "train", []
    for segment in segments[at + 1 :]:
        if SUBSET_SEGMENT_RE.fullmatch(segment):
            kind = "valid"
        elif field_ := PIPE_FIELD_RE.fullmatch(segment):
            pairs.append((field_.group(1), field_.group(2)))
    metrics = _floats(pairs)
    return Record(kind, metrics) if "loss" in metrics else None


def parse_record(line: str) -> Record | None:
    """The metrics a line carries, in any of fairseq's formats; None for any other line."""
    if "{" in line and (record := parse_json_record(line)) is not None:
        return record
    return parse_simple_record(line)


def line_rank(line: str) -> int | None:
    """The rank a launcher's label puts in front of a line (srun --label, torchrun), if any."""
    match = RANK_RE.match(line)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def line_time(line: str) -> float | None:
    """Seconds since the epoch of a line's first stamp: the launcher's ``...Z`` stamps are UTC,
    fairseq's (``%(asctime)s``) the node's local time, so the two merge in one order."""
    match = STAMP_RE.search(line)
    if match is None:
        return None
    stamp = datetime.strptime(match.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S")
    if line[match.end() : match.end() + 1] == "Z":
        stamp = stamp.replace(tzinfo=UTC)
    fraction = float(f"0.{match.group(2)}") if match.group(2) else 0.0
    return stamp.timestamp() + fraction


@dataclass
class LoggedRestart:
    """One (re)start from a checkpoint: the update it resumed at, and how many updates above it
    the interrupted stretch had reached (trained again now)."""

    update: int
    recomputed: int
    checkpoint: str = ""
    time: float | None = None
    ranks: set[int | None] = field(default_factory=set)


@dataclass
class RunSummary:
    updates: int = 0  # the highest update reached (any line that says one)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (num_updates, loss), log order
    wps: list[float] = field(default_factory=list)  # words/s of each log interval
    valid_loss: float | None = None  # at the highest update validated
    resumed_at: list[int] = field(default_factory=list)  # num_updates of each resume
    max_update: int | None = None  # given, or read from fairseq's "Stopping training" line
    valid_losses: list[tuple[int, float]] = field(default_factory=list)
    epoch_losses: list[tuple[int, float]] = field(default_factory=list)  # end-of-epoch train_loss
    epoch_wps: list[float] = field(default_factory=list)
    resumes: list[LoggedRestart] = field(default_factory=list)
    # this stretch of training (since the last resume): updates logged, the highest reached
    _logged: set[int] = field(default_factory=set, repr=False)
    _validated: set[int] = field(default_factory=set, repr=False)
    _reached: int = field(default=0, repr=False)
    _valid_at: int = field(default=-1, repr=False)
    _stretch: int = field(default=0, repr=False)  # index in losses where this stretch begins

    @property
    def first_loss(self) -> float | None:
        losses = self.losses or self.epoch_losses
        return losses[0][1] if losses else None

    @property
    def final_loss(self) -> float | None:
        """The loss at the highest update of the last stretch of training (lines from several
        ranks may come out of order); an end-of-epoch mean only if no interval was logged."""
        if stretch := self.losses[self._stretch :]:
            return max(stretch, key=lambda point: point[0])[1]
        losses = self.losses or self.epoch_losses
        return losses[-1][1] if losses else None

    @property
    def mean_wps(self) -> float | None:
        """Mean words/s over the log intervals (over the end-of-epoch lines if none was logged)."""
        wps = self.wps or self.epoch_wps
        return sum(wps) / len(wps) if wps else None

    @property
    def recomputed_updates(self) -> int:
        return sum(r.recomputed for r in self.resumes)

    @property
    def finished(self) -> bool:
        return self.max_update is not None and self.updates >= self.max_update

    def curve(self) -> list[tuple[int, float]]:
        """Training loss per update, the last stretch's value where an update was trained twice."""
        return sorted(dict(self.losses).items())

    def as_json(self) -> dict[str, Any]:
        return {
            "updates": self.updates,
            "max_update": self.max_update,
            "finished": self.finished,
            "first_loss": self.first_loss,
            "final_loss": self.final_loss,
            "valid_loss": self.valid_loss,
            "wps_mean": self.mean_wps,
            "resumed_at": list(self.resumed_at),
            "recomputed_updates": self.recomputed_updates,
            "restarts": [{"update": r.update, "recomputed": r.recomputed} for r in self.resumes],
        }

    def _reach(self, n: int) -> None:
        self.updates = max(self.updates, n)
        self._reached = max(self._reached, n)

    def _same_start(self, at: int, rank: int | None, t: float | None) -> bool:
        """Whether a resume line repeats the last resume, logged by another rank."""
        last = self.resumes[-1] if self.resumes else None
        if last is None or last.update != at:
            return False
        if rank is not None:  # labelled lines: one line per rank and start
            return rank not in last.ranks
        if t is not None and last.time is not None:
            return abs(t - last.time) <= SAME_START_S
        return self._reached <= at  # no rank trains past it before every rank has loaded it

    def _resume(self, line: str, match: re.Match[str]) -> None:
        at, rank, t = int(match.group(3)), line_rank(line), line_time(line)
        if self._same_start(at, rank, t):
            self.resumes[-1].ranks.add(rank)
            return
        self.resumes.append(
            LoggedRestart(at, max(0, self._reached - at), match.group(1), t, {rank})
        )
        self.resumed_at.append(at)
        self._reached = at
        self._stretch = len(self.losses)
        self._logged = {n for n in self._logged if n <= at}
        self._validated = {n for n in self._validated if n <= at}
        self.updates = max(self.updates, at)

    def feed(self, line: str) -> dict[str, float] | None:
        """Account for one log line; return its training metrics if it carried a log interval
        not already counted (so a caller prints each update once)."""
        resumed = RESUME_RE.search(line)
        if resumed:
            self._resume(line, resumed)
            return None
        for regex in (SAVED_RE, STOPPING_RE):
            if found := regex.search(line):
                self._reach(int(found.group(1)))
                if regex is STOPPING_RE and self.max_update is None:
                    self.max_update = int(found.group(2))
                return None
        record = parse_record(line)
        if record is None:
            return None
        if record.kind == "train":  # fairseq's end-of-epoch line: the update reached, logged
            if record.update is not None:  # at a log interval or not
                self._reach(record.update)
                if record.loss is not None:
                    self.epoch_losses.append((record.update, record.loss))
            if "wps" in record.metrics:
                self.epoch_wps.append(record.metrics["wps"])
            return None
        if record.kind == "valid":
            self._valid(record)
            return None
        n, loss = record.update, record.loss
        if n is None or loss is None or n in self._logged:  # no update, or another rank's copy
            return None
        self._logged.add(n)
        self._reach(n)
        self.losses.append((n, loss))
        if "wps" in record.metrics:
            self.wps.append(record.metrics["wps"])
        return record.metrics

    def _valid(self, record: Record) -> None:
        n = record.update if record.update is not None else self._reached
        if record.loss is None or n in self._validated:
            return
        self._validated.add(n)
        self._reach(n)
        self.valid_losses.append((n, record.loss))
        if n >= self._valid_at:
            self._valid_at, self.valid_loss = n, record.loss


def summarize(lines: Iterable[str], max_update: int | None = None) -> RunSummary:
    summary = RunSummary(max_update=max_update)
    for line in lines:
        summary.feed(line)
    return summary


def complete_lines(text: str) -> list[str]:
    """The lines of a log being written, without a last line not yet ended by a newline."""
    return text[: text.rfind("\n") + 1].splitlines()


def summarize_text(text: str, max_update: int | None = None) -> RunSummary:
    return summarize(complete_lines(text), max_update)
