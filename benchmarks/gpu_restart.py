"""What an in-job restart costs on a real GPU (issue 19): a rank crashes, the launcher starts
torchrun again inside the allocation, and training resumes from the save dir. Needs one visible
NVIDIA GPU; without one it says so and exits 0 with ``{"gpu": false}`` (a GPU result already at
``--out`` is kept). ``--cpu``: the same sequence with the tiny preset on one CPU rank (gloo), to
check the logic on any machine.

    python -m benchmarks.gpu_restart --startup-parts --data .local/data/demo-bin --out benchmarks/results/gpu-restart.json
    python -m benchmarks.gpu_restart --cpu --data .local/data/demo-bin --out /tmp/gpu-restart-cpu.json

One preset on one device (``PLANS``: roberta-base on the GPU, tiny with ``--cpu``), the toolkit's
worker started as ``benchmarks.gpu`` starts its "toolkit" run (``gpu.toolkit_argv``: ``torchrun
-m hpc_train.worker.train`` with the launcher's fairseq arguments: the p5 table's batch per GPU,
bf16, fused_adamw, 4 loader processes, async saves), a periodic save every ``save_every`` updates
(``--save-interval N``), every update logged, on the demo corpus with its train split repeated
(``gpu_measure.build_corpus``) so that no epoch ends:

1. **cold start**: the launcher's resume decision (``checkpoints.choose_resume``) on an empty save
   dir, then torchrun, until the first update's line in ``train.log``;
2. **crash**: once a periodic checkpoint is durable (``checkpoint_last.pt`` loads, saved past the
   start's resume point) and ``kill_after`` more updates are logged, SIGKILL the training rank
   (found as the soak's crash and ``chaos hang`` find ranks: ``chaos.ranks_here``; torchrun is
   left alone), and time until torchrun exits;
3. **in-job restart**: the resume decision again, then the same command line on the same save
   dir (the next round's rendezvous, as the launcher's ``41.1``), until fairseq's ``Loaded
   checkpoint`` line, the first resumed update, and the update the crash had reached (caught up);
4. steps 2-3 twice. Both restarts read a checkpoint this machine has just written (its pages
   likely cached); the second also finds Python's and CUDA's files warm from two starts.

Not counted: what the launcher does around torchrun (its start decision files, the crash report,
the verdict, heartbeats) and Slurm. Times are ``train.log``'s millisecond stamps
(``logparse.line_time``) against this process's clock; kill to exit is ``Popen.wait``.

JSON (``--out``): ``gpu``, ``device`` (cuda, cpu), ``environment`` (``gpu_measure.environment()``
on a GPU), ``preset``, ``settings`` (save_every, kill_after, global_batch, batch_per_device,
update_freq, max_update: a cap never reached, repeat), ``argv`` (the cold start's),
``checkpoint`` (``bytes`` of checkpoint_last.pt, the saves' ``snapshot_s`` and ``write_s``),
``seconds_per_update`` (median between consecutive updates, first ``WARMUP_UPDATES`` of each start
left out), ``cold_start`` (``choose_resume_s``, ``start_to_first_update_s``), ``crashes`` (one per
crash: ``checkpoint_update``, ``killed_at_update``, ``kill_to_torchrun_exit_s``,
``torchrun_returncode``, ``rank_group_left_at_exit``: processes of the killed rank's group, its
loader processes, still alive when torchrun exited; and ``restart``: ``resumed_at``,
``updates_recomputed``, ``choose_resume_s``, ``restart_to_loaded_s``,
``loaded_to_first_update_s``, ``restart_to_first_update_s``, ``kill_to_first_update_s``,
``kill_to_caught_up_s``), ``startup_parts`` (``--startup-parts``: each of ``STARTUP_PARTS`` timed
in a fresh process: ``wall_s``, and for a load its own ``inner_s``), ``logparse``
(the resumes as ``hpc-train status`` reads train.log), ``figures`` (per restart: ``lost_s`` = kill
to caught up, ``recompute_s`` = updates recomputed x seconds per update, ``fixed_s`` = the rest:
exit, start-up, load), ``error`` (only when a step failed: what was measured up to it is kept),
``date``, ``duration_s``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from benchmarks import gpu, gpu_measure, report
from benchmarks.report import table, write_json
from hpc_core import instances
from hpc_core.rundir import RunDir
from hpc_core.slurm_env import JOB_ID
from hpc_core.wait import FAST, Backoff, wait_until
from hpc_train import chaos, cli
from hpc_train.contract import node_name
from hpc_train.job import command_lines
from hpc_train.job.spec import JobSpec
from hpc_train.runs import logparse
from hpc_train.worker import checkpoints

T = TypeVar("T")

CRASHES = 2
WARMUP_UPDATES = 3  # of each start, left out of seconds_per_update
START_TIMEOUT_S = 180.0  # torchrun start -> first (resumed) update
PROGRESS_TIMEOUT_S = 180.0  # -> a durable checkpoint and kill_after more updates; -> caught up
EXIT_TIMEOUT_S = 90.0  # the rank killed -> torchrun's exit
POLL = Backoff(0.05, 1.5, 0.25)  # train.log and checkpoint_last.pt: a kill late by <= 0.25 s
SNAPSHOT_RE = re.compile(r"snapshot for \S+ in ([\d.]+) s")
WRITE_RE = re.compile(r"wrote \S+ in the background in ([\d.]+) s")


@dataclass(frozen=True)
class Plan:
    preset: str
    lengths: gpu.Lengths  # global batch, max_update (a cap: training is stopped first), log 1
    save_every: int  # --save-interval: updates between periodic saves
    kill_after: int  # updates logged past a durable checkpoint before the rank is killed
    repeat: int  # train split repeats: no epoch ends (an epoch's end validates and saves)


# roberta-base: 256 sequences per GPU (the p5 table's), one step per update; the corpus repeated
# 250x is 56,000 blocks of 512 tokens, 218 updates an epoch, above max_update. The run stops near
# update 2 x save_every + the write's lag + kill_after (~110).
PLANS = {
    "cuda": Plan(
        "roberta-base", gpu.Lengths(256, 200, 1), save_every=40, kill_after=15, repeat=250
    ),
    "cpu": Plan("tiny", gpu.Lengths(16, 400, 1), save_every=50, kill_after=20, repeat=5),
}
# --smoke: the same sequence (a cold start, two crashes and restarts), a save every 4 updates
SMOKE_PLANS = {
    "cuda": dataclasses.replace(PLANS["cuda"], save_every=4, kill_after=2),
    "cpu": dataclasses.replace(PLANS["cpu"], save_every=4, kill_after=2),
}


# --- pure ---------------------------------------------------------------------------------------


@dataclass
class StartLog:
    """What one start of the worker wrote to train.log: each update's first line (update,
    epoch seconds), fairseq's ``Loaded checkpoint`` (update, seconds) and the async saves."""

    updates: list[tuple[int, float]] = field(default_factory=list)
    loaded: tuple[int, float] | None = None
    snapshot_s: list[float] = field(default_factory=list)
    write_s: list[float] = field(default_factory=list)

    @property
    def resumed_at(self) -> int:
        return self.loaded[0] if self.loaded else 0

    @property
    def reached(self) -> int:
        """The highest update logged (the resume point before any)."""
        return max([self.resumed_at, *(u for u, _ in self.updates)])

    def first_at_least(self, update: int) -> tuple[int, float] | None:
        """The first logged update >= ``update``, with its time."""
        return next(((u, t) for u, t in self.updates if u >= update), None)

    def first_update(self) -> tuple[int, float] | None:
        """The first update this start trained (past its resume point)."""
        return self.first_at_least(self.resumed_at + 1)


def parse_start(lines: Iterable[str]) -> StartLog:
    """One start's train.log lines (``logparse`` reads the metrics and the resume line)."""
    out = StartLog()
    seen: set[int] = set()
    for line in lines:
        stamp = logparse.line_time(line)
        if (m := logparse.RESUME_RE.search(line)) and stamp is not None:
            out.loaded = out.loaded or (int(m.group(3)), stamp)
        elif m := SNAPSHOT_RE.search(line):
            out.snapshot_s.append(float(m.group(1)))
        elif m := WRITE_RE.search(line):
            out.write_s.append(float(m.group(1)))
        elif (record := logparse.parse_record(line)) and record.kind == "train_inner":
            n = record.update
            if n is not None and n not in seen and stamp is not None:
                seen.add(n)
                out.updates.append((n, stamp))
    return out


def step_seconds(updates: list[tuple[int, float]], skip: int = WARMUP_UPDATES) -> list[float]:
    """Seconds between consecutive updates (n, n + 1) of one start, its first ``skip`` left out."""
    kept = updates[skip:]
    return [t2 - t1 for (u1, t1), (u2, t2) in itertools.pairwise(kept) if u2 == u1 + 1]


def restart_figures(
    killed: float, began: float, choose_s: float, log: StartLog, reached_before: int
) -> dict[str, Any]:
    """One in-job restart: ``killed`` (the rank's SIGKILL) and ``began`` (the resume decision's
    start) in epoch seconds, ``log`` the restarted start's, ``reached_before`` the highest update
    the killed start had logged."""
    first, caught = log.first_update(), log.first_at_least(reached_before)

    def since(t0: float, point: tuple[int, float] | None) -> float | None:
        return round(point[1] - t0, 3) if point else None

    return {
        "resumed_at": log.resumed_at if log.loaded else None,
        "reached_before_kill": reached_before,
        "updates_recomputed": reached_before - log.resumed_at if log.loaded else None,
        "choose_resume_s": round(choose_s, 3),
        "restart_to_loaded_s": since(began, log.loaded),
        "loaded_to_first_update_s": since(log.loaded[1], first) if log.loaded else None,
        "restart_to_first_update_s": since(began, first),
        "kill_to_first_update_s": since(killed, first),
        "kill_to_caught_up_s": since(killed, caught),
    }


def figures(crashes: list[dict[str, Any]], seconds_per_update: float | None) -> dict[str, Any]:
    """Per restart: the time lost (kill to caught up), the part of it spent training the
    recomputed updates again, and the rest (exit, start-up, load)."""
    out: dict[str, Any] = {}
    for i, crash in enumerate(crashes, 1):
        r = crash.get("restart") or {}
        lost, again = r.get("kill_to_caught_up_s"), r.get("updates_recomputed")
        recompute = (
            round(again * seconds_per_update, 3)
            if again is not None and seconds_per_update
            else None
        )
        out[f"restart_{i}"] = {
            "kill_to_first_update_s": r.get("kill_to_first_update_s"),
            "lost_s": lost,
            "recompute_s": recompute,
            "fixed_s": round(lost - recompute, 3) if lost is not None and recompute else None,
        }
    return out


def rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The printed table: (figure, measured, goal)."""

    def s(value: Any) -> str:
        return (
            "n/a" if value is None else f"{value:.2f} s" if isinstance(value, float) else str(value)
        )

    cold = result.get("cold_start") or {}
    out = [("cold start -> first update", s(cold.get("start_to_first_update_s")), "-")]
    out.append(("seconds per update", s(result.get("seconds_per_update")), "-"))
    for i, crash in enumerate(result.get("crashes", []), 1):
        r = crash.get("restart") or {}
        out += [
            (f"crash {i}: killed at / resumed at", f"{crash.get('killed_at_update')} / "
             f"{r.get('resumed_at')} ({r.get('updates_recomputed')} recomputed)", "-"),
            (f"crash {i}: kill -> torchrun exit", s(crash.get("kill_to_torchrun_exit_s")), "-"),
            (f"restart {i}: -> loaded checkpoint", s(r.get("restart_to_loaded_s")), "-"),
            (f"restart {i}: -> first resumed update", s(r.get("restart_to_first_update_s")), "-"),
            (f"restart {i}: kill -> caught up", s(r.get("kill_to_caught_up_s")), "-"),
        ]  # fmt: skip
    ckpt = result.get("checkpoint") or {}
    out.append(("checkpoint bytes", str(ckpt.get("bytes")), "-"))
    return out


# --- measuring ----------------------------------------------------------------------------------


class Start:
    """One torchrun start in its own process group; its train.log lines from where they begin."""

    def __init__(self, argv: list[str], env: dict[str, str], run: RunDir, out: Path) -> None:
        self.run, self.argv, self.out = run, argv, out
        self.offset = run.train_log.stat().st_size if run.train_log.exists() else 0
        self.end: int | None = None
        print(f"[gpu-restart] {out.stem}: {command_lines.shell(argv)}", flush=True)
        with out.open("w") as fh:
            self.spawned = time.time()
            self.proc = subprocess.Popen(
                argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )

    def lines(self) -> list[str]:
        if not self.run.train_log.exists():
            return []
        with self.run.train_log.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read() if self.end is None else fh.read(self.end - self.offset)
        return logparse.complete_lines(data.decode(errors="replace"))

    def log(self) -> StartLog:
        return parse_start(self.lines())

    def first_update(self) -> tuple[int, float] | None:
        return self.log().first_update()

    def first_at_least(self, update: int) -> tuple[int, float] | None:
        return self.log().first_at_least(update)

    def wait_for(self, check: Callable[[], T | None], what: str, timeout: float) -> T:
        """``wait_until`` that fails at once, naming torchrun's log, if torchrun exits first."""

        def probe() -> T | None:
            found = check()
            if (found is None or found is False) and self.proc.poll() is not None:
                raise RuntimeError(
                    f"torchrun exited {self.proc.returncode} before {what}; see {self.out}"
                )
            return found

        return wait_until(probe, what, timeout, POLL)

    def exited(self) -> None:
        """torchrun is gone: this start's lines end here."""
        self.end = self.run.train_log.stat().st_size if self.run.train_log.exists() else 0


def group_members(pgid: int) -> list[int]:
    """Processes of process group ``pgid`` still alive (zombies left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] not in {"Z", "X"} and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


class Durable:
    """The update of ``checkpoint_last.pt`` once it loads (``checkpoints.inspect``), read again
    only when the file changes (every write is a new file, renamed into place)."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.key: tuple[int, int, int] | None = None
        self.update: int | None = None

    def __call__(self) -> int | None:
        try:
            st = self.run.checkpoint_last.stat()
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key != self.key:
            problem, updates = checkpoints.inspect(self.run.checkpoint_last)
            self.key, self.update = key, None if problem else updates
        return self.update


class Bench:
    """The sequence of ``PLANS[device]`` on one device, its result filled in as it goes."""

    def __init__(self, plan: Plan, data: Path, work: Path, use_gpu: bool) -> None:
        self.plan, self.use_gpu = plan, use_gpu
        self.work = work
        self.save = (work / f"{plan.preset}-save").resolve()
        spec = gpu.toolkit_spec(plan.preset, data.resolve(), self.save, plan.lengths)
        saves = dataclasses.replace(spec.saves, interval=str(plan.save_every))
        changes: dict[str, Any] = {"saves": saves}
        if not use_gpu:
            # one CPU rank: gloo, legacy_ddp, no loader processes
            changes["sizing"] = dataclasses.replace(spec.sizing, gpus_per_node=0)
        self.spec: JobSpec = dataclasses.replace(spec, **changes)
        self.run = RunDir(self.save)
        self.tag = f"gpu-restart-{os.getpid()}"  # chaos finds the ranks by their job id
        self.env = {**os.environ, JOB_ID: self.tag}
        if not use_gpu:  # as the launcher sets up CPU ranks
            self.env.update(instances.plain(instances.cpu_env()))
        self.starts: list[Start] = []
        self.timings: list[tuple[float, float, float, int]] = []  # killed, began, choose_s, reached
        self.durable = Durable(self.run)

    def stop_all(self) -> None:
        """SIGKILL every torchrun, rank and loader process of this benchmark (those with its
        SLURM_JOB_ID, as ``chaos kill-node`` does): torchrun starts each rank in a session of its
        own, so killing torchrun alone would leave the rank training."""
        node = node_name()
        wait_until(lambda: chaos.kill_here(self.tag, node) == 0, "this benchmark's processes gone",
                   30, FAST)  # fmt: skip
        for started in self.starts:
            started.proc.wait(timeout=EXIT_TIMEOUT_S)
            if started.end is None:
                started.exited()

    def settings(self) -> dict[str, Any]:
        plan = self.spec.batch_plan(1, self.use_gpu)
        return {
            "save_every": self.plan.save_every,
            "kill_after": self.plan.kill_after,
            "global_batch": plan.global_batch,
            "batch_per_device": plan.batch_per_device,
            "update_freq": plan.update_freq,
            "max_update": self.plan.lengths.max_update,
            "repeat": self.plan.repeat,
        }

    def start_argv(self, round_: int, resume_args: tuple[str, ...]) -> list[str]:
        """Round ``round_``'s command line: ``gpu.toolkit_argv`` with the launcher's round key
        (its own rendezvous) and resume arguments."""
        return gpu.toolkit_argv(self.spec, sys.executable, self.use_gpu, resume_args, round_)

    def start(self, round_: int) -> tuple[Start, float, float]:
        """The launcher's resume decision, then torchrun: (the start, when the decision began
        in epoch seconds, its seconds)."""
        began, t0 = time.time(), time.monotonic()
        resume = checkpoints.choose_resume(self.save)
        choose_s = time.monotonic() - t0
        print(f"[gpu-restart] round {round_}: {resume.reason}", flush=True)
        argv = self.start_argv(round_, tuple(resume.fairseq_args()))
        started = Start(argv, self.env, self.run, self.work / f"start{round_}.log")
        self.starts.append(started)
        return started, began, choose_s

    def crash(self, started: Start) -> tuple[dict[str, Any], float, int]:
        """Wait for a durable checkpoint past this start's resume point and ``kill_after`` more
        updates; SIGKILL the rank; wait for torchrun. (figures, when killed, update reached)."""
        after = started.log().resumed_at

        def ready() -> int | None:
            ckpt = self.durable()
            if ckpt is None or ckpt <= after:
                return None
            return ckpt if started.log().reached >= ckpt + self.plan.kill_after else None

        what = f"a checkpoint past update {after} and {self.plan.kill_after} more updates"
        ckpt = started.wait_for(ready, what, PROGRESS_TIMEOUT_S)
        ranks = chaos.ranks_here(self.tag, node_name())
        if not ranks:
            raise RuntimeError(f"no training rank found (SLURM_JOB_ID={self.tag})")
        at = started.log().reached
        killed = time.time()
        os.kill(ranks[0], signal.SIGKILL)
        returncode = started.proc.wait(timeout=EXIT_TIMEOUT_S)
        exited = time.time()
        left = group_members(ranks[0])  # torchrun starts each rank in its own session
        started.exited()
        reached = started.log().reached
        print(f"[gpu-restart] killed rank {ranks[0]} at update {at}: torchrun exited "
              f"{returncode} after {exited - killed:.2f} s", flush=True)  # fmt: skip
        return (
            {
                "checkpoint_update": ckpt,
                "killed_at_update": reached,
                "polled_update_at_kill": at,
                "kill_to_torchrun_exit_s": round(exited - killed, 3),
                "torchrun_returncode": returncode,
                "rank_group_left_at_exit": len(left),
            },
            killed,
            reached,
        )

    def measure(self, result: dict[str, Any]) -> None:
        """Fill ``result`` step by step (what was measured stays if a later step fails)."""
        cold, _, choose_s = self.start(0)
        result["argv"] = cold.argv
        first = cold.wait_for(cold.first_update, "the first update", START_TIMEOUT_S)
        result["cold_start"] = {
            "choose_resume_s": round(choose_s, 3),
            "start_to_first_update_s": round(first[1] - cold.spawned, 3),
        }
        print(f"[gpu-restart] cold start: first update after "
              f"{first[1] - cold.spawned:.2f} s", flush=True)  # fmt: skip
        current = cold
        crashes: list[dict[str, Any]] = result.setdefault("crashes", [])
        for round_ in range(1, CRASHES + 1):
            crash, killed, reached = self.crash(current)
            crashes.append(crash)
            restarted, began, choose_s = self.start(round_)
            self.timings.append((killed, began, choose_s, reached))
            restarted.wait_for(restarted.first_update, "the first resumed update",
                               START_TIMEOUT_S)  # fmt: skip
            if round_ == CRASHES:  # the last: until it is back where the crash left it
                caught_up = partial(restarted.first_at_least, reached)
                restarted.wait_for(caught_up, f"update {reached} again", PROGRESS_TIMEOUT_S)
                self.stop_all()
            # so far (finish() redoes it from the complete lines)
            so_far = restart_figures(killed, began, choose_s, restarted.log(), reached)
            print(f"[gpu-restart] restart {round_}: {so_far}", flush=True)
            current = restarted

    def finish(self, result: dict[str, Any]) -> None:
        """Every start stopped; the figures from the complete logs."""
        try:
            self.stop_all()
        except (TimeoutError, subprocess.TimeoutExpired) as err:
            result["cleanup_error"] = f"{type(err).__name__}: {err}"
        crashes = result.get("crashes", [])
        for crash, started, timing in zip(crashes, self.starts[1:], self.timings, strict=False):
            crash["restart"] = restart_figures(*timing[:3], started.log(), timing[3])
        logs = [s.log() for s in self.starts]
        steps = [x for log in logs for x in step_seconds(log.updates)]
        spu = round(statistics.median(steps), 4) if steps else None
        result["seconds_per_update"] = spu
        last = self.run.checkpoint_last
        result["checkpoint"] = {
            "bytes": last.stat().st_size if last.exists() else None,
            "snapshot_s": [x for log in logs for x in log.snapshot_s],
            "write_s": [x for log in logs for x in log.write_s],
        }
        if self.run.train_log.exists():
            summary = logparse.summarize_text(self.run.train_log.read_text())
            result["logparse"] = {
                "updates": summary.updates,
                "resumed_at": summary.resumed_at,
                "recomputed_updates": [r.recomputed for r in summary.resumes],
            }
        result["figures"] = figures(crashes, spu)


# what a restart's start-up is made of, each in a fresh process (the page cache warm from the
# run): (name, python code); {ckpt} is checkpoint_last.pt, {device} cuda or cpu
STARTUP_PARTS: tuple[tuple[str, str], ...] = (
    ("interpreter", "pass"),
    ("import_torch", "import torch"),
    ("device_context", "import torch; torch.zeros(1, device='{device}'); "
                       "torch.cuda.synchronize() if '{device}' == 'cuda' else None"),
    ("import_worker", "import hpc_train.worker.train"),
    ("torch_load", "import torch, time; t = time.perf_counter(); "
                   "torch.load('{ckpt}', map_location='cpu', weights_only=False); "
                   "print(f'inner {{time.perf_counter() - t:.3f}}')"),
    ("torch_load_mmap", "import torch, time; t = time.perf_counter(); "
                        "torch.load('{ckpt}', map_location='cpu', weights_only=False, mmap=True); "
                        "print(f'inner {{time.perf_counter() - t:.3f}}')"),
)  # fmt: skip
INNER_RE = re.compile(r"^inner ([\d.]+)$", re.M)


def startup_parts(checkpoint: Path, use_gpu: bool) -> dict[str, dict[str, float]]:
    """Wall seconds of each ``STARTUP_PARTS`` process (and, for a load, the load's own seconds
    inside it): where a restart's start-up goes, besides torchrun and fairseq's setup."""
    out: dict[str, dict[str, float]] = {}
    for name, code in STARTUP_PARTS:
        src = code.format(ckpt=checkpoint, device="cuda" if use_gpu else "cpu")
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                              timeout=EXIT_TIMEOUT_S, check=False)  # fmt: skip
        part = {"wall_s": round(time.perf_counter() - t, 3)}
        inner = INNER_RE.search(done.stdout)
        if inner:
            part["inner_s"] = float(inner.group(1))
        if done.returncode != 0:
            part["returncode"] = done.returncode
        out[name] = part
        print(f"[gpu-restart] start-up part {name}: {part}", flush=True)
    return out


def copy_logs(bench: Bench, dest: Path) -> None:
    """train.log and each start's torchrun output into ``dest`` (the device tool's $OUT)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in [bench.run.train_log, *(s.out for s in bench.starts)]:
        if path.exists():
            shutil.copyfile(path, dest / path.name)


def say_no_gpu(out: Path) -> int:
    """No GPU and no --cpu: say so, keep a GPU result already in ``out``, else record none."""
    print("bench-gpu-restart: no GPU visible here: nothing measured (--cpu: the tiny preset "
          "on a CPU rank)")  # fmt: skip
    old = json.loads(out.read_text()) if out.exists() else {}
    if old.get("gpu"):
        print(f"kept the GPU result in {out}")
    else:
        write_json(out, {"gpu": False, "date": dt.date.today().isoformat()})
    return 0


def wrap_up(bench: Bench, result: dict[str, Any], args: argparse.Namespace, started: float) -> None:
    """After the measurement, even a failed one: the failure and the last start's output tail,
    the figures, the logs and save dir as asked, and the result written."""
    if "error" in result:
        print(f"[gpu-restart] FAILED: {result['error']}", flush=True)
        if bench.starts:
            tail = bench.starts[-1].out.read_text(errors="replace").splitlines()[-40:]
            print("\n".join(tail), flush=True)
    bench.finish(result)
    if args.logs_dir:
        copy_logs(bench, args.logs_dir)
    if not args.keep:
        shutil.rmtree(bench.save, ignore_errors=True)  # checkpoints are GBs
    result["date"] = dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds")
    result["duration_s"] = round(time.time() - started, 1)
    write_json(args.out, result)


def run(args: argparse.Namespace) -> int:
    import torch

    started = time.time()
    use_gpu = torch.cuda.is_available() and not args.cpu
    if not use_gpu and not args.cpu:
        return say_no_gpu(args.out)
    plan = (SMOKE_PLANS if args.smoke else PLANS)["cuda" if use_gpu else "cpu"]
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "gpu": use_gpu,
        "device": "cuda" if use_gpu else "cpu",
        "environment": gpu_measure.environment() if use_gpu else gpu_measure.cpu_environment(),
        "preset": plan.preset,
        "smoke": args.smoke,
    }
    data = gpu_measure.build_corpus(args.data, work / f"corpus-{plan.preset}-x{plan.repeat}",
                                    plan.repeat)  # fmt: skip
    result["corpus"] = f"{args.data.name}: train split repeated {plan.repeat}x"
    shutil.rmtree((work / f"{plan.preset}-save"), ignore_errors=True)
    bench = Bench(plan, data, work, use_gpu)
    result["settings"] = bench.settings()
    status = 0
    # a SIGTERM (a time limit) unwinds through the finally below: no rank outlives this process
    # (torchrun starts each in a session of its own), and what was measured is written
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        bench.measure(result)
        if args.startup_parts:
            result["startup_parts"] = startup_parts(bench.save / "checkpoint_last.pt", use_gpu)
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired, OSError) as err:
        result["error"] = f"{type(err).__name__}: {err}"
        status = 1
    except BaseException as err:
        result["error"] = f"{type(err).__name__}: {err}"
        raise
    finally:
        wrap_up(bench, result, args, started)
    print(table(rows(result)))
    print(json.dumps(result["figures"], indent=1))
    print(f"written {args.out} ({result['duration_s']} s)")
    return status


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(prog="python -m benchmarks.gpu_restart", description=__doc__)
    p.add_argument(
        "--data", type=Path, default=Path(".local/data/demo-bin"), help="binarized demo corpus"
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-restart.json"))
    p.add_argument("--cpu", action="store_true", help="tiny preset on one CPU rank (gloo)")
    p.add_argument(
        "--work-dir", type=Path, default=Path(".local/bench/gpu-restart"),
        help="corpus, save dir, torchrun logs",
    )  # fmt: skip
    p.add_argument("--logs-dir", type=Path, help="copy train.log and torchrun's logs here")
    p.add_argument("--keep", action="store_true", help="keep the save dir (checkpoints)")
    p.add_argument("--startup-parts", action="store_true",
                   help="then time a start-up's parts in fresh processes: imports, the "
                        "device's context, the checkpoint's torch.load (with and without mmap)")  # fmt: skip
    args = report.parse(p, argv, "gpu-restart", {})
    if not (args.data / "dict.txt").is_file():
        p.error(f"--data {args.data}: not a binarized corpus (make demo-data)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
