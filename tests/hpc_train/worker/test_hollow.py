"""The hollow rank (``hpc_train.worker.hollow``, a stand-in for the model, for scale runs only)
under the real torchrun, 2 ranks on localhost (gloo), no Slurm: it keeps the rank's contract,
which is what makes it a fair stand-in: rank 0's ledger events, checkpoints the launcher's own
verification resumes, heartbeats every update, the save on notice with its stop marker, and a
crash report. (Its runs on the real cluster: tests/integration/test_scale.py, bench-scale.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_core import ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_core.wait import FAST, wait_until
from hpc_train.contract import CrashRequest, WorkerEnv, read_beats, write_crash_request
from hpc_train.job.command_lines import HOLLOW_MODULE
from hpc_train.testing import free_port
from hpc_train.worker import checkpoints

pytestmark = pytest.mark.slow  # real torchrun and two rank processes: ~28 s of CPU


def start(save: Path, max_update: int, *extra: str) -> subprocess.Popen[str]:
    """Two hollow ranks under torchrun, as a launcher starts them (its WorkerEnv: start 41:0)."""
    run = RunDir(save)
    worker = WorkerEnv(
        save_dir=save, start=("41", 0), stop_marker=run.stop_marker("41", 0),
        notice_pending=run.notice_pending("41", 0), heartbeat_dir=run.heartbeats("41", 0, "n1"),
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_TRAIN_")}
    env.update(worker.to_env(), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=localhost:{free_port()}", "-m", HOLLOW_MODULE,
           "--save-dir", str(save), "--max-update", str(max_update), "--log-interval", "2",
           "--task", "masked_lm", *extra]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    return out


def events(save: Path, kind: Kind) -> list[ledger.Event]:
    return [e for e in ledger.read(RunDir(save).ledger) if e.kind == kind]


def test_a_hollow_run_keeps_the_ranks_contract_and_resumes_where_it_saved(tmp_path):
    save = tmp_path / "run"
    finish(start(save, 6, "--save-interval-updates", "4"))
    run = RunDir(save)
    assert [e.get("update") for e in events(save, Kind.FIRST_UPDATE)] == [1]
    assert [e.get("update") for e in events(save, Kind.CHECKPOINT)] == [4, 6]
    assert checkpoints.choose_resume(save).at_update == 6  # the launcher's own verification
    beats = read_beats(run.heartbeats("41", 0, "n1"))
    assert sorted(b.rank for b in beats) == [0, 1] and {b.update for b in beats} == {6}
    log = run.train_log.read_text()
    assert "a stand-in for the model" in log and '"num_updates": "6"' in log
    finish(start(save, 9))  # resumed: rank 0 loads, every rank gets it
    assert [e.get("update") for e in events(save, Kind.FIRST_UPDATE)] == [1, 7]
    assert "Loaded checkpoint" in run.train_log.read_text()
    assert checkpoints.choose_resume(save).at_update == 9


def test_a_notice_saves_at_one_update_writes_the_stop_marker_and_ends_well(tmp_path):
    save = tmp_path / "run"
    proc = start(save, 10_000)
    beats = RunDir(save).heartbeats("41", 0, "n1")
    wait_until(lambda: len([b for b in read_beats(beats) if b.update >= 3]) == 2 or None,
               "two ranks past update 3", 90, FAST)  # fmt: skip
    os.kill(read_beats(beats)[1].pid, signal.SIGUSR2)  # one rank has it: every rank agrees
    finish(proc)
    marker = json.loads(RunDir(save).stop_marker("41", 0).read_text())
    (saved,) = events(save, Kind.CHECKPOINT)
    assert saved.get("notice") is True and saved.get("update") == marker["update"] > 3
    assert checkpoints.choose_resume(save).at_update == marker["update"]


def test_a_crash_is_reported_with_the_rank_and_its_update(tmp_path):
    """``chaos JOB crash`` on rank 1 at update 3: its report says so; the run fails."""
    save = tmp_path / "run"
    write_crash_request(RunDir(save), CrashRequest(update=3, rank=1))
    proc = start(save, 50)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    found = [json.loads(p.read_text()) for p in RunDir(save).failure_reports("41", 0)]
    said = {(r["rank"], r["update"], r["type"]) for r in found}
    assert (1, 3, "InjectedCrash") in said, out[-2000:]  # rank 0: its peer's loss, a witness
    assert {r for r in said if r[0] == 0} <= {(0, 3, "RuntimeError"), (0, 3, "DistBackendError")}
