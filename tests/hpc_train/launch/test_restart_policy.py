"""The one restart budget (``--max-restarts``): every place that asks whether a restart is left
asks ``restart_policy``. Pure, milliseconds."""

from __future__ import annotations

from hpc_core.slurm import node_usable
from hpc_train.launch import restart_policy
from hpc_train.launch.restart_policy import Action, Decision


def test_the_budget_counts_restarts_not_starts():
    assert restart_policy.restart_allowed(2, max_restarts=2)
    assert not restart_policy.restart_allowed(3, max_restarts=2)
    assert restart_policy.may_requeue(1, max_restarts=2)  # start #2 may be followed by #3
    assert not restart_policy.may_requeue(2, max_restarts=2)
    assert restart_policy.submitit_max_num_timeout(7) >= 7  # submitit never gives up first


def test_a_refused_start_requeues_without_its_nodes_while_the_budget_lasts():
    again = restart_policy.after_refusal("node n2 short of GPUs", restart=0, max_restarts=1)
    assert (again.action, again.cause, again.blame) == (Action.RESTART, "bad node", True)
    spent = restart_policy.after_refusal("node n2 short of GPUs", restart=1, max_restarts=1)
    assert spent.action is Action.FAIL and "no restarts left (--max-restarts 1)" in spent.why


def test_an_eviction_renames_a_requeue_only():
    requeue = Decision(Action.RESTART, "stopped on notice: requeueing", "notice")
    got = restart_policy.evicting(requeue, "n2")
    assert (got.action, got.cause) == (Action.RESTART, "straggler")
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


def test_a_requeue_that_cannot_start_is_said_and_stops_where_nothing_replaces_nodes():
    states = {"n1": "idle", "n2": "drained", "n3": "down*", "n4": "allocated"}
    assert restart_policy.requeue_blocked(states, {"n4"}, 1, replaced=False) == (None, "")
    stop, why = restart_policy.requeue_blocked(states, {"n4"}, 2, replaced=False)
    assert stop is not None and stop.action is Action.FAIL and stop.cause == "no nodes"
    assert "1 usable node(s) in its partition, it needs 2" in why
    assert "n2 (drained), n3 (down*), n4 (excluded)" in why
    assert "stopping" in stop.why


def test_on_parallelcluster_a_blocked_requeue_waits_for_the_replacement_nodes():
    states = {"gpu-dy-p3dn-1": "idle", "gpu-dy-p3dn-2": "drained", "gpu-st-p3dn-1": "down"}
    replaced = restart_policy.nodes_replaced("auto", states)
    stop, said = restart_policy.requeue_blocked(states, set(), 2, replaced)
    assert stop is None and "waiting for the cluster to replace the drained nodes" in said
    local = {"n1": "idle", "n2": "drained"}  # the local cluster: its names are not pcluster's
    assert not restart_policy.nodes_replaced("auto", local)
    assert restart_policy.requeue_blocked(local, set(), 2, replaced=False)[0] is not None
    # told so (--nodes-replaced yes: a site that replaces nodes, the soak's stand-in) it waits
    assert restart_policy.nodes_replaced("yes", local)
    assert restart_policy.requeue_blocked(local, set(), 2, replaced=True)[0] is None
    assert not restart_policy.nodes_replaced("no", states)
    assert not restart_policy.nodes_replaced("auto", {})
    # powered-down cloud nodes (idle~) start on demand: usable
    assert node_usable("idle~") and not node_usable("draining")
    assert node_usable("idle*") and not node_usable("down*")  # transient
    # a controller just restarted knows no node yet: no reason to stop a run (issue 46)
    assert node_usable("unknown") and node_usable("unknown*")
    unknown = {f"n{i}": "unknown" for i in range(1, 5)}
    assert restart_policy.requeue_blocked(unknown, ["n4"], 2, replaced=False) == (None, "")


def test_a_grow_is_not_a_restart_the_budget_counts():
    assert restart_policy.restarts_spent(requeues=3, in_job=1, grows=0) == 4
    assert restart_policy.restarts_spent(requeues=3, in_job=1, grows=2) == 2
    # submitit takes a late grow's notice for a time-out: its counter leaves room for grows
    assert restart_policy.submitit_max_num_timeout(7) > 7 + 10_000


def test_a_blamed_node_is_excluded_by_name_only_where_nothing_replaces_it():
    """Where drained nodes are replaced, the drain keeps a blamed node out until its
    replacement, which the job may use: excluded by name, a run as wide as its queue could never
    start again. Not drained (--no-drain) or not replaced: excluded by name."""
    assert restart_policy.excluded_by_name(["n2"], replaced=True, drained=True) == []
    assert restart_policy.excluded_by_name(["n2"], replaced=True, drained=False) == ["n2"]
    assert restart_policy.excluded_by_name(["n2"], replaced=False, drained=True) == ["n2"]
