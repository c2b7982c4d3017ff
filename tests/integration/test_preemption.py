"""Real preemption, requeue and save on notice on the local Slurm (tiny preset, 2 nodes)."""

from __future__ import annotations

import pytest

from hpc_core import slurm
from hpc_train import chaos, checkpoints

pytestmark = pytest.mark.slurm

PER_UPDATE = ("--log-interval", "1")  # one loss line per update: compare update by update
MAX_UPDATE = 150


@pytest.fixture(scope="module")
def reference(runs):
    """The same run, never interrupted."""
    job, save = runs.submit("reference", MAX_UPDATE, fairseq=PER_UPDATE)
    assert runs.wait_done(job).state == "COMPLETED"
    return save


@pytest.fixture(scope="module")
def preempted_three_times(runs):
    job, save = runs.submit("preempted", MAX_UPDATE, fairseq=PER_UPDATE)
    last = 0
    for i in range(3):
        runs.wait_running(job)
        runs.wait_for_update(save, last + 15)
        chaos.preempt(job, partition="high", hold_s=2)
        runs.wait_for(f"notice #{i + 1}", lambda i=i: len(runs.notices(save)) > i, timeout=120)
        last = runs.notices(save)[-1]
        runs.wait_for_update(save, last + 1)  # requeued, resumed and training again
    return job, save, runs.wait_done(job)


def test_preempted_three_times_finishes_at_max_update(preempted_three_times, runs):
    _, save, final = preempted_three_times
    assert final.state == "COMPLETED", final
    assert runs.summary(save).updates == MAX_UPDATE
    assert checkpoints.num_updates(checkpoints.load(save / checkpoints.LAST)) == MAX_UPDATE
    assert len(runs.notices(save)) == 3, runs.notices(save)


def test_no_update_trained_twice_or_skipped(preempted_three_times, runs):
    _, save, _ = preempted_three_times
    trained = runs.trained_updates(save)
    assert trained == list(range(1, MAX_UPDATE + 1))  # 0 updates recomputed per preemption
    assert runs.summary(save).resumed_at == runs.notices(save)  # each restart began at its save


def test_restarts_and_their_reason_are_in_the_log(preempted_three_times):
    job, save, _ = preempted_three_times
    text = "".join(p.read_text() for p in (save / "slurm").glob(f"{job}_0_log.out"))
    assert "start #4: saved on notice (SIGUSR2)" in text


def test_resume_is_deterministic_loss_for_loss(preempted_three_times, reference, runs):
    _, save, _ = preempted_three_times
    assert runs.summary(save).losses == runs.summary(reference).losses


def test_spot_interruption_notice_saves_and_resumes_with_nothing_lost(runs, fake_imds):
    env = {"HPC_TRAIN_IMDS_ENDPOINT": fake_imds.endpoint, "HPC_TRAIN_SPOT_POLL_S": "1"}
    job, save = runs.submit("spot", 80, fairseq=PER_UPDATE, env=env)
    runs.wait_for_update(save, 20)
    fake_imds.post({"action": "terminate", "time": "2026-11-22T03:00:00Z"})
    assert fake_imds.served.wait(60)
    assert runs.wait_done(job).state == "COMPLETED"
    assert len(runs.notices(save)) == 1
    assert runs.trained_updates(save) == list(range(1, 81))
    assert slurm.job_info(job)["Restarts"] == "1"
