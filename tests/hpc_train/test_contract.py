"""hpc_train.contract: what crosses between the launcher and its ranks, round-tripped. Pure file
I/O and dictionaries, milliseconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_train import contract
from hpc_train.contract import StartDecision, StopMarker, WorkerEnv


def test_the_workers_environment_round_trips_through_its_variables():
    sent = WorkerEnv(
        save_dir=Path("/run"), start=("41", 2), stop_marker=Path("/run/.hpc-train/s.json"),
        heartbeat_dir=Path("/run/hb"), sync_save=True, local_save_dir=Path("/scratch/r"),
        auto_interval=(7200.0, 1.5), bell=contract.LauncherBell(Path("/run/b"), "n1", "41-2"),
    )  # fmt: skip
    env = sent.to_env()
    assert all(name.startswith("HPC_TRAIN_") for name in env)
    assert WorkerEnv.from_env(env) == sent
    assert WorkerEnv.from_env({}) == WorkerEnv()  # a rank started by hand: nothing given
    with pytest.raises(ValueError, match="JOB:RESTART"):
        WorkerEnv.from_env({contract.START: "41"})


def test_stop_marker_round_trips_and_is_written_whole(tmp_path):
    run = RunDir(tmp_path)
    assert contract.read_stop(run, "12", 3) is None
    contract.write_stop(run.stop_marker("12", 3), StopMarker(57, "SIGUSR2", time=1.5))
    assert contract.read_stop(run, "12", 3) == StopMarker(57, "SIGUSR2", 1.5)
    assert json.loads(run.stop_marker("12", 3).read_text())["update"] == 57
    assert [p.name for p in run.state.iterdir()] == ["stopped-12-3.json"]  # no temporaries


def test_rank_0s_stop_marker_rings_task_0s_launcher(tmp_path):
    """The marker written, the bell the launcher gave its ranks (``WorkerEnv.bell``) is rung:
    task 0's launcher, waiting for the marker, looks at once (a real UDP bell on loopback,
    ``hpc_core.doorbell``; ``localhost`` resolves as a Slurm node name does). A bell that is
    not one is refused by name."""
    from hpc_core import doorbell

    bell = doorbell.Bell(tmp_path / "bells", "localhost", "41-0")
    try:
        ringing = contract.LauncherBell(tmp_path / "bells", "localhost", "41-0")
        contract.write_stop(tmp_path / "stop.json", StopMarker(57, "SIGUSR2"), ringing)
        assert (tmp_path / "stop.json").exists() and bell.nap(30) is True
    finally:
        bell.close()
    with pytest.raises(ValueError, match="not a launcher's bell"):
        WorkerEnv.from_env({contract.BELL: '{"node": "n1"}'})


def test_start_decision_round_trips_with_its_geometry(tmp_path):
    run = RunDir(tmp_path)
    decision = StartDecision(["--continue-once", "/x/checkpoint_1_5.pt"], 5, "fallback", 8, True,
                             16, 64, 2)  # fmt: skip
    contract.write_decision(run, "9", 0, decision)
    assert contract.read_decision(run, "9", 0) == decision
    assert contract.read_decision(run, "9", 1) is None


def test_node_reports_are_read_only_once_every_node_wrote_one(tmp_path):
    run = RunDir(tmp_path)
    contract.write_node_report(run, "9", 0, contract.NodeReport(0, "n1", 8))
    assert contract.read_node_reports(run, "9", 0, nodes=2) is None
    contract.write_node_report(run, "9", 0, contract.NodeReport(1, "n2", 7))
    assert [r.gpus for r in contract.read_node_reports(run, "9", 0, nodes=2) or []] == [8, 7]


def test_a_starts_files_are_its_rounds_own_and_its_job_stays_the_jobs_id(tmp_path):
    """``StartFiles`` binds a start's key once: round 2 of job 41's restart 1 reads and writes
    the files named ``41.2``, its ``job`` is 41 (the ledger's and Slurm's), its ranks are told
    ``41.2:1``; the files it reads are those the readers by key read (one file, two doors)."""
    run = RunDir(tmp_path)
    files = contract.StartFiles(run, "41", 1, round=2)
    assert (files.job, files.name, files.ranks_start) == ("41", "41.2", ("41.2", 1))
    assert files.stop_marker == run.stop_marker("41.2", 1)
    assert files.notice_pending == run.notice_pending("41.2", 1)
    assert files.incident == run.incident("41.2", 1)
    assert files.heartbeats("n2") == run.heartbeats("41.2", 1, "n2")
    assert contract.StartFiles(run, "41", 1).name == "41"  # an allocation's first round
    verdict = contract.RoundVerdict(contract.RoundAction.RESTART_IN_JOB, "crash", ["n1"], ["n3"])
    files.write_verdict(verdict)
    assert files.verdict() == verdict == contract.read_verdict(run, "41.2", 1)
    assert contract.StartFiles(run, "41", 1, round=1).verdict() is None  # another round's
    contract.write_stop(files.stop_marker, StopMarker(5, "SIGUSR2", time=1.0))
    assert files.stop() == StopMarker(5, "SIGUSR2", 1.0)
    files.write_node_report(contract.NodeReport(0, "n1", 8))
    assert files.node_reports(1) == contract.read_node_reports(run, "41.2", 1, 1)
    beat = contract.LauncherBeat(1, "n2", 7, 3.0)
    files.write_launcher_beat(beat)
    assert files.launcher_beat(1) == beat and files.launcher_beat(0) is None


def test_the_round_before_is_this_starts_last_round_else_the_last_of_the_start_before(tmp_path):
    """``StartFiles.round_before``: round 2's is round 1 of the same start; a requeued start's
    first round's is the last round of the start before, as the ledger's ``restarted`` says."""
    run = RunDir(tmp_path)
    assert contract.StartFiles(run, "41", 0).round_before([]) is None  # the job's first round
    assert contract.StartFiles(run, "41", 0, 2).round_before([]) == contract.StartFiles(
        run, "41", 0, 1
    )
    ledger.record(run.ledger, ledger.Kind.RESTARTED, "41", 0, round=1)
    ledger.record(run.ledger, ledger.Kind.RESTARTED, "41", 0, round=2)
    events = ledger.read(run.ledger)
    requeued = contract.StartFiles(run, "41", 1)
    assert requeued.round_before(events) == contract.StartFiles(run, "41", 0, 2)
    assert requeued.previous_start(events) == contract.StartFiles(run, "41", 0, 2)
    assert contract.StartFiles(run, "41", 1, 1).round_before(events) == requeued


def test_the_tracking_variables_round_trip_and_a_bad_one_is_refused():
    wandb = contract.WandbRun("roberta", "hpc-0123456789abcdef", "large", "offline", "lab")
    sent = WorkerEnv(save_dir=Path("/run"), tensorboard=Path("/run/tensorboard"), wandb=wandb)
    env = sent.to_env()
    assert env[contract.TENSORBOARD] == "/run/tensorboard"
    assert WorkerEnv.from_env(env) == sent
    with pytest.raises(ValueError, match="not a W&B run"):
        WorkerEnv.from_env({contract.WANDB: '{"project": "p"}'})


def test_the_tracking_record_round_trips_and_a_cut_one_reads_as_none(tmp_path):
    run = RunDir(tmp_path)
    assert contract.read_tracking(run) is None
    wandb = contract.WandbRun("roberta", "hpc-0123456789abcdef", "large", "online")
    record = contract.TrackingRecord("/run/tensorboard", wandb, "https://wandb.ai/x", "/run/w")
    contract.write_tracking(run, record)
    assert contract.read_tracking(run) == record
    run.tracking_record.write_text('{"tensorboard": "/run/t')
    assert contract.read_tracking(run) is None
