"""Grow-back benchmark (issue 20): ``make bench-grow``.

    python -m benchmarks.grow --data .local/data/demo-bin --out benchmarks/results/grow.json

Two runs of the tiny preset with ``--nodes 1-3`` on the local Slurm cluster (SLURM_CONF
exported), each started beside a blocker job that holds three of the four nodes for
``--blocked-s`` seconds and then ends by itself (capacity given back, as on a spot cluster):

1. **grow** - ``--grow-after G``: the run starts on the one free node and grows to 3 once the
   blocker's nodes stay idle for G seconds (save on notice, requeue, resume wider);
2. **no_grow** - ``--grow-after 0``: the same run stays on its one node to the end (today's
   behaviour before grow-back).

Figures (keys of the JSON), from each run's ledger and train log:
- ``updates_per_s``: before and after the grow (the grow run's two starts), and the no-grow run's;
- ``node_hours``: node-seconds the run held (each start's nodes x its span) against the
  node-seconds open to it (1 node while the blocker held the rest, 3 after, until the run ended):
  ``used_ratio`` (goal: near 1 for the grow run);
- ``nodes_free_to_wider_s``: from the blocker's end to the first update on 3 nodes;
- ``wall_ratio``: the grow run's submit-to-end time over the no-grow run's (< 1: growing paid);
- ``updates_recomputed``: update numbers trained twice (goal 0).

On this 2-core machine three emulated nodes share the cores one node had: updates/s on 3 nodes
measures the protocol (the global batch kept, nothing recomputed), not a speed-up; on a real
cluster each node brings its own GPUs.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.preemption import BenchError, Jobs, machine, say, trained, wait_until
from benchmarks.report import fmt, provenance, ratio, run_and_write
from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train import testing

GOAL_RECOMPUTED = 0
# --smoke: the same two runs, short: the blocker holds its nodes 10 s, a 1 s settle window
SMOKE = {"max_update": 200, "blocked_s": 10, "grow_after": 1.0, "quiet_timeout": 30}


def segments(events: Sequence[ledger.Event]) -> list[dict[str, Any]]:
    """Each start: its nodes, when it started, its first update, when it ended, and the update
    it resumed from (pure, from the ledger)."""
    ordered = sorted(events, key=lambda e: e.time)
    starts = [i for i, e in enumerate(ordered) if e.kind == Kind.STARTED]
    out = []
    for n, i in enumerate(starts):
        inside = ordered[i + 1 : starts[n + 1] if n + 1 < len(starts) else len(ordered)]
        first = next((e.time for e in inside if e.kind == Kind.FIRST_UPDATE), None)
        end = next((e for e in inside if e.kind in (Kind.STOPPED, Kind.FINISHED)), None)
        out.append({
            "nodes": len(ordered[i].get("nodes") or []), "started": ordered[i].time,
            "first_update": first, "ended": end.time if end else ordered[-1].time,
            "resume_at": int(ordered[i].get("resume_at", 0) or 0),
            "reached": end.get("reached") if end else None,
        })  # fmt: skip
    return out


def used_node_s(segs: Sequence[dict[str, Any]]) -> float:
    return sum(s["nodes"] * (s["ended"] - s["started"]) for s in segs)


def open_node_s(begin: float, freed: float, end: float, wide: int) -> float:
    """Node-seconds open to the run: one node until ``freed``, ``wide`` after, until ``end``."""
    return max(0.0, min(freed, end) - begin) + wide * max(0.0, end - max(freed, begin))


def rate(seg: dict[str, Any]) -> float | None:
    """Updates per second of one start, from its first update to its end."""
    if seg["first_update"] is None or seg["reached"] is None:
        return None
    span = seg["ended"] - seg["first_update"]
    return (seg["reached"] - seg["resume_at"]) / span if span > 0 else None


def one_run(name: str, grow_after: float, args: argparse.Namespace, jobs: Jobs) -> dict[str, Any]:
    save = args.work_dir / name
    jobs.wait_quiet()
    blocker = jobs.add(slurm.sbatch([
        "-p", "low", "-N3", "--exclusive", "-o", "/dev/null", "--job-name=bench-blocker",
        f"--wrap=sleep {args.blocked_s}",
    ]))  # fmt: skip
    wait_until("the blocker", lambda: slurm.job_state(blocker).state == "RUNNING", 120)
    submitted = time.time()
    try:
        job = jobs.add(testing.submit_tiny(
            args.data, save, args.max_update, name, "1-3",
            ("--grow-after", str(grow_after), "--global-batch", "24"), ("--log-interval", "1"),
        ))  # fmt: skip
    except RuntimeError as err:
        raise BenchError(str(err)) from None
    say(f"{name}: job {job} submitted beside blocker {blocker} ({args.blocked_s} s)")
    wait_until(f"blocker {blocker} to end", lambda: slurm.job_state(blocker).finished, 900)
    freed = time.time()
    final = slurm.wait_for_job(job, timeout=1800)
    events = ledger.read(RunDir(save).ledger)
    segs = segments(events)
    end = max(e.time for e in events)
    updates = trained(save)
    wide = next((s for s in segs if s["nodes"] > 1), None)
    return {
        "job_id": job,
        "state": final.state,
        "starts": [{**s, "updates_per_s": rate(s)} for s in segs],
        "grown": [e.data for e in events if e.kind == Kind.GROWN],
        "updates_recomputed": len(updates) - len(set(updates)),
        "updates_missing": sorted(set(range(1, args.max_update + 1)) - set(updates))[:20],
        "wall_s": round(end - submitted, 1),
        "nodes_free_to_wider_s": round(wide["first_update"] - freed, 1)
        if wide and wide["first_update"] else None,
        "node_s": {"used": round(used_node_s(segs), 1),
                   "open": round(open_node_s(segs[0]["started"], freed, end, 3), 1)},
        "save_dir": str(save),
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    with Jobs.session(args) as jobs:
        grow = one_run("bench-grow", args.grow_after, args, jobs)
        still = one_run("bench-no-grow", 0, args, jobs)
    before, after = (grow["starts"] + [{}, {}])[:2]
    return {
        "updates_per_s": {
            "grow_before": before.get("updates_per_s"), "grow_after": after.get("updates_per_s"),
            "no_grow": still["starts"][0]["updates_per_s"],
        },
        "used_ratio": {name: ratio(r["node_s"]["used"], r["node_s"]["open"])
                       for name, r in (("grow", grow), ("no_grow", still))},
        "wall_ratio": ratio(grow["wall_s"], still["wall_s"]),
        "nodes_free_to_wider_s": grow["nodes_free_to_wider_s"],
        "updates_recomputed": grow["updates_recomputed"] + still["updates_recomputed"],
        "runs": {"grow": grow, "no_grow": still},
        "goals": {"updates_recomputed": GOAL_RECOMPUTED},
        "settings": {"max_update": args.max_update, "blocked_s": args.blocked_s,
                     "grow_after_s": args.grow_after, "nodes": "1-3", "global_batch": 24,
                     "preset": "tiny"},
        **provenance(started, load_before, machine()),
    }  # fmt: skip


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    ups, used = result["updates_per_s"], result["used_ratio"]
    return [
        ("updates/s before -> after the grow", f"{fmt(ups['grow_before'])} -> "
         f"{fmt(ups['grow_after'])}", f"no grow: {fmt(ups['no_grow'])}"),
        ("node-seconds used / open to the run", f"grow {fmt(used['grow'])}",
         f"no grow {fmt(used['no_grow'])}"),
        ("nodes free -> first update on 3 nodes (s)", fmt(result["nodes_free_to_wider_s"], ".1f"),
         ""),
        ("wall: grow / no grow", fmt(result["wall_ratio"]), "< 1: growing paid"),
        ("updates recomputed", str(result["updates_recomputed"]), f"goal {GOAL_RECOMPUTED}"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = report.parser("grow", __doc__)
    p.add_argument("--max-update", type=int, default=800)
    p.add_argument("--blocked-s", type=int, default=30, help="seconds the blocker holds 3 nodes")
    p.add_argument("--grow-after", type=float, default=5.0, help="the grow run's settle window")
    p.add_argument("--quiet-timeout", type=float, default=900,
                   help="seconds to wait for other jobs to leave the queue before each run")  # fmt: skip
    args = report.parse(p, argv, "grow", SMOKE)
    args.data = args.data.resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.work_dir = (args.work_dir or Path(".local/bench") / f"grow-{stamp}").resolve()
    errors = (BenchError, slurm.SlurmError)
    result = run_and_write("bench-grow", args.out, lambda: run(args), summary_rows, errors)
    if result is None:
        return 1
    print(f"its runs: {args.work_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
