"""hpc_train.contract: what crosses between the launcher and its ranks, round-tripped. Pure file
I/O and dictionaries, milliseconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc_core.rundir import RunDir
from hpc_train import contract
from hpc_train.contract import StartDecision, StopMarker, WorkerEnv


def test_the_workers_environment_round_trips_through_its_variables():
    sent = WorkerEnv(
        save_dir=Path("/run"), start=("41", 2), stop_marker=Path("/run/.hpc-train/s.json"),
        heartbeat_dir=Path("/run/hb"), sync_save=True, local_save_dir=Path("/scratch/r"),
        auto_interval=(7200.0, 1.5),
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
