"""What the scale benchmark (``benchmarks/scale.py``) measures on this host, where every emulated
node of the local cluster runs: the job's processes (``Scanner``: each launcher, torchrun agent
and rank, when it started, its CPU seconds, its unique memory), the Slurm calls the toolkit makes
(``CallLog``: Slurm's clients shadowed on PATH by scripts that log each call, then run the real
client) and the file operations on the shared save dir (``trace_files``: strace on chosen
processes for a window). Nothing here changes what it measures but by those means.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_core.slurm_env import JOB_ID, NODENAME
from hpc_train.chaos import LAUNCHER
from hpc_train.job.command_lines import WORKER_MODULES

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK")
AGENTS = ("torch.distributed.run", "bin/torchrun")


def boot_time() -> float:
    """When this machine booted, to the clock tick (``/proc/stat``'s btime is whole seconds:
    a process started 0.3 s after a mark could be dated before it)."""
    return time.time() - float((PROC / "uptime").read_text().split()[0])


BOOT = boot_time()


def kind_of(cmdline: str) -> str | None:
    """What a process of the job is: ``launcher`` (submitit's task), ``srun`` (the batch step's
    client), ``agent`` (torchrun) or ``rank``; None for anything else."""
    first = cmdline.split(" ", 1)[0]
    if first.endswith("srun"):
        return "srun"
    if any(a in cmdline for a in AGENTS):
        return "agent"
    if any(m in cmdline for m in WORKER_MODULES):
        return "rank"
    return "launcher" if LAUNCHER in cmdline else None


def stat_of(pid: int) -> tuple[float, float] | None:
    """(start time since the epoch, CPU seconds: user + system) of ``pid``; None when gone."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return BOOT + int(fields[19]) / TICK, (int(fields[11]) + int(fields[12])) / TICK


def pss_kb(pid: int) -> int | None:
    """The unique memory of ``pid`` (PSS, kB: its own pages whole, shared ones split among
    their sharers), from ``/proc/PID/smaps_rollup``; None when gone."""
    try:
        text = (PROC / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return None
    found = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return int(found.group(1)) if found else None


YOUNG_S = 10.0  # a process this young may still be its parent's fork, before its exec
# ... and one looked at fewer times than this since it was first seen (a scan starved of the
# cores while 16 nodes start may come after YOUNG_S: a rank first seen as torchrun's fork
# stayed an agent, and the benchmark found no rank to kill on its node)
FIRST_LOOKS = 3


def cmdline_of(pid: int) -> str:
    try:
        return (
            (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


@dataclass
class Proc:
    """One process of a job: its kind, node, start, CPU seconds and PSS when last looked at."""

    pid: int
    job: str
    node: str
    kind: str
    started: float
    cpu_s: float = 0.0
    pss_kb: int | None = None
    ended: float | None = None
    looks: int = 0  # the scans that have looked at it


@dataclass
class Scanner:
    """A thread that looks at /proc every ``interval`` seconds for the processes of ``jobs``
    (by ``SLURM_JOB_ID``; a pid's environment and command line read once), and keeps each one's
    start, CPU seconds, and the moment it was first seen gone."""

    interval: float = 0.5
    jobs: set[str] = field(default_factory=set)
    procs: dict[int, Proc] = field(default_factory=dict)
    ignored: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Scanner:
        threading.Thread(target=self._loop, name="scale-scanner", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.scan()

    def scan(self) -> None:
        now, live = time.time(), set()
        for entry in PROC.iterdir():
            if entry.name.isdigit():
                live.add(int(entry.name))
        with self._lock:
            for pid in live - set(self.procs) - self.ignored:
                self._look(pid)
            for proc in self.procs.values():
                if proc.ended is None and (proc.pid not in live or stat_of(proc.pid) is None):
                    proc.ended = now
                elif proc.ended is None:
                    proc.cpu_s = (stat_of(proc.pid) or (0.0, proc.cpu_s))[1]
                    proc.looks += 1
                    if now - proc.started < YOUNG_S or proc.looks < FIRST_LOOKS:  # pre-exec?
                        proc.kind = kind_of(cmdline_of(proc.pid)) or proc.kind

    def _look(self, pid: int) -> None:
        env = environ_of(pid)
        job = env.get(JOB_ID)
        cmd = cmdline_of(pid)
        kind = kind_of(cmd) if job in self.jobs else None
        stat = stat_of(pid)
        if job is None or kind is None or stat is None:
            if job is None or job not in self.jobs or stat is not None:
                self.ignored.add(pid)  # (a job not yet watched: looked at again once it is)
            return
        self.procs[pid] = Proc(pid, job, env.get(NODENAME, "?"), kind, stat[0], stat[1])

    def watch(self, job: str) -> None:
        with self._lock:
            self.jobs.add(job)
            self.ignored.clear()
        self.scan()

    def of(self, job: str, kind: str | None = None, node: str | None = None,
           since: float = 0.0) -> list[Proc]:  # fmt: skip
        """The processes of ``job`` seen so far (of ``kind``, on ``node``, started since)."""
        with self._lock:
            found = [p for p in self.procs.values() if p.job == job and p.started >= since]
        return sorted((p for p in found if (kind is None or p.kind == kind)
                       and (node is None or p.node == node)), key=lambda p: p.started)  # fmt: skip

    def live(self, job: str, kind: str, node: str | None = None) -> list[Proc]:
        return [p for p in self.of(job, kind, node) if p.ended is None]


def memory(scanner: Scanner, job: str, node: str) -> dict[str, Any]:
    """The unique memory (PSS, MB) of each live process of ``job`` on ``node``, by kind, and
    their sum: what one node of this run costs the machine."""
    out: dict[str, Any] = {}
    total = 0
    for kind in ("launcher", "agent", "rank", "srun"):
        sizes = [pss_kb(p.pid) for p in scanner.live(job, kind, node)]
        kb = sum(s for s in sizes if s)
        if sizes:
            out[f"{kind}_mb"] = round(kb / 1024, 1)
            total += kb
    out["node_mb"] = round(total / 1024, 1)
    return out


# --- the Slurm calls ----------------------------------------------------------------------------

CLIENTS = ("scontrol", "squeue", "sinfo", "sbatch", "srun", "scancel", "sacct")
SHADOW = """#!/bin/sh
# hpc-train bench-scale: log this call (time, node, client, arguments), then run Slurm's own
printf '%s\\t%s\\t%s\\t%s\\n' "$(date +%s.%N)" "${{SLURMD_NODENAME:--}}" {name} "$*" >> {log}
exec {real} "$@"
"""


@dataclass(frozen=True)
class Call:
    time: float
    node: str  # "-": not in a job (the submit command)
    client: str
    args: str

    @property
    def what(self) -> str:
        """The call by its kind: ``scontrol show job``, ``srun --overlap`` ..."""
        words = self.args.split()
        if self.client == "scontrol":
            return " ".join(["scontrol", *words[: 2 if words[:1] == ["show"] else 1]])
        if self.client == "srun":
            return "srun --overlap" if "--overlap" in words else "srun"
        return self.client

    @property
    def rpc(self) -> bool:
        """Does it ask slurmctld (``scontrol show hostnames`` is computed by the client)?"""
        return self.what != "scontrol show hostnames"


@dataclass(frozen=True)
class CallLog:
    """Slurm's clients shadowed in ``bin`` (put first on the job's PATH), every call logged in
    ``log``."""

    bin: Path
    log: Path

    @classmethod
    def install(cls, directory: Path) -> CallLog:
        directory.mkdir(parents=True, exist_ok=True)
        log = directory / "calls.tsv"
        log.write_text("")  # this run's calls only
        for name in CLIENTS:
            real = shutil.which(name)
            if real is None:
                continue
            path = directory / name
            path.write_text(SHADOW.format(name=name, log=log, real=real))
            path.chmod(0o755)
        return cls(directory, log)

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin}:{os.environ.get('PATH', '')}"}

    def calls(self, since: float = 0.0, until: float = float("inf")) -> list[Call]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            parts = line.split("\t", 3)
            if len(parts) < 3:
                continue
            with contextlib.suppress(ValueError):
                call = Call(float(parts[0]), parts[1], parts[2], parts[3] if len(parts) > 3 else "")
                if since <= call.time <= until:
                    found.append(call)
        return found


def summarize_calls(calls: Iterable[Call]) -> dict[str, Any]:
    """How many calls, how many asked slurmctld, by kind, and per node (the most any one made,
    how many nodes made any, and the submit command's own)."""
    calls = list(calls)
    rpc = [c for c in calls if c.rpc]
    by_node = Counter(c.node for c in rpc if c.node != "-")
    return {
        "total": len(calls),
        "rpc": len(rpc),
        "by_kind": dict(sorted(Counter(c.what for c in calls).items())),
        "nodes_calling": len(by_node),
        "most_by_one_node": max(by_node.values(), default=0),
        "outside_the_job": sum(1 for c in rpc if c.node == "-"),
    }


# --- the save dir's file operations ------------------------------------------------------------

TRACED = "openat,rename,renameat,renameat2,unlink,unlinkat,mkdir,mkdirat,newfstatat,statx,access,faccessat,faccessat2,getdents64"
CALL_RE = re.compile(r"^\d+\s+(\w+)\((.*)\)\s+=\s+(-?\d+)")
PATH_RE = re.compile(r'"([^"]*)"')


def classify(call: str, args: str, root: str) -> str | None:
    """One traced system call on a path under ``root``: create, write, read, list, stat,
    rename, unlink, mkdir; None for any other path (imports, /proc ...)."""
    paths = PATH_RE.findall(args)
    if not any(p.startswith(root) for p in paths):
        return None
    if call == "openat":
        if "O_DIRECTORY" in args:
            return "list"
        if "O_CREAT" in args:
            return "create"
        return "write" if ("O_WRONLY" in args or "O_RDWR" in args) else "read"
    if call.startswith("rename"):
        return "rename"
    if call.startswith("unlink"):
        return "unlink"
    if call.startswith("mkdir"):
        return "mkdir"
    return "stat"


def trace_files(
    pids: Mapping[str, Sequence[int]], seconds: float, root: Path, out: Path
) -> dict[str, list[tuple[str, str]]]:
    """strace each group of ``pids`` (by label; and what they start) at once for ``seconds``;
    each group's file operations on paths under ``root`` (``traced_ops``). The traced processes
    stop only at these calls, and only for the window."""
    if shutil.which("strace") is None:
        return {}
    running = {}
    for label, group in pids.items():
        if not group:
            continue
        cmd = ["strace", "-f", "-qq", "-e", f"trace={TRACED}", "-o", f"{out}-{label}.txt"]
        running[label] = subprocess.Popen([*cmd, *(w for p in group for w in ("-p", str(p)))],
                                          stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(seconds)
    for proc in running.values():
        proc.send_signal(signal.SIGINT)  # strace detaches and exits
    for proc in running.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    return {label: traced_ops(Path(f"{out}-{label}.txt"), root) for label in running}


def traced_ops(trace: Path, root: Path) -> list[tuple[str, str]]:
    """A trace's file operations on paths under ``root``, the file read once: each as (its class,
    ``classify``; what paces it, ``pace``)."""
    ops = []
    for line in trace.read_text(errors="replace").splitlines() if trace.exists() else []:
        found = CALL_RE.match(line)
        if found and (what := classify(found.group(1), found.group(2), str(root))):
            ops.append((what, pace(found.group(1), found.group(2))))
    return ops


def count_ops(ops: Sequence[tuple[str, str]]) -> dict[str, int]:
    """``traced_ops``' operations by class."""
    return dict(sorted(Counter(what for what, _ in ops).items()))


def count_by_pace(ops: Sequence[tuple[str, str]]) -> dict[str, int]:
    """``traced_ops``' operations by what paces them (``pace``)."""
    counts = Counter({"update": 0, "clock": 0})
    counts.update(paced for _, paced in ops)
    return dict(counts)


def pace(call: str, args: str) -> str:
    """What paces one file operation: ``clock`` for the watchers' polls on a timer (a heartbeat
    read or its folder listed by the hang monitor or the straggler watch, a look for a hang's
    declaration or its reports, a launcher's beat), ``update`` for everything a rank does once an
    update or a save (its heartbeat written: a temporary and a rename; the notice and chaos
    files it looks for; checkpoints; the ledger)."""
    paths = PATH_RE.findall(args)
    if any(w in p for p in paths for w in ("/incidents/", "/launchers/")):
        return "clock"
    if any("/heartbeats/" in p for p in paths):
        written = call.startswith("rename") or any(".tmp" in p for p in paths)
        return "update" if written else "clock"
    return "update"


def files_under(root: Path) -> set[str]:
    """Every file under ``root`` now (relative paths): a created file is one more."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
