"""The one restart budget (``--max-restarts``): every place that asks whether a restart is left
asks ``restart_policy``. Pure, milliseconds."""

from __future__ import annotations

from hpc_train.launch import restart_policy
from hpc_train.launch.restart_policy import Action, Decision


def test_the_budget_counts_restarts_not_starts():
    assert restart_policy.restart_allowed(2, max_restarts=2)
    assert not restart_policy.restart_allowed(3, max_restarts=2)
    assert restart_policy.may_requeue(1, max_restarts=2)  # start #2 may be followed by #3
    assert not restart_policy.may_requeue(2, max_restarts=2)
    assert restart_policy.submitit_max_num_timeout(7) == 7  # submitit never gives up first


def test_a_refused_start_requeues_without_its_nodes_while_the_budget_lasts():
    again = restart_policy.after_refusal("node n2 short of GPUs", restart=0, max_restarts=1)
    assert (again.action, again.cause, again.blame) == (Action.REQUEUE, "bad node", True)
    spent = restart_policy.after_refusal("node n2 short of GPUs", restart=1, max_restarts=1)
    assert spent.action is Action.FAIL and "no restarts left (--max-restarts 1)" in spent.why


def test_an_eviction_renames_a_requeue_only():
    requeue = Decision(Action.REQUEUE, "stopped on notice: requeueing", "notice")
    got = restart_policy.evicting(requeue, "n2")
    assert (got.action, got.cause) == (Action.REQUEUE, "straggler")
    assert got.why.endswith("evicting n2")
    finished = Decision(Action.FINISHED, "training finished", "finished")
    assert restart_policy.evicting(finished, "n2") is finished


def test_restarts_that_never_advance_the_checkpoint_stop_the_run():
    assert restart_policy.no_progress([0, 50, 50, 50], limit=3) == ""  # two in a row so far
    why = restart_policy.no_progress([0, 50, 50, 50, 50], limit=3)
    assert "3 restarts in a row resumed from update 50" in why
    assert restart_policy.no_progress([0, 0, 0, 0], limit=3)  # never saved at all
    assert restart_policy.no_progress([0, 50, 50, 80, 80], limit=3) == ""  # it advanced
    assert restart_policy.no_progress([7] * 10, limit=0) == ""  # 0: never
