"""A decision's Slurm look-ups, idle and beside busy processes (issue 46): ``make bench-step-probe``.

    python -m benchmarks.step_probe --busy 0,78 --out benchmarks/results/step_probe.json

Why: at 39 hollow nodes the kill round's decision waited 1.31 s for Slurm's one question
(0.04 s at 2 nodes), its slowest part the step probe (``slurm.step_starts``: ``srun --overlap
true`` on the killed node), asked while the crash's other 38 agents and their ranks went down
on the same 2 cores (docs/scale.md). Is that the node count or the cores? This asks the same
three look-ups a kill's decision asks (``scontrol show job``, ``scontrol show node``, the step
probe), each alone, of a 2-node sleep job on the local cluster: first with the cores idle, then
beside ``--busy`` CPU-bound processes (78: one agent and one rank for each of 39 nodes), the
node count the same. No training: the question is Slurm's latency, not the toolkit's.

Needs the local cluster (``make cluster-up``, SLURM_CONF exported by the Makefile).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks import report
from benchmarks.preemption import machine
from hpc_core import slurm

SMOKE = {"busy": "0,4", "asks": 2}
BUSY_LOOP = "while True: pass"


def build_parser() -> argparse.ArgumentParser:
    p = report.out_parser("step_probe", __doc__, report.RESULTS / "step_probe.json")
    p.add_argument("--busy", type=counts, default="0,78",
                   help="CPU-bound processes beside the look-ups, one count a pass")  # fmt: skip
    p.add_argument("--asks", type=int, default=7, help="each look-up's repeats (median)")
    p.add_argument("--partition", default="low", help="the sleep job's partition")
    return p


def counts(text: str) -> list[int]:
    """``--busy``: comma-separated counts, each >= 0 (bad input: argparse's one line, exit 2)."""
    try:
        found = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        found = []
    if not found or min(found) < 0:
        raise argparse.ArgumentTypeError(f"expected counts >= 0 such as 0,78, got {text!r}")
    return found


@contextmanager
def busy(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes for the duration (killed after)."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    try:
        time.sleep(1.0 if count else 0.0)  # all of them running
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def timed(ask: Callable[[], Any], asks: int) -> dict[str, float]:
    """``ask()``'s seconds, ``asks`` times one after another: the median and the longest, and
    how many answers said yes (``answered``: the step probe's False, a step that did not start,
    is no answer to time; a look-up that fails raises)."""
    took, answered = [], 0
    for _ in range(asks):
        began = time.perf_counter()
        answered += ask() is not False
        took.append(time.perf_counter() - began)
    return {"median_s": round(statistics.median(took), 3), "max_s": round(max(took), 3),
            "answered": answered}  # fmt: skip


def look_ups(job: str, node: str, asks: int) -> dict[str, dict[str, float]]:
    """The three look-ups of a kill's decision (``end_evidence.ask``), each timed alone."""
    return {
        "scontrol show job": timed(lambda: slurm.job_state(job), asks),
        "scontrol show node": timed(lambda: slurm.node_info(node), asks),
        "srun --overlap true (the step probe)": timed(lambda: slurm.step_starts(job, node), asks),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    slurm.ensure_reachable()
    job = slurm.sbatch(["-N2", f"--partition={args.partition}", "--time=10", "--output=/dev/null",
                        "--job-name=bench-step-probe", "--wrap=exec sleep 600"])  # fmt: skip
    try:
        running = slurm.wait_for_job(job, lambda s: s.state == "RUNNING", 120)
        node = slurm.hostnames(running.nodes)[-1]
        by_busy = {}
        for count in args.busy:
            with busy(count):
                by_busy[str(count)] = look_ups(job, node, args.asks)
    finally:
        slurm.cancel(job, check=False)
    return {"job": job, "node": node, "asks": args.asks, "by_busy": by_busy,
            **report.provenance(started, load_before, machine())}  # fmt: skip


def rows(result: dict[str, Any]) -> report.Rows:
    out: report.Rows = []
    idle = result["by_busy"].get("0", {})
    for count, found in result["by_busy"].items():
        for what, took in found.items():
            base = (idle.get(what) or {}).get("median_s")
            times = report.ratio(took["median_s"], base) if count != "0" else None
            said = f"{took['median_s']:.3f} s (max {took['max_s']:.3f})"
            out.append((f"{what}, {count} busy", said + (f", {times:.1f}x idle" if times else ""),
                        "Slurm's latency"))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    args = report.parse(build_parser(), argv, "step_probe", SMOKE)
    result = report.run_and_write("bench-step-probe", args.out, lambda: run(args), rows,
                                  (slurm.SlurmError, TimeoutError))  # fmt: skip
    return 0 if result is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
