"""Experiment tracking on the local Slurm (tiny preset, real fairseq, one node): a run with
``--tensorboard --wandb-project`` (W&B offline) preempted once (a high-priority job takes its
node: save on notice, requeue) and crashed once inside its allocation (``chaos JOB crash``,
``--restart-in-job``: a round from the last periodic save, the updates after it trained again).

The TensorBoard event files are read record by record (``hpc_train.testing``: tensorboard's raw
TFRecord reader, not the accumulator, which drops out-of-order steps itself), W&B's offline files
record by record. A chaos crash fires at its update in every later start too, so the test
withdraws it once the crash's stop is in the ledger (the in-job round takes seconds to start;
the request is gone long before it trains again). Paced (0.1 s an update): measured on
2026-11-29, the notice landed near update 20, the run took about 90 s in all."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train import chaos, testing
from hpc_train.job import tracking

pytestmark = pytest.mark.slurm

PER_UPDATE = ("--log-interval", "1", "--save-interval-updates", "10")
PACE_S = 0.1
AFTER_NOTICE = 25  # the crash: this many updates past the notice (a periodic save in between)
TAIL = 20  # updates trained after the crash's update
SECRET = "4f1d0c2b9e8a7d6c5b4a39281706f5e4d3c2b1a0"  # a made-up key, given to submit's environment
TRACKED = ("--tensorboard", "--wandb-project", "hpc-train-tests", "--wandb-mode", "offline")


@pytest.fixture(scope="module")
def tracked(runs):
    """(save dir, job id, final state, the crash's update, max update)."""
    runs.wait_idle_nodes(1)
    job, save = runs.submit("tracked", 200, nodes="1", fairseq=PER_UPDATE, pace_s=PACE_S,
                            extra_cli=(*TRACKED, "--restart-in-job"),
                            env={"WANDB_API_KEY": SECRET})  # fmt: skip
    run = RunDir(save)
    runs.wait_running(job)
    runs.wait_for_update(save, 15)
    chaos.preempt(job, partition="high", hold_s=2)
    runs.wait_for("the notice", lambda: runs.notices(save) or None, 120)
    (notice,) = runs.notices(save)
    crash_at = notice + AFTER_NOTICE
    said = subprocess.run(
        [sys.executable, "-m", "hpc_train.command", "chaos", job, "crash", "--at-update",
         str(crash_at)], capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert f"will raise at update {crash_at}" in said
    testing.wait_for_event(run, "the crash's stop", _crash_stop, 240)
    run.chaos_crash.unlink()  # fired once: the in-job round must not raise there again
    final = runs.wait_done(job)
    return save, job, final, crash_at


def _crash_stop(event: ledger.Event) -> bool:
    return event.kind == Kind.STOPPED and event.get("cause") == "user error"


def test_the_run_completes_after_a_notice_and_an_in_job_restart(tracked, runs):
    save, job, final, _ = tracked
    assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
    assert int(slurm.job_info(job)["Restarts"]) == 1  # the preemption's requeue; the crash: none
    events = ledger.read(RunDir(save).ledger)
    assert [e.get("cause") for e in events if e.kind == Kind.STOPPED] == ["notice", "user error"]
    assert len([e for e in events if e.kind == Kind.RESTARTED]) == 1


def test_each_tag_is_one_strictly_increasing_series_with_the_first_values(tracked, runs):
    save, _, _, crash_at = tracked
    run = RunDir(save)
    series = testing.tensorboard_series(run.tensorboard)
    for (folder, tag), points in series.items():
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps)), (folder, tag, steps)  # no step twice, none back
    logged = runs.summary(save).losses  # train.log: the recomputed updates twice
    resumed = _resumes(run)[-1]
    assert [n for n, _ in logged].count(crash_at) == 2 and resumed < crash_at
    first: dict[int, float] = {}
    for n, loss in logged:
        first.setdefault(n, loss)
    drawn = series[("train_inner", "loss")]
    assert [n for n, _ in drawn] == sorted(first)  # every update once
    assert [v for _, v in drawn] == pytest.approx([first[n] for n, _ in drawn], rel=1e-6)


def test_each_restart_is_annotated_at_its_update_with_its_cause(tracked):
    save, _, _, crash_at = tracked
    run = RunDir(save)
    series = testing.tensorboard_series(run.tensorboard)
    resumes = _resumes(run)
    texts = series[("restarts", "cause/text_summary")]
    assert [step for step, _ in texts] == resumes
    (notice, t1), (crash, t2) = texts
    assert str(t1).startswith(f"restart 1 at update {notice}: notice; saved on notice")
    assert str(t2).startswith(f"restart 2 at update {crash}: user error; in-job restart after")
    assert f"updates {crash + 1}-{crash_at} recomputed, their first values kept" in str(t2)
    assert series[("restarts", "recomputed_updates")] == [(notice, 0.0), (crash, crash_at - crash)]
    assert series[("hpc-train", "run/restarts")][-1][1] == 2.0


def test_wandb_offline_has_one_folder_per_start_all_with_the_runs_id(tracked):
    save, _, _, _ = tracked
    run = RunDir(save)
    histories = testing.wandb_runs(run.wandb, 3, timeout=60)
    assert [run_id for run_id, _ in histories] == [tracking.run_id(save)] * 3
    steps = [s for _, rows in histories for s, row in rows if "train_inner/loss" in row]
    assert steps == sorted(set(steps)) and len(steps) == max(steps)  # 1..max, once each
    restarts = [row["restarts/cause"] for _, rows in histories for _, row in rows
                if "restarts/cause" in row]  # fmt: skip
    assert restarts == ["notice", "user error"]


def test_the_key_is_nowhere_in_the_run(tracked):
    """The key was in submit's environment (Slurm passed it to the job): not in the pickled
    spec, the ledger, the logs, the event files or W&B's files."""
    save, _, _, _ = tracked
    files = [p for p in save.rglob("*") if p.is_file() and not p.is_symlink()]
    assert len(files) > 20
    assert [p for p in files if SECRET.encode() in p.read_bytes()] == []


def test_status_says_where_the_curves_are(tracked):
    save, _, _, _ = tracked
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train.command", "status", str(save)],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert f"tensorboard --logdir {RunDir(save).tensorboard}" in out
    assert f"(id {tracking.run_id(save)}) in hpc-train-tests, offline: wandb sync" in out


def _resumes(run: RunDir) -> list[int]:
    """The update each restart resumed at, from the ledger's ``started`` events."""
    starts = [e for e in ledger.read(run.ledger) if e.kind == Kind.STARTED]
    return [int(e.get("resume_at")) for e in starts[1:]]
