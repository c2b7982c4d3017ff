"""Rehearsals: a tiny run submitted and watched as a user would, for the integration tests and
the benchmarks; and the policy's table of ends. Not part of the product.

``submit_tiny`` submits through the real CLI (``python -m hpc_train.submit``), then
``wait_for_update`` waits on the run's train.log and ``wait_for_event`` on its ledger, each
through ``hpc_core.wait.wait_until`` (a deadline, a steady poll). What rank 0's tracking wrote is
read back raw: ``tensorboard_series`` (the event files record by record), ``wandb_runs`` and
``wandb_history`` (W&B's offline files record by record).

``end_cases`` is one start's end of every cause (``contract.Cause``) in every recovery mode
(a requeue, an in-job round, hot spares): the evidence as ``faults.end_evidence`` would read
it and Slurm's word already given, for ``restart_policy.after_end`` to weigh without a file or
a Slurm call (tests/hpc_train/launch/test_end_policy.py asserts what follows each; ``make
bench-decision`` times them).

No module of ``hpc_train``, ``hpc_core`` or ``nccl_checks`` imports this one: import-linter's
contract "Product code never imports the rehearsal helpers" (pyproject.toml) checks it.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpc_core import ledger, procs
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_core.slurm_env import JOB_ID
from hpc_core.wait import Backoff, wait_until
from hpc_train import contract
from hpc_train.contract import Beat, Cause, StartFiles
from hpc_train.faults.end_evidence import (
    Ended,
    EndEvidence,
    Ending,
    JobWord,
    NodeWord,
    PartitionWord,
    Question,
    SlurmWord,
    Where,
)
from hpc_train.faults.failures import CORRUPT_CHECKPOINT, Failure, NodeExit, Probe
from hpc_train.faults.suspects import Evidence, RankReport, Suspect
from hpc_train.launch.restart_policy import EndOptions, after_end
from hpc_train.launch.transition import AskSlurm
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


def free_port() -> int:
    """A port the kernel hands out now (bound to port 0, then let go), for a server the test
    starts at once (torchrun's rendezvous, Prometheus): never a fixed range, which the suite's
    xdist workers would each count from the same first port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


# --- the policy's table: one end of each cause in each recovery mode ----------------------------

MODES = ("requeue", "in-job", "spares")  # no in-job restarts; --restart-in-job; --spares 1
HOSTS = ("n1", "n2")  # task 0 on n1; n2 is the node each end points to
UPDATES = 100


@dataclass(frozen=True)
class EndCase:
    """One end for the policy: its ``cause`` in recovery ``mode``, the evidence and options."""

    cause: Cause
    mode: str
    evidence: EndEvidence
    options: EndOptions


def _word(partition: dict[str, str] | None = None) -> SlurmWord:
    """Slurm's word, given: the job running, every node up on its own machine, a step still
    starting on n2, four idle nodes in the partition."""
    nodes = {n: NodeWord("ALLOCATED", "", f"10.0.0.{n[1]}", 1.0) for n in ("n1", "n2", "n3")}
    states = partition or {f"n{i}": "idle" for i in range(1, 5)}
    return SlurmWord(JobWord("RUNNING", 0), nodes, {n: 1 for n in nodes}, {"n2": (True, 1.0)},
                     20.0, PartitionWord(states))  # fmt: skip


def _beats(*ranks: tuple[int, str, int]) -> dict[str, tuple[Beat, ...]]:
    """Each node's heartbeats: (rank, node, update)."""
    out: dict[str, tuple[Beat, ...]] = {h: () for h in HOSTS}
    for rank, node, update in ranks:
        out[node] = (*out[node], Beat(rank, node, 100 + rank, update, 1.0))
    return out


def _exited(cause: Cause, root: Path) -> dict[str, Any]:
    """The evidence fields of torchrun's end on task 0 for ``cause`` (the save dir ``root``)."""
    crashed = (NodeExit(0, "n1", 1), NodeExit(1, "n2", -9))
    failed = (NodeExit(0, "n1", 1), NodeExit(1, "n2", 1))
    beats = _beats((0, "n1", 40), (1, "n2", 40))
    report = {
        Cause.INFRASTRUCTURE: Failure(
            1, 40, "DistBackendError", "NCCL error: unhandled cuda error"
        ),
        Cause.USER_ERROR: Failure(0, 40, "ValueError", "bad batch"),
        Cause.STORAGE: Failure(  # the message: the errno only in the chain
            0,
            40,
            "CheckpointWriteError",
            "a background checkpoint write failed: RuntimeError: "
            "[enforce fail at inline_container.cc:672] . unexpected pos 2082368 vs 2082256",
            errno.ENOSPC,
            str(root / "checkpoint_1_40.pt"),
            (
                "CheckpointWriteError: a background checkpoint write failed",
                "OSError: [Errno 28] No space left on device",
            ),
            "n1",
        ),
        Cause.CHECKPOINT: Failure(
            0,
            0,
            CORRUPT_CHECKPOINT,
            "checkpoint_last.pt failed verification (CRC32 mismatch in archive/data/3)",
        ),
    }.get(cause)
    hang = tuple(RankReport(r, n, 40, 1.0, n == "n1") for r, n in ((0, "n1"), (1, "n2")))
    fields: dict[str, dict[str, Any]] = {
        Cause.FINISHED: {"ended": Ended(0, False), "beats": _beats((0, "n1", UPDATES))},
        Cause.NOTICE: {"ended": Ended(0, True), "beats": beats},
        Cause.CRASH: {"ended": Ended(1, False), "beats": beats, "exits": crashed},
        Cause.NO_NODES: {"ended": Ended(1, False), "beats": beats, "exits": crashed},
        Cause.HANG: {"ended": Ended(-9, False, hang="no update for 300 s"), "beats": beats,
                     "hang_ranks": hang, "hang_reported": HOSTS},
        Cause.STRAGGLER: {"ended": Ended(0, True, evicted=Suspect(
            "n2", "computes an update in 1.40x the median", Evidence.STRAGGLER)), "beats": beats},
        Cause.CANCELLED: {"ended": Ended(1, False), "signals": ("SIGTERM",), "beats": beats,
                          "exits": failed},
    }  # fmt: skip
    if report is not None:
        full = tuple(Probe(n, root, 4096, 10, errno.ENOSPC, "OSError: [Errno 28] No space left "
                           "on device") for n in HOSTS)  # fmt: skip
        return {
            "ended": Ended(1, False),
            "beats": beats,
            "exits": failed,
            "failures": (report,),
            **({"probes": full, "needed": 4_200_000} if cause == Cause.STORAGE else {}),
        }
    return fields[cause]


ENDINGS = {Cause.BAD_NODE: Ending.REFUSED, Cause.NO_PROGRESS: Ending.NO_PROGRESS,
           Cause.GROW: Ending.NOTICE}  # fmt: skip


def end_case(root: Path, cause: Cause, mode: str) -> EndCase:
    """The end of ``cause`` in ``mode`` on task 0 of job 41's first start (run dir ``root``,
    never read): n2's machine was blamed once before (a blame on it drains it), and for
    ``NO_NODES`` the partition has n2 drained beside n1 and the run needs two nodes."""
    files = StartFiles(RunDir(root), "41", 0)
    standby = ("n3",) if mode == "spares" else ()
    where = Where(files, 0, HOSTS, len(HOSTS), standby, "n1", 0)
    earlier = ledger.Event(Kind.BLAMED, 0.5, "40", 0, {"node": "n2", "machine": "10.0.0.2"})
    partition = {"n1": "idle", "n2": "drained"} if cause == Cause.NO_NODES else None
    fields: dict[str, Any] = {"events": (earlier,), "slurm": _word(partition)}
    ending = ENDINGS.get(cause, Ending.EXITED)
    if ending is Ending.EXITED:
        fields.update(_exited(cause, root))
    elif ending is Ending.REFUSED:
        fields.update(detail="n2: GPU check failed: GPU 3: 2 uncorrectable ECC errors",
                      nodes=("n2",))  # fmt: skip
    elif ending is Ending.NO_PROGRESS:
        fields["detail"] = "3 restarts in a row resumed from update 40"
    else:
        fields.update(saved=True, own_cause=Cause.GROW, beats=_beats((0, "n1", 40)))
    options = EndOptions(UPDATES, 20, mode != "requeue", 2 if cause == Cause.NO_NODES else 1,
                         True, "no", None)  # fmt: skip
    return EndCase(cause, mode, EndEvidence(ending, where, 2.0, **fields), options)


def end_cases(root: Path) -> list[EndCase]:
    """Every cause in every mode (``end_case``)."""
    return [end_case(root, cause, mode) for cause in Cause for mode in MODES]


def on_task(case: EndCase, task: int) -> EndCase:
    """``case`` as task ``task`` of its round meets it."""
    where = replace(case.evidence.where, task=task, node=HOSTS[task])
    return replace(case, evidence=replace(case.evidence, where=where))


def questions(case: EndCase) -> list[Question]:
    """What the policy asks of Slurm for ``case`` when none of Slurm's word is given yet, each
    answered in turn from the case's own (as ``recovery.what_follows`` answers with
    ``end_evidence.ask``), until it decides."""
    full, word, asked = case.evidence.slurm, SlurmWord(), []
    while isinstance(found := after_end(replace(case.evidence, slurm=word), case.options),
                     AskSlurm):  # fmt: skip
        q = found.question
        asked.append(q)
        word = replace(
            word, job=full.job if q.job else word.job,
            nodes={**word.nodes, **{n: full.nodes[n] for n in q.nodes}},
            steps={**word.steps, **{n: full.steps[n] for n in q.steps}},
            slurmd_timeout_s=full.slurmd_timeout_s if q.slurmd_timeout else word.slurmd_timeout_s,
            partition=full.partition if q.partition else word.partition,
        )  # fmt: skip
    return asked
