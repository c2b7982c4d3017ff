"""Rehearsals: a tiny run submitted and watched as a user would, for the integration tests and
the benchmarks. Not part of the product.

``submit_tiny`` submits through the real CLI (``python -m hpc_train.submit``), then
``wait_for_update`` waits on the run's train.log and ``wait_for_event`` on its ledger, each
through ``hpc_core.wait.wait_until`` (a deadline, a steady poll). What rank 0's tracking wrote is
read back raw: ``tensorboard_series`` (the event files record by record), ``wandb_runs`` and
``wandb_history`` (W&B's offline files record by record).

No module of ``hpc_train``, ``hpc_core`` or ``nccl_checks`` imports this one: import-linter's
contract "Product code never imports the rehearsal helpers" (pyproject.toml) checks it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpc_core import ledger, procs
from hpc_core.rundir import RunDir
from hpc_core.slurm_env import JOB_ID
from hpc_core.wait import Backoff, wait_until
from hpc_train import contract
from hpc_train.runs import follow

STEADY = Backoff(0.5, 1.0, 0.5)  # rehearsals poll at a steady 0.5 s


def submit_tiny(
    data: Path,
    save: Path,
    max_update: int,
    name: str,
    nodes: str = "2",
    options: Sequence[str] = (),
    fairseq: Sequence[str] = (),
    env: dict[str, str] | None = None,
    time_min: int = 10,
    pace_s: float = 0.0,
) -> str:
    """Submit the tiny preset on CPU nodes through the real CLI (``python -m hpc_train.submit``
    with ``options``, then ``-- fairseq``); the job id. RuntimeError with the CLI's error.
    ``pace_s``: every update takes at least that long (``chaos JOB pace``, asked before the
    submission: a run sized in seconds, not for the fastest machine)."""
    contract.ask_pace(RunDir(save), pace_s)
    cmd = [
        sys.executable, "-m", "hpc_train.submit", "--preset", "tiny", "--nodes", nodes,
        "--gpus-per-node", "0", "--data", str(data), "--save-dir", str(save),
        "--max-update", str(max_update), "--time", str(time_min), "--job-name", name, *options,
    ]  # fmt: skip
    if fairseq:
        cmd += ["--", *fairseq]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )
    found = re.search(r"submitted job (\d+)", proc.stdout)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"submit failed: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return found.group(1)


def job_alive(job_id: str, **env: str) -> bool:
    """Does a process on this host belong to ``job_id`` (``SLURM_JOB_ID`` in its environment,
    and each of ``env``, e.g. ``SLURM_PROCID="2"``: one task's; ``hpc_core.procs``)? The
    launchers, torchrun and the ranks of every emulated node run here."""
    return next(procs.carrying({JOB_ID: job_id, **env}), None) is not None


def wait_for_update(run: RunDir, update: int, timeout: float, backoff: Backoff = STEADY) -> int:
    """Wait until train.log shows ``update`` trained; the highest update logged by then."""

    def reached() -> int | None:
        n = follow.run_summary(run).updates
        return n if n >= update else None

    return wait_until(reached, f"update {update} in {run.root}", timeout, backoff)


def wait_for_event(
    run: RunDir,
    what: str,
    match: Callable[[ledger.Event], bool],
    timeout: float | None,
    backoff: Backoff = STEADY,
) -> ledger.Event:
    """Wait until the run's ledger holds an event ``match`` accepts; the first such event.
    ``match`` may raise to give up early (the job ended without it)."""

    def found() -> ledger.Event | None:
        return next((e for e in ledger.read(run.ledger) if match(e)), None)

    return wait_until(found, what, timeout, backoff)


# --- what rank 0's tracking wrote, read back raw (--tensorboard, --wandb-project) ---------------

Point = tuple[int, float | str]  # (step, a scalar's value or a text)


def event_files(folder: Path) -> list[Path]:
    """A TensorBoard folder's event files in the order they were opened (the name's seconds,
    then its counter: ``events.out.tfevents.<seconds>.<host>.<pid>.<n>``)."""

    def opened(path: Path) -> tuple[int, int]:
        parts = path.name.split(".")
        return int(parts[3]), int(parts[-1])

    return sorted(folder.glob("events.out.tfevents.*"), key=opened)


def tensorboard_series(logdir: Path) -> dict[tuple[str, str], list[Point]]:
    """Every point of every tag under ``logdir``, by (folder, tag), in file order: each event
    file read record by record (tensorboard's raw TFRecord reader; no accumulator, which drops
    steps itself), scalars as their ``simple_value``, texts as their string."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    series: dict[tuple[str, str], list[Point]] = {}
    for folder in sorted({p.parent for p in logdir.rglob("events.out.tfevents.*")}):
        name = str(folder.relative_to(logdir))
        for path in event_files(folder):
            for event in LegacyEventFileLoader(str(path)).Load():
                for value in event.summary.value:
                    said: float | str = value.simple_value
                    if value.metadata.plugin_data.plugin_name == "text":
                        said = value.tensor.string_val[0].decode()
                    series.setdefault((name, value.tag), []).append((event.step, said))
    return series


WANDB_BLOCK = 32768  # W&B's offline file: LevelDB's log format, blocks of 32 KiB
WANDB_HEADER = b":W&B\xe1\xbe\x00"  # its first 7 bytes: ident, magic 0xBEE1, version 0


def wandb_records(path: Path) -> list[Any]:
    """The records of a W&B offline file (``run-<id>.wandb``), in order, each a
    ``wandb_internal_pb2.Record``: the LevelDB log format W&B writes (7-byte header, blocks of
    32 KiB, each chunk with its CRC32 over its type and data, checked), parsed here as W&B no
    longer ships a reader."""
    import zlib

    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    if not raw.startswith(WANDB_HEADER):
        raise ValueError(f"{path}: not a W&B offline file")
    records, pending, at = [], b"", len(WANDB_HEADER)
    while at + 7 <= len(raw):
        room = WANDB_BLOCK - at % WANDB_BLOCK
        if room < 7:  # a block's tail too short for a header: zero padding
            at += room
            continue
        crc, length, kind = int.from_bytes(raw[at : at + 4], "little"), 0, raw[at + 6]
        length = int.from_bytes(raw[at + 4 : at + 6], "little")
        data = raw[at + 7 : at + 7 + length]
        if kind == 0 and length == 0:  # the writer's padding, up to the next block
            at += room
            continue
        if zlib.crc32(data, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: a record at byte {at} fails its CRC32")
        pending = data if kind in (1, 2) else pending + data  # full, first | middle, last
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))  # type: ignore[attr-defined]
        at += 7 + length
    return records


def wandb_history(path: Path) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    """(the run id, each history row as (step, {key: value})) of a W&B offline file."""
    import json

    run_id, rows = "", []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            rows.append((record.history.step.num, items))
    return run_id, rows


def wandb_runs(
    root: Path, starts: int, timeout: float
) -> list[tuple[str, list[tuple[int, dict[str, Any]]]]]:
    """``wandb_history`` of each offline folder under ``root`` (``RunDir.wandb``), oldest first,
    once there are ``starts`` of them and each has its exit record: W&B's service process
    writes the file after the run's ``finish()`` has returned."""

    def files() -> list[Path] | None:
        found = sorted(root.glob("offline-run-*/run-*.wandb"), key=lambda p: p.parent.name)
        done = [p for p in found if any(r.HasField("exit") for r in wandb_records(p))]
        return found if len(found) == starts and len(done) == starts else None

    return [wandb_history(path) for path in wait_until(files, f"{starts} W&B runs", timeout)]
