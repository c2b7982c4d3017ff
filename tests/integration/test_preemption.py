"""Real preemption, requeue and save on notice on the local Slurm (tiny preset, 2 nodes)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train import chaos
from hpc_train.planning import goodput
from hpc_train.worker import checkpoints

pytestmark = pytest.mark.slurm

PER_UPDATE = ("--log-interval", "1")  # one loss line per update: compare update by update
# a notice lands a moment after the preemptor is submitted, and the preempted run is paced at
# <= 10 updates/s (chaos pace; worker.pace): room for three notices 15 updates apart even when
# each lands 40 updates (4 s) late. The reference trains unpaced: the pace changes no loss.
MAX_UPDATE = 250
PACE_S = 0.1


@pytest.fixture(scope="module")
def reference(runs):
    """The same run, never interrupted."""
    job, save = runs.submit("reference", MAX_UPDATE, fairseq=PER_UPDATE)
    assert runs.wait_done(job).state == "COMPLETED"
    return save


@pytest.fixture(scope="module")
def preempted_three_times(runs):
    """Preempted three times; `hpc-train logs JOB --follow` attached after update 15 (piped),
    its output and exit status are the fixture's fourth item."""
    job, save = runs.submit("preempted", MAX_UPDATE, fairseq=PER_UPDATE, pace_s=PACE_S)
    last, follower = 0, None
    try:
        for i in range(3):
            runs.wait_running(job)
            runs.wait_for_update(save, last + 15)
            if follower is None:
                follower = subprocess.Popen(
                    [sys.executable, "-m", "hpc_train.command", "logs", job, "--follow"],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                )  # fmt: skip
            chaos.preempt(job, partition="high", hold_s=2)
            runs.wait_for(f"notice #{i + 1}", lambda i=i: len(runs.notices(save)) > i, 120)
            last = runs.notices(save)[-1]
            runs.wait_for_update(save, last + 1)  # requeued, resumed and training again
        final = runs.wait_done(job)
        assert follower is not None
        followed = follower.communicate(timeout=120)[0], follower.returncode
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
    return job, save, final, followed


def test_preempted_three_times_finishes_at_max_update(preempted_three_times, runs):
    _, save, final, _ = preempted_three_times
    assert final.state == "COMPLETED", final
    assert runs.summary(save).updates == MAX_UPDATE
    assert checkpoints.num_updates(checkpoints.load(save / checkpoints.LAST)) == MAX_UPDATE
    assert len(runs.notices(save)) == 3, runs.notices(save)


def test_no_update_trained_twice_or_skipped(preempted_three_times, runs):
    _, save, _, _ = preempted_three_times
    trained = runs.trained_updates(save)
    assert trained == list(range(1, MAX_UPDATE + 1))  # 0 updates recomputed per preemption
    assert runs.summary(save).resumed_at == runs.notices(save)  # each restart began at its save


def test_restarts_and_their_reason_are_in_the_log(preempted_three_times):
    job, save, _, _ = preempted_three_times
    text = "".join(p.read_text() for p in (save / "slurm").glob(f"{job}_0_log.out"))
    assert "start #4: saved on notice (SIGUSR2)" in text


def test_the_ledger_accounts_for_every_restart(preempted_three_times, runs):
    _, save, _, _ = preempted_three_times
    events = ledger.read(RunDir(save).ledger)
    count = {k: sum(e.kind == k for e in events) for k in ledger.EVENTS}
    assert count["submitted"] == 1 and count["started"] == 4 and count["finished"] == 1
    assert count["notice"] == count["requeued"] == 3, count
    assert [e.get("cause") for e in events if e.kind == "stopped"] == ["notice"] * 3
    starts = [e for e in events if e.kind == "started"]
    assert [s.restart for s in starts] == [0, 1, 2, 3]
    assert [s.get("resume_at") for s in starts[1:]] == runs.notices(save)
    firsts = [e.get("update") for e in events if e.kind == "first_update"]
    assert firsts == [1, *(n + 1 for n in runs.notices(save))]
    notice_saves = [e for e in events if e.kind == "checkpoint" and e.get("notice")]
    assert [e.get("update") for e in notice_saves] == runs.notices(save)
    assert all(e.get("bytes") > 0 and e.get("seconds") >= 0 for e in notice_saves)
    summary = runs.summary(save)
    assert summary.recomputed_updates == 0
    g = goodput.account(events, events[-1].time)
    assert g.restarts == 3 and 0 < g.ettr < 1 and g.queue_s > 0 and g.startup_s > 0


def test_logs_follow_attached_mid_run_sees_every_update_once(preempted_three_times):
    _, _, _, (out, code) = preempted_three_times
    assert code == 0, out
    updates = [int(m) for m in re.findall(rf"^update (\d+)/{MAX_UPDATE}", out, re.M)]
    assert updates == list(range(1, MAX_UPDATE + 1)), updates  # once each, across 3 requeues
    assert "start #4: saved on notice (SIGUSR2)" in out
    assert f"job COMPLETED: {MAX_UPDATE}/{MAX_UPDATE} updates" in out and "ETTR" in out


def test_status_json_shows_both_runs(preempted_three_times, reference, runs):
    job, _, _, _ = preempted_three_times
    out = subprocess.run(
        [sys.executable, "-m", "hpc_train.command", "status", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    rows = {Path(r["save_dir"]).name: r for r in json.loads(out)}
    assert {"preempted", "reference"} <= set(rows)
    mine = rows["preempted"]
    assert mine["job"] == job and mine["state"] in {"COMPLETED", "FINISHED"}
    assert mine["updates"] == MAX_UPDATE and len(mine["restarts"]) == 3
    assert rows["reference"]["restarts"] == [] and rows["reference"]["updates"] == MAX_UPDATE


def test_resume_is_deterministic_loss_for_loss(preempted_three_times, reference, runs):
    _, save, _, _ = preempted_three_times
    assert runs.summary(save).losses == runs.summary(reference).losses


def test_spot_interruption_notice_saves_and_resumes_with_nothing_lost(runs, fake_imds):
    env = {"HPC_TRAIN_IMDS_ENDPOINT": fake_imds.endpoint, "HPC_TRAIN_SPOT_POLL_S": "1"}
    job, save = runs.submit("spot", 300, fairseq=PER_UPDATE, env=env)  # the notice lands mid-run
    runs.wait_for_update(save, 20)
    fake_imds.post({"action": "terminate", "time": "2026-11-22T03:00:00Z"})
    assert fake_imds.served.wait(60)
    assert runs.wait_done(job).state == "COMPLETED"
    assert len(runs.notices(save)) == 1
    assert runs.trained_updates(save) == list(range(1, 301))
    assert slurm.job_info(job)["Restarts"] == "1"
