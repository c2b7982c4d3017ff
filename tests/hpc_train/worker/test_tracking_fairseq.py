"""Rank 0's tracking in real fairseq training (one CPU process, no Slurm: ``run_tiny``): the
worker wraps fairseq's own progress bar. A run to update 12 (saves at 5 and 10), then a resume
from the save at 10, as after a crash, to update 20: updates 11 and 12 are trained twice and
train.log says so twice, but the event files and W&B hold each once, with its first value."""

from __future__ import annotations

import shutil

import pytest

from hpc_core.rundir import RunDir
from hpc_train import testing
from hpc_train.contract import TENSORBOARD, WANDB, WandbRun
from hpc_train.runs import follow

RUN_ID = "hpc-fairseq012345678"


def test_a_resume_from_an_older_save_draws_no_update_twice(corpus, tiny_run, tmp_path, monkeypatch):
    save = tmp_path / "run"
    run = RunDir(save)
    monkeypatch.setenv(TENSORBOARD, str(run.tensorboard))
    monkeypatch.setenv(WANDB, WandbRun("tests", RUN_ID, "run", "offline").to_json())
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    per_update = ("--log-interval", "1", "--save-interval-updates", "5")
    tiny_run(corpus, save, 12, *per_update)
    shutil.copyfile(save / "checkpoint_1_10.pt", run.checkpoint_last)  # back to update 10
    tiny_run(corpus, save, 20, *per_update)

    logged = follow.run_summary(run).losses  # train.log: every line, the recomputed ones twice
    assert [n for n, _ in logged] == [*range(1, 13), *range(11, 21)]
    first = {}
    for n, loss in logged:
        first.setdefault(n, loss)
    series = testing.tensorboard_series(run.tensorboard)
    drawn = series[("train_inner", "loss")]
    assert [n for n, _ in drawn] == list(range(1, 21))  # strictly increasing, none twice
    assert [v for _, v in drawn] == pytest.approx([first[n] for n in range(1, 21)], rel=1e-6)
    for (folder, tag), points in series.items():
        steps = [s for s, _ in points]
        assert steps == sorted(set(steps)), (folder, tag)
    histories = testing.wandb_runs(run.wandb, 2, timeout=60)
    assert {run_id for run_id, _ in histories} == {RUN_ID}
    steps = [s for _, rows in histories for s, row in rows if "train_inner/loss" in row]
    assert steps == list(range(1, 21))
