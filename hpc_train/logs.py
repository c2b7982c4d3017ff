"""Reading what a run wrote: fairseq's JSON metric lines, and following a job until it ends.

fairseq writes one JSON object per log interval to ``<save-dir>/train.log`` (``--log-format json
--log-file``); restarts append to the same file. Parsing is pure; ``follow`` polls Slurm.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hpc_train import slurm
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
    finished: bool = False

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
        if "done training" in line:
            self.finished = True
        resumed = RESUME_RE.search(line)
        if resumed:
            self.resumed_at.append(int(resumed.group(3)))
        metrics = parse_metrics(line)
        if not metrics:
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

    ckpt = spec.save_dir / "checkpoint_last.pt"
    lines = [
        f"job {state}: {summary.updates}/{spec.updates} updates",
        f"  loss {fmt(summary.first_loss)} -> {fmt(summary.final_loss)}"
        f" (valid {fmt(summary.valid_loss)})",
        f"  speed {fmt(summary.mean_wps, '.0f')} words/s (mean over log intervals)",
        f"  restarts resumed at update(s): {summary.resumed_at or 'none'}",
        f"  checkpoint: {ckpt if ckpt.exists() else 'none written'}",
    ]
    return "\n".join(lines)


def follow(
    spec: JobSpec,
    job_id: str,
    poll_s: float = 1.0,
    out: Callable[[str], None] = print,
) -> int:
    """Print progress until the job ends; then the summary. 0 if it completed at max-update."""
    summary = RunSummary()
    offset = 0
    last_state = ""
    while True:
        state = slurm.job_state(job_id)
        if state.state != last_state:
            out(f"[{time.strftime('%H:%M:%S')}] job {job_id}: {state.state} {state.nodes}".rstrip())
            last_state = state.state
        if spec.train_log.exists():
            with spec.train_log.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            # only complete lines; a partial last line is read again next time
            complete = chunk[: chunk.rfind(b"\n") + 1]
            offset += len(complete)
            for line in complete.decode("utf-8", errors="replace").splitlines():
                metrics = summary.feed(line)
                if metrics:
                    out(progress_line(metrics, spec.updates))
        if state.finished:
            break
        time.sleep(poll_s)
    out(report(summary, spec, state.state))
    ok = state.state in {"COMPLETED", "GONE"} and summary.updates >= spec.updates
    return 0 if ok else 1
