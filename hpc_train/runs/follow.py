"""A run's logs: train.log and the launchers' lines merged in time order, followed until the
job ends, with a progress display and the end-of-run report.

fairseq writes its metrics to the run's ``train.log`` (rank 0), the launchers theirs to the
Slurm task logs; requeues append to both. Parsing lives in ``hpc_train.runs.logparse`` (pure);
``follow`` waits on Slurm.
"""

from __future__ import annotations

import heapq
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_core.wait import Backoff
from hpc_train.planning import goodput
from hpc_train.runs import named_nodes, tracking
from hpc_train.runs.logparse import RunSummary, line_time, summarize_text


def run_summary(run: RunDir, max_update: int | None = None) -> RunSummary:
    """The summary of a run's train.log so far (its unfinished last line left for later)."""
    path = run.train_log
    return summarize_text(path.read_text(errors="replace") if path.exists() else "", max_update)


def progress_line(metrics: dict[str, float], max_update: int) -> str:
    n = int(metrics["num_updates"])
    parts = [f"update {n}/{max_update}", f"loss {metrics['loss']:.3f}"]
    if "wps" in metrics:
        parts.append(f"{metrics['wps']:.0f} words/s")
    if "lr" in metrics:
        parts.append(f"lr {metrics['lr']:.2e}")
    return " | ".join(parts)


def report(summary: RunSummary, run: RunDir, max_update: int | None, state: str) -> str:
    """The end-of-run summary: updates, losses, speed, restarts, checkpoint, the nodes the run
    blamed or found straggling, goodput, where its curves are."""

    def fmt(value: float | None, spec_: str = ".3f") -> str:
        return "n/a" if value is None else format(value, spec_)

    ckpt = run.checkpoint_last
    events = ledger.read(run.ledger)
    lines = [
        f"job {state}: {summary.updates}/{max_update if max_update else '?'} updates",
        f"  loss {fmt(summary.first_loss)} -> {fmt(summary.final_loss)}"
        f" (valid {fmt(summary.valid_loss)})",
        f"  speed {fmt(summary.mean_wps, '.0f')} words/s (mean over log intervals)",
        f"  restarts resumed at update(s): {summary.resumed_at or 'none'}",
        f"  checkpoint: {ckpt if ckpt.exists() else 'none written'}",
    ]
    lines += [f"  {note.describe()}" for note in named_nodes.node_notes(events)]
    if events:
        lines.append(f"  {goodput.account(events, max(e.time for e in events)).describe()}")
    lines += [f"  {line}" for line in tracking.lines(run)]
    return "\n".join(lines)


class LogTail:
    """Complete lines appended to a file since the last read (a partial last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_lines(self) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        return complete.decode("utf-8", errors="replace").splitlines()


def follow_job(
    job_id: str,
    log: Path | RunTail,
    on_line: Callable[[str], None],
    say: Callable[[str], None] = print,
    poll: Backoff = Backoff(0.5, 1.5, 2.0),
) -> slurm.JobState:
    """Until the job ends: say each change of its state and hand every complete line appended
    to ``log`` (a file, or a run's merged logs) to ``on_line``; return the final state. A
    controller that stops answering for a while is waited out, not taken for the job's end."""
    tail = LogTail(log) if isinstance(log, Path) else log
    last_state = [""]

    def on_poll(state: slurm.JobState) -> None:
        if state.state != last_state[0]:
            say(f"[{time.strftime('%H:%M:%S')}] job {job_id}: {state.state} {state.nodes}".rstrip())
            last_state[0] = state.state
        for line in tail.new_lines():
            on_line(line)

    state = slurm.wait_for_job(job_id, backoff=poll, on_poll=on_poll)
    for line in tail.new_lines():  # what the job wrote after the last poll
        on_line(line)
    return state


# --- a run's logs, merged: train.log and the launchers' lines from every task log ------------

LAUNCHER_RE = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\] hpc-train ")


def timed(lines: Iterable[str], since: float = 0.0) -> list[tuple[float, str]]:
    """Each line with its time; a line with none (a traceback, a continuation) keeps its
    predecessor's, so it stays with it when streams are merged."""
    out, last = [], since
    for line in lines:
        stamp = line_time(line)
        last = last if stamp is None else stamp
        out.append((last, line))
    return out


def merge(*streams: list[tuple[float, str]]) -> list[str]:
    """Lines of several time-ordered streams in one order (ties keep the streams' order)."""
    return [line for _, line in heapq.merge(*streams, key=lambda pair: pair[0])]


# A line that this many nodes' launchers say alike (the same words, numbers aside, within
# FOLD_WINDOW_S of the first) is shown once, with how many nodes said it: a 64-node start is a
# handful of lines, not 400; a line one node alone says (a blame, a hang, a left-out node) stands
# out. Fewer nodes than this (a 2-node run) keep every line as it is.
FOLD_LEAST = 4
FOLD_WINDOW_S = 120.0
SAID_BY_RE = re.compile(r"^(\[[^\]]+\] hpc-train )(\S+): (.*)$")


def fold(lines: list[str], least: int = FOLD_LEAST, window: float = FOLD_WINDOW_S) -> list[str]:
    """``lines`` (merged, in time order) with each launcher line that ``least`` or more nodes
    said alike shown once, at the first one's place, ending ``[N nodes: FIRST..LAST]``
    (pure)."""
    groups: dict[int, list[tuple[int, str]]] = {}  # a group: its lines (index, node)
    open_: dict[str, tuple[int, float]] = {}  # the words -> the open group, its first time
    member: dict[int, int] = {}  # a line's index -> its group
    for i, line in enumerate(lines):
        said = SAID_BY_RE.match(line)
        if said is None:
            continue
        key, when = re.sub(r"\d+", "#", said.group(3)), line_time(line) or 0.0
        found = open_.get(key)
        if (
            found is None
            or when - found[1] > window
            or any(n == said.group(2) for _, n in groups[found[0]])
        ):
            found = open_[key] = (i, when)
            groups[i] = []
        groups[found[0]].append((i, said.group(2)))
        member[i] = found[0]
    out = []
    for i, line in enumerate(lines):
        group = groups.get(member.get(i, -1), [])
        if len(group) < least:
            out.append(line)
        elif group[0][0] == i:
            names = sorted((n for _, n in group), key=natural)
            out.append(f"{line} [{len(group)} nodes: {names[0]}..{names[-1]}]")
    return out


def natural(name: str) -> tuple[str, int]:
    """``n10`` after ``n9``: a node name's letters, then its number."""
    found = re.match(r"(.*?)(\d*)$", name)
    assert found is not None
    return found.group(1), int(found.group(2) or 0)


class RunTail:
    """New complete lines of a run: all of ``train.log`` and the launcher lines of every task
    log (of ``job``, or of every job that trained the run), merged by time, the lines many
    nodes said alike folded (``fold``); task logs that appear later (a requeue on more nodes)
    are picked up as they appear."""

    def __init__(self, run: RunDir, job: str | None = None) -> None:
        self.run, self.job = run, job
        self.tails: dict[Path, LogTail] = {}
        self.last: dict[Path, float] = {}

    def _new(self, path: Path, keep: Callable[[str], bool]) -> list[tuple[float, str]]:
        tail = self.tails.setdefault(path, LogTail(path))
        pairs = timed([ln for ln in tail.new_lines() if keep(ln)], self.last.get(path, 0.0))
        if pairs:
            self.last[path] = pairs[-1][0]
        return pairs

    def new_lines(self) -> list[str]:
        streams = [self._new(self.run.train_log, lambda _: True)]
        for path in self.run.task_logs(self.job):
            streams.append(self._new(path, lambda ln: LAUNCHER_RE.match(ln) is not None))
        return fold(merge(*streams))


def raw_task_logs(run: RunDir, task: int | None) -> list[str]:
    """The task logs as Slurm wrote them (``task``: one task, None: all), job by job."""
    lines = []
    for path in run.task_logs():
        if task is None or path.name.split("_")[1] == str(task):
            lines.append(f"==> {path} <==")
            lines.extend(path.read_text(errors="replace").splitlines())
    return lines


START_RE = re.compile(r"hpc-train \S+: job \S+ start #(\d+)")


class Display:
    """What ``--follow`` shows of each new line: on a terminal a live progress bar (update N/max,
    loss, words/s, ETA, restarts so far) with the launcher's lines above it; piped, plain lines
    (a progress line per log interval, the launcher's lines as they are)."""

    def __init__(self, max_update: int | None, out: Callable[[str], None], bar: bool) -> None:
        self.summary = RunSummary()
        self.max_update, self.out = max_update, out
        self.restarts = 0
        self.bar: Any = None
        if bar:
            from tqdm import tqdm

            self.bar = tqdm(total=max_update, unit="update", dynamic_ncols=True)

    def __call__(self, line: str) -> None:
        metrics = self.summary.feed(line)
        start = START_RE.search(line)
        if start:
            self.restarts = max(self.restarts, int(start.group(1)) - 1)
        if metrics and self.bar is not None:
            self.bar.n = self.summary.updates
            postfix = {"loss": f"{metrics['loss']:.3f}", "restarts": self.restarts}
            if "wps" in metrics:
                postfix["words/s"] = f"{metrics['wps']:.0f}"
            self.bar.set_postfix(postfix, refresh=True)
        elif metrics:
            self.out(progress_line(metrics, self.max_update or 0))
        elif LAUNCHER_RE.match(line):
            (self.bar.write if self.bar is not None else self.out)(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def follow(
    run: RunDir,
    job_id: str,
    max_update: int | None,
    poll: Backoff = Backoff(0.5, 1.5, 2.0),
    out: Callable[[str], None] = print,
    bar: bool = False,
) -> int:
    """Show the run's progress until the job ends, then the summary; attachable at any time
    (what was written before is shown first). 0 if the job completed at max-update."""
    display = Display(max_update, out, bar)
    try:
        state = follow_job(job_id, RunTail(run, job_id), display, out, poll)
    finally:
        display.close()
    out(report(run_summary(run, max_update), run, max_update, state.state))
    summary = run_summary(run, max_update)
    reached = max_update is None or summary.updates >= max_update
    return 0 if state.state in {"COMPLETED", "GONE"} and reached else 1
