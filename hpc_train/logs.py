"""Reading what a run wrote: fairseq's JSON metric lines, and following a job until it ends.

fairseq writes one JSON object per log interval to the run's ``train.log`` (``--log-format
json``); restarts append to the same file. Parsing is pure; ``follow`` waits on Slurm.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hpc_core import slurm
from hpc_core.wait import Backoff
from hpc_train.spec import JobSpec

RESUME_RE = re.compile(r"[Ll]oaded checkpoint (\S+) \(epoch (\d+) @ (\d+) updates\)")


def parse_metrics(line: str) -> dict[str, float] | None:
    """The JSON metrics object on a fairseq log line (any prefix), numbers as floats."""
    start = line.find("{")
    if start < 0:
        return None
    try:
        raw = json.loads(line[start:])
    except json.JSONDecodeError:
        return None
    if not isinstance(raw, dict):
        return None
    out: dict[str, float] = {}
    for key, value in raw.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


@dataclass
class RunSummary:
    updates: int = 0
    losses: list[tuple[int, float]] = field(default_factory=list)  # (num_updates, loss)
    wps: list[float] = field(default_factory=list)
    valid_loss: float | None = None
    resumed_at: list[int] = field(default_factory=list)  # num_updates of each resume

    @property
    def first_loss(self) -> float | None:
        return self.losses[0][1] if self.losses else None

    @property
    def final_loss(self) -> float | None:
        return self.losses[-1][1] if self.losses else None

    @property
    def mean_wps(self) -> float | None:
        return sum(self.wps) / len(self.wps) if self.wps else None

    def feed(self, line: str) -> dict[str, float] | None:
        """Account for one log line; return its training metrics if it carried any."""
        resumed = RESUME_RE.search(line)
        if resumed:
            self.resumed_at.append(int(resumed.group(3)))
        metrics = parse_metrics(line)
        if not metrics:
            return None
        if "train_num_updates" in metrics:  # fairseq's end-of-epoch line: the update reached,
            self.updates = max(self.updates, int(metrics["train_num_updates"]))  # logged or not
            return None
        if "valid_loss" in metrics:
            self.valid_loss = metrics["valid_loss"]
            return None
        if "loss" in metrics and "num_updates" in metrics:
            n = int(metrics["num_updates"])
            self.updates = max(self.updates, n)
            self.losses.append((n, metrics["loss"]))
            if "wps" in metrics:
                self.wps.append(metrics["wps"])
            return metrics
        return None


def summarize(lines: Iterable[str]) -> RunSummary:
    summary = RunSummary()
    for line in lines:
        summary.feed(line)
    return summary


def progress_line(metrics: dict[str, float], max_update: int) -> str:
    n = int(metrics["num_updates"])
    parts = [f"update {n}/{max_update}", f"loss {metrics['loss']:.3f}"]
    if "wps" in metrics:
        parts.append(f"{metrics['wps']:.0f} words/s")
    if "lr" in metrics:
        parts.append(f"lr {metrics['lr']:.2e}")
    return " | ".join(parts)


def report(summary: RunSummary, spec: JobSpec, state: str) -> str:
    def fmt(value: float | None, spec_: str = ".3f") -> str:
        return "n/a" if value is None else format(value, spec_)

    ckpt = spec.run_dir.checkpoint_last
    lines = [
        f"job {state}: {summary.updates}/{spec.updates} updates",
        f"  loss {fmt(summary.first_loss)} -> {fmt(summary.final_loss)}"
        f" (valid {fmt(summary.valid_loss)})",
        f"  speed {fmt(summary.mean_wps, '.0f')} words/s (mean over log intervals)",
        f"  restarts resumed at update(s): {summary.resumed_at or 'none'}",
        f"  checkpoint: {ckpt if ckpt.exists() else 'none written'}",
    ]
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
    log: Path,
    on_line: Callable[[str], None],
    say: Callable[[str], None] = print,
    poll: Backoff = Backoff(0.5, 1.5, 2.0),
) -> slurm.JobState:
    """Until the job ends: say each change of its state and hand every complete line appended
    to ``log`` to ``on_line``; return the final state. A controller that stops answering for a
    while is waited out, not taken for the job's end."""
    tail = LogTail(log)
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


def follow(
    spec: JobSpec,
    job_id: str,
    poll: Backoff = Backoff(0.5, 1.5, 2.0),
    out: Callable[[str], None] = print,
) -> int:
    """Print progress until the job ends; then the summary. 0 if it completed at max-update."""
    summary = RunSummary()

    def on_line(line: str) -> None:
        metrics = summary.feed(line)
        if metrics:
            out(progress_line(metrics, spec.updates))

    state = follow_job(job_id, spec.run_dir.train_log, on_line, out, poll)
    out(report(summary, spec, state.state))
    ok = state.state in {"COMPLETED", "GONE"} and summary.updates >= spec.updates
    return 0 if ok else 1
