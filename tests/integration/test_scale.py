"""Scale cannot regress unseen (issue 46): 8 hollow nodes and a hot spare (``submit --hollow``,
a stand-in for the model) on a local cluster of their own, through a start, a rank killed (the
in-job round) and a notice (the requeue), to the end. What grows with the node count is held to
what one node needs for itself: Slurm calls per node and per event, the lines ``hpc-train logs``
shows per start. The figures and their growth to 64 nodes: ``make bench-scale``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from benchmarks import scale
from benchmarks import scale_probe as probe

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NODES = 8
# What one event may ask of Slurm: task 0's own look-ups for the job (its state, a node's
# machine and state, the partition before a requeue, the requeue), and at most this many by
# any other node for itself.
TASK0_CALLS = 16
OTHER_NODE_CALLS = 3


@pytest.fixture(scope="module")
def cluster():
    port = int(os.environ.get("HPC_TRAIN_CLUSTER_PORT") or 16817) + 700
    first = int(os.environ.get("HPC_TRAIN_CLUSTER_FIRST_JOB_ID") or 1) + 700_000
    saved = {k: os.environ.get(k) for k in scale.Cluster(Path(), 0, 0).env()}
    with tempfile.TemporaryDirectory(prefix="scale8-") as tmp:
        own = scale.Cluster(Path(tmp) / "cluster", port, first)
        with own.up(NODES + 2):
            yield Path(tmp)
    for key, value in saved.items():  # the session's own cluster again
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def node_calls(event: dict) -> dict:
    return event["slurm_calls"]


def test_eight_hollow_nodes_start_recover_and_finish_asking_slurm_per_node(cluster, corpus):
    args = scale.build_parser().parse_args(
        ["--data", str(corpus), "--work-dir", str(cluster / "runs"), "--trace-s", "3",
         "--hang-floor-s", "30", "--pace-s", "0.1", "--after", "5", "--max-update", "60"]
    )  # fmt: skip
    args.work_dir.mkdir(parents=True)
    setup = scale.Setup(args, probe.CallLog.install(cluster / "clients"), probe.Scanner().start())
    try:
        job, submitted = scale.submit(
            setup, "scale8", NODES, True, args.max_update, ("--spares", "1")
        )
        start = scale.start_figures(job, submitted)
        scale.wait_training(job, submitted)
        views = scale.views(job)
        kill = scale.kill_event(job, round_=True)
        scale.wait_training(job, 0)
        notice = scale.notice_event(job)
        end = scale.finished(job)
    finally:
        setup.scanner.stop()
        for job_id in setup.jobs:
            scale.slurm.cancel(job_id, check=False)
    assert end["state"] == "COMPLETED" and end["missing_updates"] == 0, end
    assert end["updates"] == args.max_update
    for name, event in (("start", start), ("kill", kill), ("notice", notice)):
        calls = node_calls(event)
        assert calls["most_by_one_node"] <= TASK0_CALLS, (name, calls)
        assert calls["rpc"] <= TASK0_CALLS + OTHER_NODE_CALLS * NODES, (name, calls)
    # a kill is task 0's to weigh: one answer for the job, no node asks Slurm for itself (each
    # node asked `scontrol show job` before: 8 + 3 here, 39 + 3 at 39 nodes)
    calls = node_calls(kill)
    assert calls["nodes_calling"] == 1 and calls["by_kind"].get("scontrol show job") == 1, calls
    # every node's launcher said its start: folded, a handful of lines, not 9 x 8
    assert views["logs"]["exit"] == 0 and views["logs"]["lines"] < 40, views
    assert views["status"]["exit"] == 0 and views["status"]["lines"] <= 12, views
    assert kill["toolkit_s"] is not None and notice["saved_s"] is not None
    # every launcher of the last start (after the notice's requeue: restart 1), the spare's too,
    # registered its doorbell for that start (hpc_core.doorbell): the words rang them
    bells = {p.name: p.read_text().split()[1] for p in job.run.bells.iterdir()}
    assert len(bells) >= NODES and set(bells.values()) == {f"{job.id}-1"}, bells
