"""Rank 0's tracking (``hpc_train.worker.tracking``) with the real writers: torch's TensorBoard
event writer and W&B in offline mode, read back raw (``hpc_train.testing``: the event files
record by record, W&B's offline file record by record). What is not real here: the log calls
come from the test, as fairseq's training loop makes them (its stats dicts, its tags and steps),
and the ledger is written by the test as the launcher would (two starts, a crash between them);
``test_tracking_fairseq.py`` and ``tests/integration/test_tracking_on_slurm.py`` run the real
loop."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hpc_core import ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train import contract, testing
from hpc_train.contract import WandbRun, WorkerEnv
from hpc_train.worker import tracking

T0 = 1_700_000_000.0
CRASHED_AT, RESUMED_AT, LAST = 25, 20, 40
RUN_ID = "hpc-test0123456789ab"


@pytest.fixture(autouse=True)
def wandb_offline(monkeypatch):
    """No key and no network needed: W&B offline; its service process ended after the test."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield
    import wandb

    wandb.teardown()


def worker_env(run: RunDir, start: tuple[str, int]) -> WorkerEnv:
    said = WandbRun(project="tests", run_id=RUN_ID, name="run", mode="offline")
    return WorkerEnv(save_dir=run.root, start=start, tensorboard=run.tensorboard, wandb=said)


def first_start(run: RunDir) -> None:
    """The ledger of a first start on two nodes, saved at 10 and 20, as the launcher and
    rank 0 write it."""
    ledger.record(run.ledger, Kind.SUBMITTED, "7", 0, T0, nodes="2", max_update=LAST)
    ledger.record(run.ledger, Kind.STARTED, "7", 0, T0 + 10, nodes=["n1", "n2"], world=2,
                  update_freq=1, resume_at=0, previous="first start")  # fmt: skip
    ledger.record(run.ledger, Kind.FIRST_UPDATE, "7", 0, T0 + 20, update=1)
    for n, update in enumerate((10, 20)):
        ledger.record(run.ledger, Kind.CHECKPOINT, "7", 0, T0 + 30 + n, update=update,
                      seconds=0.5, bytes=2_000_000_000, notice=False)  # fmt: skip


def crash_and_restart(run: RunDir) -> None:
    """Rank 0 crashed after update 25; task 0 restarted in the job on one node from 20."""
    ledger.record(run.ledger, Kind.STOPPED, "7", 0, T0 + 60, cause="crash",
                  why="torchrun exited with 1", reached=CRASHED_AT, last_progress=T0 + 55)  # fmt: skip
    ledger.record(run.ledger, Kind.RESTARTED, "7", 0, T0 + 65, why="crash: ...", members=["n1"],
                  left_out=["n2"], round=1)  # fmt: skip
    # the launcher names the Slurm job; its ranks are told the round ("7.1": worker_env below)
    ledger.record(run.ledger, Kind.STARTED, "7", 0, T0 + 70, nodes=["n1"], world=1,
                  update_freq=2, resume_at=RESUMED_AT,
                  previous="in-job restart after crash: torchrun exited with 1")  # fmt: skip


def train(tracker: tracking.Tracker, first: int, last: int, offset: float) -> None:
    """fairseq's log calls for updates ``first``..``last``: each update's train_inner
    figures, a validation every 10 updates."""
    for step in range(first, last + 1):
        stats = {"loss": offset + step, "wps": 100.0, "num_updates": step, "lr": 1e-4}
        tracker.log("train_inner", step, stats)
        if step % 10 == 0:
            tracker.log("valid", step, {"loss": offset - step, "num_updates": step})


@pytest.fixture
def two_starts(tmp_path) -> tuple[RunDir, tracking.Tracker]:
    """A first start logs updates 1-25 and crashes; the second resumes from 20 and logs
    21-40 (values 1000 + update: a recomputed update's second value is told apart)."""
    run = RunDir(tmp_path / "run")
    first_start(run)
    now = [T0 + 40]
    one = tracking.open_tracker(run, worker_env(run, ("7", 0)), clock=lambda: now[0])
    train(one, 1, CRASHED_AT, offset=0.0)
    one.close()  # the crash: what was flushed is on disk
    crash_and_restart(run)
    now[0] = T0 + 80
    two = tracking.open_tracker(run, worker_env(run, ("7.1", 0)), clock=lambda: now[0])
    train(two, RESUMED_AT + 1, LAST, offset=1000.0)
    two.close()
    return run, two


def test_each_tag_is_one_strictly_increasing_series_and_recomputed_updates_keep_their_first_values(
    two_starts,
):
    run, second = two_starts
    series = testing.tensorboard_series(run.tensorboard)
    for (folder, tag), points in series.items():
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps)), (folder, tag, steps)  # strictly increasing
    loss = series[("train_inner", "loss")]
    assert loss == [(s, float(s)) for s in range(1, CRASHED_AT + 1)] + [
        (s, 1000.0 + s) for s in range(CRASHED_AT + 1, LAST + 1)
    ]
    assert [s for s, _ in series[("valid", "loss")]] == [10, 20, 30, 40]
    assert second.skipped == CRASHED_AT - RESUMED_AT  # 21-25: not logged again
    assert contract.read_steps(run)["train_inner"] == LAST


def test_the_restart_is_one_point_at_its_update_with_its_cause(two_starts):
    run, _ = two_starts
    series = testing.tensorboard_series(run.tensorboard)
    assert series[("restarts", "restarts")] == [(RESUMED_AT, 1.0)]
    assert series[("restarts", "recomputed_updates")] == [(RESUMED_AT, 5.0)]
    ((step, text),) = series[("restarts", "cause/text_summary")]
    assert step == RESUMED_AT and isinstance(text, str)
    assert text.startswith("restart 1 at update 20: crash; in-job restart after crash")
    assert "updates 21-25 recomputed, their first values kept" in text


def test_the_toolkits_figures_follow_the_ledger(two_starts):
    run, _ = two_starts
    series = testing.tensorboard_series(run.tensorboard)
    nodes = dict(series[("hpc-train", "run/nodes")])
    assert nodes[1] == 2.0 and nodes[LAST] == 1.0  # two nodes, then one after the restart
    restarts = dict(series[("hpc-train", "run/restarts")])
    assert restarts[CRASHED_AT] == 0.0 and restarts[CRASHED_AT + 1] == 1.0
    assert dict(series[("hpc-train", "run/recomputed_updates")])[LAST] == 5.0
    assert dict(series[("hpc-train", "checkpoint/last_gb")])[LAST] == 2.0
    # the first start's clock: 40 s from submission, 10 s of queue, 10 s of start-up
    assert dict(series[("hpc-train", "seconds/queue")])[1] == pytest.approx(10.0)
    assert dict(series[("hpc-train", "seconds/start_up")])[1] == pytest.approx(10.0)
    ettr = dict(series[("hpc-train", "goodput/ettr")])
    assert 0 < ettr[LAST] < 1


def test_wandb_writes_one_folder_per_start_with_the_same_run_id(two_starts):
    run, _ = two_starts
    histories = testing.wandb_runs(run.wandb, 2, timeout=60)
    folders = sorted(run.wandb.glob("offline-run-*"))
    assert [run_id for run_id, _ in histories] == [RUN_ID, RUN_ID]
    loss = [(step, row["train_inner/loss"]) for _, rows in histories for step, row in rows
            if "train_inner/loss" in row]  # fmt: skip
    assert [s for s, _ in loss] == list(range(1, LAST + 1))  # one run, no step twice
    assert dict(loss)[CRASHED_AT] == CRASHED_AT  # the first value kept
    _, second = histories[1]
    step, row = second[0]  # the restart goes with the second start's first log
    assert step == CRASHED_AT + 1 and row["restarts/update"] == RESUMED_AT
    assert row["restarts/cause"] == "crash" and row["restarts/recomputed_updates"] == 5
    said = contract.read_tracking(run)
    assert said is not None and said.wandb is not None and said.wandb.run_id == RUN_ID
    assert said.url is None and said.wandb_dir == str(folders[1])  # offline: no URL
    assert said.tensorboard == str(run.tensorboard)


def test_a_writer_that_fails_is_left_off_and_the_other_goes_on(tmp_path, caplog):
    """The TensorBoard logdir's parent is a file (a real ENOTDIR from the writer): TensorBoard
    is said once and left off, W&B still gets every update, nothing raises."""
    run = RunDir(tmp_path / "run")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    said = WandbRun(project="tests", run_id=RUN_ID, name="run", mode="offline")
    worker = WorkerEnv(save_dir=run.root, tensorboard=blocker / "tb", wandb=said)
    tracker = tracking.open_tracker(run, worker)
    with caplog.at_level(logging.WARNING):
        train(tracker, 1, 3, offset=0.0)
    tracker.close()
    warned = [r.message for r in caplog.records if "TensorBoard failed" in r.message]
    assert len(warned) == 1 and tracker.tensorboard is None
    ((_, rows),) = testing.wandb_runs(run.wandb, 1, timeout=60)
    assert [step for step, row in rows if "train_inner/loss" in row] == [1, 2, 3]


def test_on_a_notice_w_and_b_is_written_before_the_stop_marker(tmp_path):
    """``on_notice`` returns once W&B's file is whole (its exit record written): the stop
    marker that follows lets the launcher requeue, which kills W&B's service with rank 0. What
    fairseq logs after (its end-of-epoch line) goes to TensorBoard only, without a warning."""
    run = RunDir(tmp_path / "run")
    tracker = tracking.open_tracker(run, worker_env(run, ("7", 0)))
    train(tracker, 1, 5, offset=0.0)
    tracker.on_notice()
    (path,) = run.wandb.glob("offline-run-*/run-*.wandb")  # read at once: no wait
    assert any(record.HasField("exit") for record in testing.wandb_records(path))
    _, rows = testing.wandb_history(path)
    assert [step for step, row in rows if "train_inner/loss" in row] == [1, 2, 3, 4, 5]
    assert tracker.log("train", 5, {"loss": 9.0, "num_updates": 5}) and tracker.wandb is None
    tracker.close()
    assert testing.tensorboard_series(run.tensorboard)[("train", "loss")] == [(5, 9.0)]


def test_a_rank_started_by_hand_logs_fairseqs_figures_only(tmp_path):
    """No start from a launcher, no ledger: no toolkit figures, no restart point."""
    run = RunDir(tmp_path / "run")
    tracker = tracking.open_tracker(run, WorkerEnv(save_dir=run.root, tensorboard=run.tensorboard))
    train(tracker, 1, 3, offset=0.0)
    tracker.close()
    folders = {folder for folder, _ in testing.tensorboard_series(run.tensorboard)}
    assert folders == {"train_inner"}


def test_install_wraps_fairseqs_progress_bar_on_rank_0_only(tmp_path, monkeypatch, caplog):
    """fairseq's own progress bar (real: its simple format), built through its factory after
    install: its console line is printed as before and the tracker gets the same call."""
    from fairseq.logging import progress_bar

    monkeypatch.setattr(progress_bar, "progress_bar", progress_bar.progress_bar)  # undone after
    run = RunDir(tmp_path / "run")
    worker = WorkerEnv(save_dir=run.root, tensorboard=run.tensorboard)
    assert tracking.install(run, worker, rank=1) is None
    assert tracking.install(run, WorkerEnv(save_dir=run.root), rank=0) is None
    tracker = tracking.install(run, worker, rank=0)
    assert tracker is not None
    bar = progress_bar.progress_bar([0], log_format="simple", log_interval=1, epoch=1)
    assert isinstance(bar, tracking.TrackedBar)
    with caplog.at_level(logging.INFO):
        for _ in bar:  # as fairseq's loop: the bar counts what it iterates
            bar.log({"loss": 3.5, "num_updates": 1}, tag="train_inner", step=1)
    tracker.close()
    assert any("loss=3.5" in r.getMessage() for r in caplog.records)  # fairseq's own line
    series = testing.tensorboard_series(run.tensorboard)
    assert series[("train_inner", "loss")] == [(1, 3.5)]


def test_numbers_takes_what_fairseqs_writers_take():
    import torch
    from fairseq.logging.meters import AverageMeter

    meter = AverageMeter()
    meter.update(2.5)
    stats = {"num_updates": 7, "loss": 1, "meter": meter, "t": torch.tensor([4.0]),
             "v": torch.tensor([1.0, 2.0]), "text": "x", "flag": True}  # fmt: skip
    assert tracking.numbers(stats) == {"loss": 1.0, "meter": 2.5, "t": 4.0}


def test_the_steps_record_survives_a_bad_file(tmp_path):
    run = RunDir(tmp_path)
    contract.write_steps(run, {"train_inner": 12, "valid": 10})
    assert contract.read_steps(run) == {"train_inner": 12, "valid": 10}
    Path(run.tracking_steps).write_text("[1, 2")
    assert contract.read_steps(run) == {}  # unread: everything is logged (never lost)
