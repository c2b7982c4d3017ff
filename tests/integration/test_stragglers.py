"""A straggler on the local Slurm (tiny preset, emulated nodes): ``chaos slow`` throttles one
node's rank (SIGSTOP/SIGCONT duty cycle, on that node through ``srun --overlap``), task 0 names
it from the heartbeats' compute times, and with ``--evict-stragglers`` the run saves, drains and
excludes it, and completes without it."""

from __future__ import annotations

import contextlib
import threading

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train import chaos

pytestmark = pytest.mark.slurm

# a short window, so a straggler shows in seconds (the default is 300 s)
STRAGGLERS = ("--straggler-window", "15", "--straggler-threshold", "0.2")


def test_a_throttled_node_is_named_a_straggler_then_evicted_and_the_run_completes(runs):
    """``chaos slow --factor 0.4`` on one node from update ~20: its rank's compute per update
    goes up ~2x; after 15 s of that task 0 names the node (log, ledger), drains it, gives its
    ranks the notice; all save at the same update; the job is requeued without the node and
    completes on the nodes left (``--nodes 1-2``), with no update lost."""
    runs.wait_idle_nodes(2)
    # not paced (the throttle's SIGSTOPs would land in a paced rank's sleep); throttled to 0.4,
    # the job trains <= ~14 updates/s. The eviction landed at update 233 (2 workers) and 438 (3
    # workers); a 700-update run under a load of 5-8 ended first, unnamed: the window needs time
    max_update = 1500
    job, save = runs.submit(
        "straggler", max_update, nodes="1-2",
        fairseq=("--log-interval", "1", "--save-interval-updates", "50"),
        extra_cli=(*STRAGGLERS, "--evict-stragglers"),
    )  # fmt: skip
    nodes = slurm.hostnames(runs.wait_running(job).nodes)
    assert len(nodes) == 2, nodes
    runs.wait_for_update(save, 20)
    victim = nodes[-1]

    def slow() -> None:  # until the requeue ends its step (srun then exits non-zero)
        with contextlib.suppress(slurm.SlurmError):
            chaos.slow(job, victim, 0.4, None)

    throttle = threading.Thread(target=slow, name="chaos-slow", daemon=True)
    try:
        throttle.start()
        runs.wait_for(
            "the restart after the eviction",
            lambda: "start #2" in runs.launcher_log(save, job),
            timeout=240,
        )
        final = runs.wait_done(job)
        info = slurm.node_info(victim)
        excluded = slurm.job_info(job)["ExcNodeList"]
    finally:
        runs.give_back(victim)
    log = runs.launcher_log(save, job)
    assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
    events = ledger.read(RunDir(save).ledger)
    named = [e for e in events if e.kind == "straggler"]
    assert [e.get("node") for e in named] == [victim], named
    assert named[0].get("ratio") >= 1.2 and named[0].get("seconds") >= 15
    assert f"straggler: node {victim} computes an update in" in log
    assert [e.get("cause") for e in events if e.kind == "stopped"] == ["straggler"]
    assert [e.get("node") for e in events if e.kind == "blamed"] == [victim]
    assert "DRAIN" in info["State"] and info["Reason"].startswith("hpc-train: straggler"), info
    assert victim in slurm.hostnames(excluded)
    assert victim not in slurm.hostnames(slurm.job_info(job)["NodeList"])
    summary = runs.summary(save)
    assert summary.updates == max_update
    assert len(runs.notices(save)) == 1  # the eviction's save on notice: nothing recomputed
    assert summary.resumed_at == [runs.notices(save)[0]], summary.resumed_at
