"""Grow-back on the local Slurm (tiny preset, 4 emulated nodes): a ``--nodes 1-3`` run that
started on the one node a blocker job left free grows to 3 once the blocker ends: save on
notice, requeue, resume wider with the global batch kept; no update trained twice, and (with
``--audit-samples``) every sample of each epoch trained exactly once across the width changes."""

from __future__ import annotations

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train import chaos
from hpc_train.planning import goodput
from hpc_train.runs import audit

pytestmark = pytest.mark.slurm
PACE_S = 0.1  # chaos pace: at most 10 updates/s, so a run is sized in seconds (worker.pace)


def hold_nodes(runs, count: int) -> str:
    """A low-priority job holding ``count`` nodes for 10 minutes (the test cancels it), running."""
    blocker = slurm.sbatch(["-p", "low", f"-N{count}", "--exclusive", "-o", "/dev/null",
                            f"--job-name=hold-{count}-nodes", "--wrap=sleep 600"])  # fmt: skip
    try:
        runs.wait_for("the blocker", lambda: slurm.job_state(blocker).state == "RUNNING", 60)
    except TimeoutError:
        slurm.cancel(blocker)
        raise
    return blocker


def assert_each_sample_once(save) -> None:
    """``--audit-samples``: every epoch's samples trained exactly once across the widths."""
    epochs = audit.audit(save)
    assert epochs, f"no audit lines in {save}"
    assert all(e.exact for e in epochs), "\n".join(e.describe() for e in epochs)
    assert audit.main([str(save)]) == 0


def test_a_run_grows_back_when_the_blocker_ends_and_loses_nothing(runs):
    runs.wait_idle_nodes(4)
    blocker = hold_nodes(runs, 3)
    try:
        max_update = 300  # paced: the grow lands near update 130 (measured)
        job, save = runs.submit("grow", max_update, nodes="1-3", fairseq=("--log-interval", "1"),
                                pace_s=PACE_S,
                                extra_cli=("--grow-after", "5", "--global-batch", "24",
                                           "--audit-samples"))  # fmt: skip
        assert len(slurm.hostnames(runs.wait_running(job).nodes)) == 1
        runs.wait_for_update(save, 20)
    finally:
        slurm.cancel(blocker)
    final = runs.wait_done(job, timeout=900)
    assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
    events = ledger.read(RunDir(save).ledger)
    (grown,) = [e for e in events if e.kind == "grown"]
    assert (grown.get("from"), grown.get("to")) == (1, 3), grown
    starts = [e for e in events if e.kind == "started"]
    assert [len(s.get("nodes")) for s in starts] == [1, 3], starts
    assert starts[1].get("previous", "").startswith("grown from 1 to 3 node(s): saved on notice")
    # the global batch kept: 8 sequences x 1 rank x 3 steps, then 8 x 3 ranks x 1
    assert [(s.get("world"), s.get("update_freq")) for s in starts] == [(1, 3), (3, 1)]
    assert runs.trained_updates(save) == list(range(1, max_update + 1))  # none trained twice
    g = goodput.account(events, events[-1].time)
    assert g.recomputed_updates == 0 and sum(g.parts.values()) == pytest.approx(g.wall_s)
    assert_each_sample_once(save)


def test_a_grow_and_a_notice_landing_together_lose_nothing(runs):
    """The grow's notice and another notice (a preemption's, a time limit's) arrive within the
    same moment: one save on notice, one requeue, and no update lost or trained twice."""
    runs.wait_idle_nodes(4)
    blocker = hold_nodes(runs, 2)
    try:
        max_update = 350  # paced: the grow lands near update 210 (measured)
        job, save = runs.submit("grow-notice", max_update, pace_s=PACE_S, nodes="2-4",
                                fairseq=("--log-interval", "1"),
                                extra_cli=("--grow-after", "5", "--global-batch", "32",
                                           "--audit-samples"))  # fmt: skip
        runs.wait_for_update(save, 20)
    finally:
        slurm.cancel(blocker)
    runs.wait_for(
        "the grow",
        lambda: any(e.kind == "grown" for e in ledger.read(RunDir(save).ledger)),
        120,
    )
    chaos.notice(job)  # a second notice, as the grow's own lands
    final = runs.wait_done(job, timeout=900)
    assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
    assert runs.trained_updates(save) == list(range(1, max_update + 1))  # none lost, none twice
    starts = [e for e in ledger.read(RunDir(save).ledger) if e.kind == "started"]
    assert len(starts[-1].get("nodes")) == 4, starts
    assert_each_sample_once(save)


def test_a_grow_whose_nodes_are_taken_meanwhile_resumes_at_the_old_width(runs):
    """The blocker's nodes come free, the run asks to grow, and a high-priority job takes three
    of the four nodes before the requeued run starts again: it resumes on the one node left, the
    width it had (no wait for the width it asked), completes, trains no update twice and every
    sample of each epoch once."""
    runs.wait_idle_nodes(4)
    blocker = hold_nodes(runs, 3)
    taker = None
    try:
        max_update = 300  # paced: the grow lands near update 110 (measured)
        job, save = runs.submit("grow-taken", max_update, pace_s=PACE_S, nodes="1-3",
                                fairseq=("--log-interval", "1"),
                                extra_cli=("--grow-after", "5", "--global-batch", "24",
                                           "--audit-samples"))  # fmt: skip
        runs.wait_for_update(save, 20)
        slurm.cancel(blocker)
        runs.wait_for(
            "the grow",
            lambda: any(e.kind == "grown" for e in ledger.read(RunDir(save).ledger)),
            120,
        )
        taker = slurm.sbatch(
            ["-p", "high", "-N3", "--exclusive", "-o", "/dev/null", "--job-name=take-3-nodes",
             "--wrap=sleep 120"]
        )  # fmt: skip
        final = runs.wait_done(job, timeout=900)
    finally:
        slurm.cancel(blocker)
        if taker:
            slurm.cancel(taker)
    assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
    starts = [e for e in ledger.read(RunDir(save).ledger) if e.kind == "started"]
    assert len(starts) >= 2 and len(starts[0].get("nodes")) == 1, starts
    assert len(starts[1].get("nodes")) == 1, starts  # the old width, not the width asked
    assert starts[1].get("previous", "").startswith("grown from 1 to 3 node(s)"), starts
    # the global batch kept at the old width: 8 sequences x 1 rank x 3 steps
    assert (starts[1].get("world"), starts[1].get("update_freq")) == (1, 3), starts
    assert runs.trained_updates(save) == list(range(1, max_update + 1))
    assert_each_sample_once(save)


def test_a_grow_slurm_would_not_start_now_is_not_attempted(runs):
    """Nodes come free, but the partition takes one-node jobs only (MaxNodes=1, set once the run
    is running): the idle nodes pass the settle window, ``sbatch --test-only`` for more is
    refused, the launcher says so and the run trains on at its width to the end: no grow, no
    save on notice, no requeue."""
    runs.wait_idle_nodes(4)
    blocker = hold_nodes(runs, 3)
    limited = False
    try:
        max_update = 300  # paced: 30 s of training at least, the refused ask ~15 s in
        job, save = runs.submit("no-grow", max_update, pace_s=PACE_S, nodes="1-3",
                                fairseq=("--log-interval", "1"),
                                extra_cli=("--grow-after", "5", "--global-batch", "24"))  # fmt: skip
        assert len(slurm.hostnames(runs.wait_running(job).nodes)) == 1
        slurm.run(["scontrol", "update", "PartitionName=low", "MaxNodes=1"])
        limited = True
        runs.wait_for_update(save, 20)
        slurm.cancel(blocker)
        runs.wait_for("the refused ask",
                      lambda: "would not start them now" in runs.launcher_log(save, job), 120)  # fmt: skip
        final = runs.wait_done(job, timeout=600)
    finally:
        slurm.cancel(blocker, check=False)  # cancelled above unless the test failed first
        if limited:
            slurm.run(["scontrol", "update", "PartitionName=low", "MaxNodes=UNLIMITED"])
    assert final.state == "COMPLETED", f"{final}\n{runs.explain(save, job)}"
    assert final.restarts == 0
    events = ledger.read(RunDir(save).ledger)
    assert not [e for e in events if e.kind == "grown"]
    assert [len(s.get("nodes")) for s in events if s.kind == "started"] == [1]
    assert runs.notices(save) == [] and runs.summary(save).updates == max_update
