"""`hpc-train doctor` on the local Slurm cluster: a run whose torchrun agent is stuck (SIGSTOP,
chaos stuck-agent, with the in-job watcher off) holds its node after training; the doctor finds
it stuck at exit and `--act` ends it. A job requeued again and again is a storm; `--act` holds
it (`scontrol requeuehold`). `--all-users` finds the jobs from Slurm's list, read-only. A
--no-watchdog run whose rank is stopped is a sure stall; `--act` requeues it and it completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_core.wait import Backoff, wait_until
from hpc_train import chaos

pytestmark = pytest.mark.slurm

STEADY = Backoff(0.5, 1.0, 0.5)


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train.command", "doctor", *args],
        capture_output=True, text=True, timeout=120, env=dict(os.environ),
    )  # fmt: skip


def test_a_stuck_torchrun_agent_is_found_stuck_at_exit_and_act_ends_it(runs, tmp_path):
    runs.wait_idle_nodes(1)
    max_update = 30
    job, save = runs.submit("doctor-stuck", max_update, nodes="1",
                            fairseq=("--log-interval", "1"), extra_cli=("--no-watchdog",))  # fmt: skip
    (node,) = slurm.hostnames(runs.wait_running(job).nodes)
    try:
        runs.wait_for_update(save, 3)
        assert chaos.stuck_agent(job, node) == node
        runs.wait_for_update(save, max_update, timeout=300)
        # the ranks are done; the stopped agent never exits: the job holds its node
        said = {}

        def found_stuck() -> dict | None:
            proc = doctor(job, "--exit-grace", "5", "--json")
            assert proc.returncode in (0, 1), proc.stderr
            findings = json.loads(proc.stdout)
            said["last"] = findings
            return next((f for f in findings if f["check"] == "stuck-at-exit"), None)

        finding = wait_until(found_stuck, "the doctor's stuck-at-exit finding", 120, STEADY)
        assert finding["job"] == job and finding["sure"], finding
        assert finding["fix"].startswith(f"scancel {job}")
        assert slurm.job_state(job).state == "RUNNING"  # still held: nothing else ended it
        hook = tmp_path / "notified.jsonl"
        acted = doctor(job, "--exit-grace", "5", "--act", "--notify", f"cat >> {hook}")
        assert acted.returncode == 1, acted.stderr
        assert f"acted: scancel {job}" in acted.stderr
        assert json.loads(hook.read_text().splitlines()[0])["check"] == "stuck-at-exit"
        final = runs.wait_done(job, timeout=120)
        assert final.finished and final.state != "RUNNING", final
        assert runs.summary(save).updates == max_update
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)


def test_a_requeue_storm_is_found_and_held(runs, tmp_path):
    runs.wait_idle_nodes(1)
    save = tmp_path / "storm"
    (save / "slurm").mkdir(parents=True)
    (save / ".hpc-train").mkdir()
    job = slurm.sbatch(["--requeue", "-N1", "-J", "storm", "-o", f"{save}/slurm/%j_0_log.out",
                        "--wrap", "sleep 600"])  # fmt: skip
    ledger.index_run(job, save, "storm", 10)
    try:
        for n in range(1, 4):
            slurm.wait_for_job(job, lambda s: s.state == "RUNNING", 120, STEADY)
            slurm.requeue(job)
            slurm.wait_for_job(job, lambda s, n=n: s.restarts >= n, 60, STEADY)
        said = doctor(job, "--storm-restarts", "3", "--json")
        (storm,) = [f for f in json.loads(said.stdout) if f["check"] == "requeue-storm"]
        assert said.returncode == 1 and storm["job"] == job and storm["sure"], said.stdout
        everyone = doctor("--all-users", "--storm-restarts", "3", "--json")
        assert any(f["job"] == job and f["check"] == "requeue-storm"
                   for f in json.loads(everyone.stdout)), everyone.stdout  # fmt: skip
        assert doctor("--all-users", "--act").returncode == 2  # read-only
        acted = doctor(job, "--storm-restarts", "3", "--act")
        assert "acted: scontrol " in acted.stderr, acted.stderr
        held = wait_until(
            lambda: ((info := slurm.job_info(job)) and info.get("JobState") == "PENDING"
            and info.get("Priority") == "0" and info) or None,
            "the stormy job held", 60, STEADY,
        )  # fmt: skip
        assert "Held" in held.get("Reason", "") or "held" in held.get("Reason", ""), held
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)


def test_a_stalled_no_watchdog_run_is_a_sure_stall_and_act_requeues_it_to_completion(runs):
    """A --no-watchdog run (no heartbeats, no in-job watcher) whose rank is SIGSTOPped mid-
    training (chaos hang) hangs with nothing inside the job to end it. Past its own limits'
    allowance (no beats, so the start-up phase's: --hang-startup-timeout 30, recorded by submit
    though no watchdog runs) the doctor reports a sure stall; `--act` requeues the job (Slurm
    kills the stopped rank), and the run resumes from its last periodic checkpoint and
    completes."""
    runs.wait_idle_nodes(1)
    max_update = 60
    job, save = runs.submit(
        "doctor-stall", max_update, nodes="1",
        fairseq=("--log-interval", "1", "--save-interval-updates", "5"),
        extra_cli=("--no-watchdog", "--hang-startup-timeout", "30", "--hang-timeout-floor", "10"),
    )  # fmt: skip
    (node,) = slurm.hostnames(runs.wait_running(job).nodes)
    try:
        runs.wait_for_update(save, 15)
        assert chaos.hang(job, node) == node
        said = {}

        def found_stalled() -> dict | None:
            proc = doctor(job, "--margin", "0", "--json")
            assert proc.returncode in (0, 1), proc.stderr
            findings = json.loads(proc.stdout)
            said["last"] = findings
            return next((f for f in findings if f["check"] == "stalled" and f["sure"]), None)

        finding = wait_until(found_stalled, "the doctor's sure stall", 300, Backoff(5.0, 1.0, 5.0))
        assert finding["job"] == job and "--no-watchdog" in finding["what"], finding
        assert finding["fix"].startswith(f"scontrol requeue {job}")
        stalled_at = runs.summary(save).updates
        assert stalled_at < max_update
        assert slurm.job_state(job).state == "RUNNING"  # nothing in the job ended the stall
        acted = doctor(job, "--margin", "0", "--act")
        assert acted.returncode == 1, acted.stderr
        assert f"acted: scontrol requeue {job}" in acted.stderr, acted.stderr
        slurm.wait_for_job(job, lambda s: s.restarts >= 1, 300, STEADY)
        final = runs.wait_done(job, timeout=900)
        assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
        summary = runs.summary(save)
        assert summary.updates == max_update
        assert summary.resumed_at and summary.resumed_at[0] <= stalled_at, summary.resumed_at
        starts = [e for e in ledger.read(RunDir(save).ledger) if e.kind == "started"]
        assert len(starts) >= 2, starts
        assert doctor(job, "--json").stdout.strip() == "[]"  # ended: nothing to say
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
