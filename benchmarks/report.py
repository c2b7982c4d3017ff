"""What every benchmark shares: figures as text, the (figure, measured, goal) table, the JSON
result written whole, the run-report-write ending of each ``main``, and the smoke mode
(``--smoke``: the same code path, shrunk to seconds; the suite runs it, ``tests/benchmarks/
test_smoke.py``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpc_core.rundir import atomic_write

Rows = list[tuple[str, str, str]]
RESULTS = Path(__file__).resolve().parent / "results"  # the figures: never a smoke run's
SMOKE_HELP = (
    "smoke mode: the same code path, every size and duration shrunk to seconds (the test suite "
    "runs it); its JSON goes to a temporary directory, never to benchmarks/results/"
)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def table(rows: Sequence[tuple[str, str, str]]) -> str:
    header = ("figure", "measured", "goal")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(3)]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in (header, *rows)
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """A Slurm benchmark's command line: ``--data`` (the demo corpus), ``--out``
    (``benchmarks/results/<name>.json``), ``--work-dir`` (its save dirs)."""
    p = out_parser(name, doc, Path(f"benchmarks/results/{name}.json"))
    p.add_argument("--data", type=Path, required=True, help="binarized corpus (demo-bin)")
    p.add_argument("--work-dir", type=Path, help=f"save dirs (default .local/bench/{name}-*)")
    return p


def out_parser(module: str, doc: str | None, out: Path) -> argparse.ArgumentParser:
    """``python -m benchmarks.<module>``'s command line, its ``doc`` as the help, with ``--out``
    (the JSON's path, ``out`` unless told)."""
    p = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{module}", description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=out)
    return p


def provenance(
    started: float, load_before: tuple[float, float, float], machine: dict[str, Any]
) -> dict[str, Any]:
    """When a benchmark ran, how long, how busy the box was before and after, and on what."""
    return {
        "date": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started),
        "loadavg": {"before": load_before, "after": os.getloadavg()},
        "machine": machine,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` whole or not at all (``hpc_core.rundir.atomic_write``)."""
    atomic_write(path, json.dumps(data, indent=2) + "\n")


def run_and_write(
    name: str,
    out: Path,
    compute: Callable[[], dict[str, Any]],
    rows: Callable[[dict[str, Any]], Rows],
    errors: tuple[type[Exception], ...],
) -> dict[str, Any] | None:
    """Run the benchmark; on one of ``errors`` say it in one line and return None; else write
    the JSON result, print the table and where it went, and return the result."""
    try:
        result = compute()
    except errors as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return None
    write_json(out, result)
    print(table(rows(result)))
    print(f"written {out} ({result.get('duration_s', '?')} s)")
    return result


def smoke_out(name: str) -> Path:
    """Where a smoke run writes its JSON unless told: a temporary directory."""
    return Path(tempfile.gettempdir()) / "hpc-train-bench-smoke" / f"{name}.json"


def parse(
    p: argparse.ArgumentParser, argv: Sequence[str] | None, name: str, smoke: Mapping[str, Any]
) -> argparse.Namespace:
    """``p``'s arguments, with ``--smoke``: ``smoke``'s values become the defaults (an option
    given on the command line still wins) and ``--out`` defaults to ``smoke_out(name)``. A smoke
    run told to write under ``benchmarks/results/`` is refused (exit 2): its figures mean
    nothing."""
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    known, _ = p.parse_known_args(argv)
    if known.smoke:
        p.set_defaults(**smoke, out=smoke_out(name))
    args = p.parse_args(argv)
    if args.smoke and args.out is not None and args.out.resolve().is_relative_to(RESULTS):
        p.error(f"--smoke writes no result under {RESULTS}: give --out a temporary path")
    return args
