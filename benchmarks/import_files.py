"""Files touched by ``import fairseq`` (issue 17): ``make bench-import``.

    python -m benchmarks.import_files --python .venv/bin/python \
        --nodes 64 --ranks-per-node 8 --out benchmarks/results/import_files.json

Why it matters: every rank of a job imports torch and fairseq at start. Where the Python
environment sits on the head node's NFS export (``/shared``), each of those file-system calls on
a compute node is a lookup, an attribute check or a read that may go to the one head node; 64 nodes
x 8 ranks start together. This counts them for one import, so the product is arithmetic.

How: the import runs under ``strace -f`` (the kernel's view: every ``openat``, ``stat``-family,
``access``, ``readlink`` and ``getdents64`` call of the process and its threads, including the
dynamic loader opening torch's shared libraries, which Python's audit hooks never see; an audit
hook counting ``open``/``os.listdir`` would miss importlib's own ``stat`` calls and every
``dlopen``). Each import is measured in a fresh interpreter, twice: ``import torch`` alone and
``import fairseq`` (which imports torch). strace is required (Debian: ``apt-get install strace``;
``make bench-import`` installs it when missing).

What the figures are and are not: calls made by the client process, split into calls that
succeeded and calls that failed (mostly importlib probing for a module under several names and
the loader searching library paths), and the distinct paths among them. They are not NFS RPCs:
the client's attribute and lookup caches absorb repeats within a few seconds (``acregmin`` /
``acdirmin``), while close-to-open consistency makes every ``open`` revalidate with the server.
So the RPCs that 512 ranks send are somewhere between "distinct paths x nodes" and "calls x
ranks"; both ends are reported. Wall time is measured without strace (median of ``--repeat``
warm runs), strace's slowdown being large.

Keys of the JSON: ``imports.<name>.calls`` (per syscall: ``total``, ``ok``, ``failed``),
``opened_ok`` / ``opened_ok_in_env`` (successful opens, and those under the environment's
prefix), ``distinct_paths`` / ``distinct_paths_in_env``, ``bytes_in_env_opened`` (size of the
distinct regular files opened under the environment), ``wall_s``; ``cluster`` the arithmetic for
``--nodes`` x ``--ranks-per-node``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import report

OPENS = ("open", "openat")
STATS = (
    "stat",
    "lstat",
    "newfstatat",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "readlink",
    "readlinkat",
)
SYSCALLS = (*OPENS, *STATS, "getdents64")  # what strace is asked to trace
# `pid  name(args) = result` or the `<... name resumed>` half of a call strace had to split.
LINE = re.compile(r"^(?:\d+\s+)?(?:<\.\.\. (?P<resumed>\w+) resumed>|(?P<name>\w+)\()(?P<rest>.*)$")
RESULT = re.compile(r"\)\s+=\s+(?P<ret>-?\d+|\?)(?:\s+(?P<errno>E[A-Z0-9]+))?")
PATH = re.compile(r'"((?:[^"\\]|\\.)*)"')

IMPORTS = {"torch": "import torch", "fairseq": "import fairseq"}
# --smoke: ``import torch`` alone, one untraced run for the wall time
SMOKE = {"repeat": 1, "imports": ["torch"]}


def parse_trace(text: str) -> tuple[dict[str, Counter[str]], Counter[str], set[str]]:
    """Per syscall Counter(total/ok/failed), and the paths of successful opens and of all calls."""
    calls: dict[str, Counter[str]] = {}
    opened: Counter[str] = Counter()
    paths: set[str] = set()
    pending: dict[str, str] = {}  # syscall name -> path of an unfinished call (strace -f splits)
    for line in text.splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        name = m.group("resumed") or m.group("name")
        if name not in SYSCALLS:
            continue
        rest = m.group("rest")
        if m.group("name"):
            pm = PATH.search(rest)
            path = pm.group(1) if pm else ""
            if "<unfinished ...>" in rest:
                pending[name] = path
                continue
        else:
            path = pending.pop(name, "")
        results = list(RESULT.finditer(rest))  # the last: a path may hold ") = "
        if not results:
            continue
        rm = results[-1]
        ok = rm.group("ret") != "?" and int(rm.group("ret")) >= 0 and rm.group("errno") is None
        counter = calls.setdefault(name, Counter())
        counter["total"] += 1
        counter["ok" if ok else "failed"] += 1
        if path:
            paths.add(path)
            if ok and name in OPENS:
                opened[path] += 1
    return calls, opened, paths


def env_prefix(python: str) -> str:
    """The environment's prefix as the interpreter sees it, resolved (site-packages live there)."""
    out = subprocess.run(
        [python, "-c", "import sys; print(sys.prefix)"], check=True, capture_output=True, text=True
    )
    return os.path.realpath(out.stdout.strip())


def in_env(path: str, prefix: str) -> bool:
    return os.path.realpath(path).startswith(prefix + os.sep)


def measure(python: str, code: str, prefix: str, strace: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace"
        subprocess.run(
            [
                strace,
                "-f",
                "-qq",
                "-e",
                "trace=" + ",".join(SYSCALLS),
                "-o",
                str(trace),
                python,
                "-c",
                code,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        calls, opened, paths = parse_trace(trace.read_text(errors="replace"))
    opened_env = {p for p in opened if in_env(p, prefix)}
    size = sum(os.path.getsize(p) for p in opened_env if os.path.isfile(p))
    totals = Counter[str]()
    for counter in calls.values():
        totals.update(counter)
    return {
        "calls": {name: dict(counter) for name, counter in sorted(calls.items())},
        "calls_total": dict(totals),
        "opened_ok": sum(opened.values()),
        "opened_ok_in_env": sum(n for p, n in opened.items() if p in opened_env),
        "distinct_files_opened_in_env": len(opened_env),
        "distinct_paths": len(paths),
        "distinct_paths_in_env": sum(1 for p in paths if in_env(p, prefix)),
        "bytes_in_env_opened": size,
    }


def wall(python: str, code: str, repeat: int) -> float:
    times = []
    for _ in range(repeat + 1):  # the first run warms the page cache and is dropped
        start = time.perf_counter()
        subprocess.run(
            [python, "-c", code], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        times.append(time.perf_counter() - start)
    return round(statistics.median(times[1:]), 3)


def cluster(result: dict[str, Any], nodes: int, ranks: int) -> dict[str, Any]:
    stats = sum(result["calls"].get(n, {}).get("total", 0) for n in STATS)
    return {
        "nodes": nodes,
        "ranks_per_node": ranks,
        "ranks": nodes * ranks,
        "calls_total": result["calls_total"].get("total", 0) * nodes * ranks,
        "opens_ok": result["opened_ok"] * nodes * ranks,
        "opens_ok_in_env": result["opened_ok_in_env"] * nodes * ranks,
        "stat_like_calls": stats * nodes * ranks,
        "getdents64_calls": result["calls"].get("getdents64", {}).get("total", 0) * nodes * ranks,
        "distinct_env_paths_x_nodes": result["distinct_paths_in_env"] * nodes,
        "bytes_read_if_each_node_reads_once": result["bytes_in_env_opened"] * nodes,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.import_files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--python", default=sys.executable, help="the environment's interpreter")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="untraced runs for the wall time")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/import_files.json"))
    parser.add_argument(
        "--imports", nargs="+", choices=tuple(IMPORTS), default=list(IMPORTS), help="what to trace"
    )
    return parser


def say_measured(name: str, result: dict[str, Any], nodes: int, ranks_per_node: int) -> None:
    """One import's figures on this machine, then scaled to the cluster (`cluster`)."""
    c = result["calls"]
    opens = sum(c.get(n, {}).get("total", 0) for n in OPENS)
    stats = sum(c.get(n, {}).get("total", 0) for n in STATS)
    print(
        f"import {name}: {result['calls_total'].get('total', 0)} calls: {opens} opens "
        f"({result['opened_ok']} ok, {result['opened_ok_in_env']} of them in the env), "
        f"{stats} stat-like, {c.get('getdents64', {}).get('total', 0)} getdents64; "
        f"{result['distinct_paths_in_env']} distinct paths in the env, "
        f"{result['bytes_in_env_opened'] / 1e6:.0f} MB of files opened there; "
        f"{result['wall_s']} s without strace"
    )
    k = result["cluster"]
    print(
        f"  x {k['ranks']} ranks ({nodes} nodes x {ranks_per_node}): "
        f"{k['calls_total']:,} calls, {k['opens_ok_in_env']:,} opens in env, "
        f"{k['stat_like_calls']:,} stat-like calls; at least "
        f"{k['distinct_env_paths_x_nodes']:,} lookups if each node caches perfectly"
    )


def main(argv: list[str] | None = None) -> int:
    args = report.parse(build_parser(), argv, "import_files", SMOKE)
    strace = shutil.which("strace")
    if strace is None:
        print("import_files: strace is not installed (apt-get install strace)", file=sys.stderr)
        return 2
    prefix = env_prefix(args.python)
    version = subprocess.run(
        [args.python, "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    imports: dict[str, Any] = {}
    for name in args.imports:
        code = IMPORTS[name]
        result = measure(args.python, code, prefix, strace)
        result["wall_s"] = wall(args.python, code, args.repeat)
        result["cluster"] = cluster(result, args.nodes, args.ranks_per_node)
        imports[name] = result
        say_measured(name, result, args.nodes, args.ranks_per_node)
    record = {
        "benchmark": "import_files",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": version[0],
            "torch": version[1],
        },
        "python": args.python,
        "env_prefix": prefix,
        "method": "strace -f -qq -e trace=" + ",".join(SYSCALLS) + "; one fresh interpreter each",
        "imports": imports,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
