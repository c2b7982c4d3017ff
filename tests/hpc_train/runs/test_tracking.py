"""Where a run's curves are (``hpc_train.runs.tracking``), as ``hpc-train status RUN``, ``logs``
and the end-of-run report print it: from rank 0's record (``contract.TrackingRecord``), written
here as rank 0 writes it."""

from __future__ import annotations

import pytest

from hpc_core import ledger, slurm
from hpc_train import contract
from hpc_train.contract import TrackingRecord, WandbRun
from hpc_train.runs import follow, index, logparse, logs, status, tracking
from tests.hpc_train.runs.test_status import make_run

WANDB = WandbRun("roberta", "hpc-0123456789abcdef", "large", "offline", "lab")


@pytest.fixture
def tracked(tmp_path, monkeypatch):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    run = make_run(tmp_path / "large", "11", 100, finished=True)
    said = {"11": slurm.JobState("11", "GONE", 0, "", "")}
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: said)
    record = TrackingRecord(str(run.tensorboard), WANDB, None, str(run.wandb / "offline-run-1"))
    contract.write_tracking(run, record)
    return run


def test_the_lines_say_the_tensorboard_command_and_the_w_and_b_run(tracked):
    assert tracking.lines(tracked) == [
        f"tensorboard: tensorboard --logdir {tracked.tensorboard}",
        f"W&B: run large (id hpc-0123456789abcdef) in lab/roberta, offline: wandb sync "
        f"{tracked.wandb}/offline-run-*",
    ]
    online = TrackingRecord(
        None, WandbRun("p", "hpc-1", "r", "online"), "https://wandb.ai/u/p/runs/hpc-1"
    )
    contract.write_tracking(tracked, online)
    assert tracking.lines(tracked) == [
        "W&B: run r (id hpc-1) in p, https://wandb.ai/u/p/runs/hpc-1"
    ]


def test_a_run_without_tracking_says_nothing_of_it(tmp_path):
    run = make_run(tmp_path / "plain", "12", 10, finished=True)
    assert tracking.lines(run) == []


def test_status_logs_and_the_report_point_to_the_curves(tracked, capsys):
    assert status.main([str(tracked.root)]) == 0
    out = capsys.readouterr().out
    assert f"tensorboard --logdir {tracked.tensorboard}" in out and "id hpc-0123456789abcdef" in out
    assert logs.main([str(tracked.root)]) == 0
    printed = capsys.readouterr()
    assert "tensorboard --logdir" in printed.err and "tensorboard" not in printed.out
    report = follow.report(logparse.summarize([]), tracked, 100, "COMPLETED")
    assert report.splitlines()[-2:] == [f"  {line}" for line in tracking.lines(tracked)]
