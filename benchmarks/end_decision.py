"""What follows a start's end, decided (issue 43): ``make bench-decision``.

    python -m benchmarks.end_decision --out benchmarks/results/end_decision.json

What: the policy (``hpc_train.launch.restart_policy.after_end``, pure) over its table
(``hpc_train.testing.end_cases``: every cause of a start's end by requeue, in-job round and
hot spares), timed as a whole and per decision, the median of ``--repeats`` passes; and for
each end, the questions the policy asks of Slurm when its word is not given yet (answered from
the case's own word, as ``recovery.what_follows`` answers them with ``end_evidence.ask``): how
many Slurm look-ups each kind of end makes, and which, for the scale work that batches them;
and how many waits for Slurm (questions: the look-ups of one are made at once, issue 46).

Goal: the whole table in < 1 s (it is pure: no file, no Slurm; the figure is this machine's).
No cluster needed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from hpc_train.faults.end_evidence import Question
from hpc_train.launch import restart_policy
from hpc_train.testing import EndCase, end_cases, questions

GOAL_S = 1.0  # the whole table
SMOKE = {"repeats": 3}


def build_parser() -> argparse.ArgumentParser:
    p = report.out_parser("end_decision", __doc__, report.RESULTS / "end_decision.json")
    p.add_argument("--repeats", type=int, default=200, help="passes over the table (median)")
    return p


def asked(question: Question, job_said: bool) -> list[str]:
    """A question as the Slurm look-ups it makes (``end_evidence.ask``: one each; the
    partition's asks the job too, for its ExcNodeList, unless the job has said it already:
    ``job_said``)."""
    job = question.job or (question.partition and not job_said)
    return ([
        *(["scontrol show job"] if job else []),
        *(f"scontrol show node {n}" for n in question.nodes),
        *(f"srun --overlap on {n}" for n in question.steps),
        *(["scontrol show config"] if question.slurmd_timeout else []),
        *(["sinfo -N"] if question.partition else []),
    ])  # fmt: skip


def look_ups(case: EndCase) -> list[list[str]]:
    """The Slurm look-ups the policy asks for ``case`` when none is given, a list a wait."""
    waits, job_said = [], False
    for question in questions(case):
        waits.append(asked(question, job_said))
        job_said = job_said or question.job or question.partition
    return waits


def timed(cases: Sequence[EndCase], repeats: int) -> list[float]:
    """Seconds per pass over the whole table, ``repeats`` passes."""
    passes = []
    for _ in range(repeats):
        started = time.perf_counter()
        for case in cases:
            restart_policy.after_end(case.evidence, case.options)
        passes.append(time.perf_counter() - started)
    return passes


def measure(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory() as root:  # never read: the cases' run dir is a name
        cases = end_cases(Path(root))
        passes = timed(cases, args.repeats)
        waits = {f"{c.cause}/{c.mode}": look_ups(c) for c in cases}
    lookups = {end: [look for wait in ends for look in wait] for end, ends in waits.items()}
    median = statistics.median(passes)
    return {
        "benchmark": "end_decision",
        "goal": {"table_s": GOAL_S},
        "decisions": len(cases),
        "repeats": args.repeats,
        "table_s": {"median": median, "max": max(passes), "min": min(passes)},
        "per_decision_us": round(median / len(cases) * 1e6, 1),
        "slurm_look_ups": lookups,
        "slurm_look_ups_most": max(len(v) for v in lookups.values()),
        "slurm_waits": {end: len(v) for end, v in waits.items()},
        "slurm_waits_most": max(len(v) for v in waits.values()),
        **report.provenance(started, load_before, {
            "hostname": platform.node(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        }),
    }  # fmt: skip


def rows(result: dict[str, Any]) -> report.Rows:
    table = result["table_s"]
    return [
        (f"the table ({result['decisions']} ends), median of {result['repeats']}",
         f"{table['median'] * 1000:.2f} ms", f"< {GOAL_S:.0f} s"),
        ("one decision, median", f"{result['per_decision_us']:.0f} us", ""),
        ("Slurm look-ups of one end, most", str(result["slurm_look_ups_most"]), ""),
        ("waits for Slurm of one end, most", str(result.get("slurm_waits_most", "-")), ""),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = report.parse(build_parser(), argv, "end_decision", SMOKE)
    written = report.run_and_write("end_decision", args.out, lambda: measure(args), rows, ())
    return 0 if written is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
