"""Node failure and elastic resize on the local Slurm (tiny preset)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train import chaos
from hpc_train.faults.suspects import Evidence

pytestmark = pytest.mark.slurm

PER_UPDATE = ("--log-interval", "1")
ELASTIC_UPDATES = 200


def test_scancel_is_final(runs):
    """A user's plain `scancel JOB` ends the run: the launcher sees Slurm's CANCELLED and does
    not take the killed step for a crash (before: it requeued, and it took four scancels)."""
    runs.wait_idle_nodes(2)
    job, save = runs.submit("cancel", 2000, fairseq=PER_UPDATE)
    runs.wait_for_update(save, 5)
    slurm.cancel(job)
    runs.wait_for(
        "the launcher's word on the cancel",
        lambda: "not requeued" in runs.launcher_log(save, job),
        60,
    )
    runs.wait_processes_gone(job)  # a requeue, had one been issued, came before its launcher ended
    state = runs.wait_done(job, timeout=120)  # and Slurm has finished the job (not COMPLETING)
    assert state.state in {"CANCELLED", "GONE"} and state.restarts == 0, state
    assert "requeueing" not in runs.launcher_log(save, job)


def test_node_failure_requeues_and_completes(runs, slurm_cluster, restart_local_cluster):
    """Kill one emulated node (its ranks, then its slurmd): NODE_FAIL / requeue, then done."""
    max_update = 120
    job, save = runs.submit(
        "nodefail", max_update, fairseq=(*PER_UPDATE, "--save-interval-updates", "10")
    )
    nodes = slurm.hostnames(runs.wait_running(job).nodes)
    runs.wait_for_update(save, 25)
    victim = nodes[-1]
    try:
        chaos.kill_node(job, victim, stop_slurmd=True)
        final = runs.wait_done(job, timeout=900)
        info = slurm.node_info(victim)  # before the restart: `up` resumes drained nodes
        restart_local_cluster()
    finally:
        with contextlib.suppress(slurm.SlurmError):
            slurm.resume(victim)  # drained by the blame: back for the next tests
    assert final.state == "COMPLETED", final
    # blamed once, by task 0 (its ranks were killed, then no step started there and Slurm
    # marked it not responding: node_blame.unless_lost) or after Slurm's own requeue (the node
    # is DOWN): a lost node, drained at its first blame, with the reason
    blamed = [e for e in ledger.read(RunDir(save).ledger) if e.kind == "blamed"]
    assert [(e.get("node"), e.get("drained")) for e in blamed] == [(victim, True)], blamed
    assert blamed[0].get("evidence") == str(Evidence.LOST), blamed[0].data
    assert re.match(r"(crash|node failure) in job", blamed[0].get("why")), blamed[0].data
    assert "DRAIN" in info["State"] and info["Reason"].startswith("hpc-train: "), info
    assert int(slurm.job_info(job)["Restarts"]) >= 1
    log = runs.launcher_log(save, job)
    # Slurm's NODE_FAIL requeue, or task 0's after torchrun lost the node's ranks: no notice
    assert re.search(r"start #2: (crash|infrastructure|node failure) \(", log), log
    summary = runs.summary(save)
    assert summary.updates == max_update
    assert summary.resumed_at and summary.resumed_at[0] % 10 == 0  # from a periodic checkpoint
    trained = runs.trained_updates(save)
    assert trained[-1] == max_update
    # what the logs show trained twice (resumed from the periodic checkpoint) is what is reported
    assert summary.recomputed_updates == len(trained) - len(set(trained))
    starts = [e for e in ledger.read(RunDir(save).ledger) if e.kind == "started"]
    assert len(starts) >= 2 and "on notice at update" not in starts[1].get("previous")


def _first_updates(save) -> int:
    return len([e for e in ledger.read(RunDir(save).ledger) if e.kind == "first_update"])


def test_a_killed_node_is_blamed_drained_excluded_and_the_run_completes(runs):
    """`chaos JOB kill-node` (SIGKILL of one node's torchrun and ranks; its slurmd lives): the
    peers fail, task 0 reads every node's exit record and blames the node whose torchrun was
    killed. A first kill by a signal is no evidence about the node (docs/faults.md, "Blame on
    evidence"): recorded, not drained, and the requeued job may run on it again (the other two
    nodes are held, so it does). Killed there again, its machine's second blame drains it and
    the requeue excludes it; the run completes elsewhere."""
    runs.wait_idle_nodes(4)
    max_update = 200  # paced at <= 10 updates/s: two kills and two requeues land mid-run
    job, save = runs.submit(
        "killed", max_update, fairseq=(*PER_UPDATE, "--save-interval-updates", "10"), pace_s=0.1
    )
    nodes = slurm.hostnames(runs.wait_running(job).nodes)
    # the two other nodes held: the requeue after the first kill can only use the same two
    holder = slurm.sbatch(["-p", "low", "-N2", "--exclusive", "-o", "/dev/null",
                           "--job-name=hold-2-nodes", "--wrap=sleep 900"])  # fmt: skip
    runs.wait_for_update(save, 25)
    victim = nodes[-1]
    try:
        chaos.kill_node(job, victim, stop_slurmd=False)
        runs.wait_for("training again after the first kill", lambda: _first_updates(save) > 1)
        first = slurm.node_info(victim)
        again_on = slurm.hostnames(slurm.job_state(job).nodes)
        first_excluded = slurm.job_info(job)["ExcNodeList"]
        slurm.cancel(holder)
        runs.wait_for_update(save, runs.summary(save).updates + 10)
        chaos.kill_node(job, victim, stop_slurmd=False)
        final = runs.wait_done(job)
        info = slurm.node_info(victim)
        excluded = slurm.job_info(job)["ExcNodeList"]
        restarted_on = slurm.hostnames(slurm.job_info(job)["NodeList"])
    finally:
        with contextlib.suppress(slurm.SlurmError):
            slurm.cancel(holder)
        runs.give_back(victim)
    assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
    events = ledger.read(RunDir(save).ledger)
    blamed = [(e.get("node"), e.get("drained"), e.get("why"), e.get("evidence"))
              for e in events if e.kind == "blamed"]  # fmt: skip
    # the first kill: recorded, not drained, not excluded, the job ran on the node again
    assert [b[:2] for b in blamed] == [(victim, False), (victim, True)], blamed
    assert blamed[0][3] == blamed[1][3] == str(Evidence.SIGNAL), blamed
    assert "DRAIN" not in first["State"] and first_excluded in ("", "(null)"), first
    assert victim in again_on, again_on
    # the second: drained, excluded, the run completed without it
    assert f"torchrun on {victim} was killed (SIGKILL)" in blamed[1][2]
    assert "DRAIN" in info["State"] and info["Reason"].startswith("hpc-train: "), info
    assert "crash in job" in info["Reason"], info
    assert victim in slurm.hostnames(excluded) and victim not in restarted_on
    assert runs.summary(save).updates == max_update
    # each stop said as what followed it: a requeue, restart n of --max-restarts (m)
    whys = [str(e.get("why")) for e in events if e.kind == "stopped"]
    assert [re.sub(r"/\d+$", "", w).rsplit(": ", 1)[-1] for w in whys] == [
        "requeue 1",
        "requeue 2",
    ], whys
    seen = subprocess.run(
        [sys.executable, "-m", "hpc_train.command", "status", str(save)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert f"blamed: {victim}: " in seen.stdout and "(job " in seen.stdout, seen.stdout
    assert "; drained" in seen.stdout, seen.stdout


def test_resume_on_a_different_node_count_keeps_the_global_batch(runs):
    """--nodes 1-2 starts on two nodes; a high-priority job then takes three of the four, which
    preempts it, and it resumes on the one node left: update_freq 1 → 2, updates continue."""
    runs.wait_idle_nodes(4)
    # long enough that the preemption lands mid-training: with 60 updates a fast machine had
    # finished before the blocker got its nodes (CI, seen once: the notice found no training)
    job, save = runs.submit("elastic", ELASTIC_UPDATES, nodes="1-2", fairseq=PER_UPDATE)
    assert len(slurm.hostnames(runs.wait_running(job).nodes)) == 2
    runs.wait_for_update(save, 15)
    blocker = slurm.sbatch(
        ["-p", "high", "-N3", "--exclusive", "-o", "/dev/null", "--job-name=hold-3-nodes",
         "--wrap=sleep 600"]
    )  # fmt: skip
    try:
        runs.wait_for("the restart on one node", lambda: "start #2" in runs.launcher_log(save, job))
        assert runs.notices(save), f"preempted without a save on notice\n{runs.explain(save, job)}"
        runs.wait_for_update(save, runs.notices(save)[-1] + 1)
    finally:
        slurm.cancel(blocker)
    assert runs.wait_done(job).state == "COMPLETED"
    log = runs.launcher_log(save, job)
    plans = re.findall(
        r"node 1/(\d), 1 rank\(s\) here; update_freq=(\d+): \d+ sequences x (\d) ranks", log
    )
    assert plans[0] == ("2", "1", "2") and ("1", "2", "1") in plans, plans
    train_log = (save / "train.log").read_text()
    assert "training on 2 devices" in train_log and "training on 1 devices" in train_log
    assert runs.trained_updates(save) == list(range(1, ELASTIC_UPDATES + 1))  # none redone


def test_the_same_user_error_twice_stops_the_run_instead_of_requeueing(runs):
    """`chaos JOB crash --at-update 25`: rank 0 raises there in every start. The first crash is
    requeued (it might be a fluke); the second, the same error at the same update, ends the run:
    FAILED, one restart, the error in the ledger, the restart budget (20) left alone."""
    runs.wait_idle_nodes(2)
    job, save = runs.submit("crash", 60, fairseq=(*PER_UPDATE, "--save-interval-updates", "10"))
    # asked before training starts: the tiny preset trains ~25 updates/s, faster than a loaded
    # machine starts the chaos command, and a request for an update already passed never fires
    said = subprocess.run(
        [sys.executable, "-m", "hpc_train.command", "chaos", job, "crash", "--at-update", "25"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "will raise at update 25" in said
    final = runs.wait_done(job)
    assert final.state == "FAILED", f"{final}\n{runs.explain(save, job)}"
    assert int(slurm.job_info(job)["Restarts"]) == 1
    events = ledger.read(RunDir(save).ledger)
    stopped = [e for e in events if e.kind == "stopped"]
    assert [e.get("cause") for e in stopped] == ["user error", "user error"], stopped
    assert "InjectedCrash: chaos: crash injected at update 25" in stopped[-1].get("why")
    assert "same error at the same update" in stopped[-1].get("why")
    assert sum(e.kind == "requeued" for e in events) == 1
    assert not [e for e in events if e.kind == "blamed"]  # the code's error: no node blamed
    summary = runs.summary(save)  # update 25 is logged, then its save step raises
    assert summary.updates == 25 and summary.resumed_at == [20]
    assert summary.recomputed_updates == 5  # 21-25 trained twice: the periodic save was at 20
