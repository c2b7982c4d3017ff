"""What the launcher does when torchrun exits: the restart policy, pure.

``--max-restarts N`` is the number of restarts a run may have in all, whatever caused them
(preemption, node failure, a crash, the time limit): start number N + 1 is the last one. Slurm
counts them (``SLURM_RESTART_COUNT``), so requeues Slurm performs by itself count too. One kind
is not counted: a grow (``--grow-after``), the run's own choice to trade its allocation for a
wider one (``restarts_spent``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from hpc_core.slurm import node_usable
from hpc_train.contract import Cause


def restarts_spent(requeues: int, in_job: int, grows: int) -> int:
    """The restarts ``--max-restarts`` has counted so far: Slurm's requeues of the job
    (``SLURM_RESTART_COUNT``) and the in-job restarts, less the ``grows`` (requeues that were a
    grow back to more nodes).

    A grow is no failure: the budget is there to end a run that keeps failing, and a grow
    spending it would end a healthy run FAILED ("restart budget exhausted") after growing on its
    last allowed restart, and leave fewer restarts for real failures the more often it grew.
    Grows need no budget of their own: at most one per ``--grow-after`` window, only while the
    run is below ``--nodes`` MAX, and only when Slurm would start the wider job at once.
    """
    return requeues - grows + in_job


def restart_allowed(restart: int, max_restarts: int) -> bool:
    """May the run have restart number ``restart`` (1 = the first restart)?"""
    return restart <= max_restarts


def may_requeue(restart: int, max_restarts: int) -> bool:
    """Is a restart left after start number ``restart`` (a requeue, an eviction)?"""
    return restart_allowed(restart + 1, max_restarts)


# more grows than any run has: one per --grow-after window at most, each a requeue
GROWS_UNCOUNTED = 1_000_000


def submitit_max_num_timeout(max_restarts: int) -> int:
    """submitit's own requeue counter (``max_num_timeout``): it must never end a run before
    the launcher's check at the next start (``restart_allowed``, the one budget) does.

    submitit counts a notice as a time-out by the clock alone (past 80 % of the time limit, or
    its last 10 minutes), so a grow sent late in an allocation counts there while
    ``restarts_spent`` does not count it: the counter leaves room for the grows."""
    return max_restarts + GROWS_UNCOUNTED


# crashes a node may cause: no report at all (a rank killed), or an infrastructure error
BLAMED_CRASHES = frozenset({Cause.CRASH, Cause.INFRASTRUCTURE})


class Action(Enum):
    FINISHED = "finished"  # training reached max-update: the task succeeds
    SAVED_ON_NOTICE = "saved on notice"  # this task's part ends well; Slurm or task 0 requeues
    CANCELLED = "cancelled"  # the user cancelled the job: never requeued
    RESTART = "restart"  # task 0 restarts the run: a round in the allocation, or a requeue
    FAIL = "fail"  # the task fails: no restarts left, or a peer task decides


@dataclass(frozen=True)
class Decision:
    action: Action
    why: str
    cause: Cause  # the class of the stop, for the ledger's ``stopped`` (``finished``: none)
    blame: bool = False  # task 0 names a suspect node, drains it (unless --no-drain), excludes it
    restart: int = 0  # RESTART: the restart it is, as --max-restarts counts them (1: the first)
    max_restarts: int = 0  # RESTART: --max-restarts

    def restarting(self, in_job: bool) -> str:
        """What a RESTART is, said truthfully once task 0 has chosen (``Launcher._after``):
        ``<why>: in-job round n/m`` or ``<why>: requeue n/m`` (restart n of --max-restarts m,
        in-job rounds and requeues counted together)."""
        how = "in-job round" if in_job else "requeue"
        return f"{self.why}: {how} {self.restart}/{self.max_restarts}"


def after_exit(
    returncode: int,
    saved_on_notice: bool,
    task: int,
    restart: int,
    max_restarts: int,
    cancelled: bool = False,
    hang: str | None = None,
    crash: tuple[Cause, str] | None = None,
    repeated: bool = False,
) -> Decision:
    """The launcher's move once torchrun has exited on one node.

    ``saved_on_notice``: the workers left a stop marker for this start. ``cancelled``: Slurm says
    the job was cancelled (``scancel``): a cancel is final, whatever the exit looked like.
    ``hang``: the watchdog stopped the workers (why): task 0 blames a node and restarts.
    ``crash``: (class, description) of the exception the workers reported (``hpc_train.faults.failures``);
    ``repeated``: it is the same user error at the same update as in the round before, so the
    run stops instead of spending its restarts on it. ``blame``: a hang, or a crash that is not
    the training code's: task 0 looks for the node at fault (``hpc_train.faults.node_blame``).
    Only task 0 restarts the run (``Action.RESTART``: ``Launcher._after`` chooses a round in
    the allocation or a requeue), so one job restarts once however many nodes saw the failure.
    """
    if cancelled:
        why = "the job was cancelled (scancel): not requeued"
        return Decision(Action.CANCELLED, why, Cause.CANCELLED)
    if hang is not None:
        return after_hang(f"hang: {hang}", task, restart, max_restarts)
    if returncode == 0 and not saved_on_notice:
        return Decision(Action.FINISHED, "training finished", Cause.FINISHED)
    why = "stopped on notice" if returncode == 0 else f"torchrun exited with {returncode}"
    cause = Cause.NOTICE if saved_on_notice else Cause.CRASH
    if crash is not None and not saved_on_notice and returncode != 0:
        cause, why = crash[0], f"{why} ({crash[0]}: {crash[1]})"
    if task != 0:
        if saved_on_notice:  # durable; the requeue that follows may kill torchrun here first
            return Decision(
                Action.SAVED_ON_NOTICE, f"{why} after the save on notice: task 0 requeues", cause
            )
        return Decision(Action.FAIL, f"{why}; task 0 decides on a requeue", cause)
    if repeated:
        again = "the same error at the same update as the round before: stopping, no restart"
        return Decision(Action.FAIL, f"{why}; {again}", cause)
    blame = cause in BLAMED_CRASHES  # a node may be at fault: task 0 looks for one
    return restart_or_fail(Decision(Action.RESTART, why, cause, blame), restart, max_restarts)


def after_hang(why: str, task: int, restart: int, max_restarts: int) -> Decision:
    """``after_exit`` for a hang the watchdog stopped (``why``): task 0 blames a node and
    restarts without it where its blame drains it; the other tasks fail and wait."""
    if task != 0:
        return Decision(Action.FAIL, f"{why}; task 0 blames a node and requeues", Cause.HANG)
    without = f"{why}: without the suspect node where its blame drains it"
    return restart_or_fail(Decision(Action.RESTART, without, Cause.HANG, True), restart,
                           max_restarts, failed=why)  # fmt: skip


def restart_or_fail(
    decision: Decision, restart: int, max_restarts: int, failed: str | None = None
) -> Decision:
    """``decision`` (a RESTART) as restart number ``restart + 1`` of ``max_restarts``, or a
    FAIL when none is left (why: ``failed``, else the decision's own why)."""
    if not may_requeue(restart, max_restarts):
        budget = f"no restarts left (--max-restarts {max_restarts})"
        return replace(decision, action=Action.FAIL, why=f"{failed or decision.why}; {budget}")
    return replace(decision, restart=restart + 1, max_restarts=max_restarts)


def evicting(outcome: Decision, node: str | None) -> Decision:
    """The decision once the workers stopped to evict a straggler ``node``: the stop's class is
    ``straggler`` (the save on notice was ours), the requeue excludes the node."""
    if node is None or outcome.action is not Action.RESTART:
        return outcome
    return replace(outcome, cause=Cause.STRAGGLER, why=f"{outcome.why}; evicting {node}")


def after_refusal(why: str, restart: int, max_restarts: int) -> Decision:
    """Task 0's move when a start cannot run (a node short of GPUs, quarantined): requeue
    without the nodes, while the budget lasts."""
    return restart_or_fail(Decision(Action.RESTART, why, Cause.BAD_NODE, True), restart,
                           max_restarts)  # fmt: skip


def no_progress(resume_points: Sequence[int], limit: int) -> str:
    """Why the run stops for want of progress, or "": ``resume_points`` are the updates each
    start of the run resumed from, in order, this one last; ``limit`` restarts in a row that
    resumed from the same checkpoint as the start before them stop it (0: never)."""
    if limit <= 0:
        return ""
    same = 0
    for before, now in itertools.pairwise(resume_points):
        same = same + 1 if now == before else 0
    if same < limit:
        return ""
    return (
        f"{same} restarts in a row resumed from update {resume_points[-1]}: no checkpoint "
        f"advanced (--max-no-progress-restarts {limit})"
    )


# ParallelCluster's node names (<queue>-st|dy-<compute resource>-<n>): its clustermgtd replaces a
# node set DRAIN or DOWN, so a requeue waits for the replacement instead of stopping the run
PCLUSTER_NODE = re.compile(r"^[a-z0-9-]+-(st|dy)-[a-z0-9-]+-\d+$")


def nodes_replaced(setting: str, nodes: Collection[str]) -> bool:
    """Does the cluster replace a node that is drained or down (``--nodes-replaced``)? yes, no,
    or auto: where every node of the partition has a ParallelCluster name."""
    if setting != "auto":
        return setting == "yes"
    return bool(nodes) and all(PCLUSTER_NODE.match(n) for n in nodes)


def excluded_by_name(blamed: Sequence[str], replaced: bool, drained: bool) -> list[str]:
    """The blamed nodes a requeue keeps out by name (``ExcNodeList``, for the rest of the job's
    life): every one, unless the cluster replaces drained nodes and they were drained. Then the
    drain keeps each out until its replacement, another machine under the same name, which the
    job may use: excluded by name, it never could (a run as wide as its queue would wait
    forever, and each blame would narrow the partition for good)."""
    return [] if replaced and drained else list(blamed)


def quarantined_by_name(
    held: Sequence[str], states: Mapping[str, str], replaced: bool
) -> list[str]:
    """The quarantined nodes (``held``: each still on the machine it quarantined) a requeue
    keeps out by name: every one, unless the cluster replaces drained nodes and the node is not
    usable now (drained, down; ``states`` from sinfo). Then that keeps it out until its
    replacement, a machine the quarantine does not hold, which the job may use (pure)."""
    return [n for n in held if excluded_by_name([n], replaced, not node_usable(states.get(n, "")))]


def requeue_blocked(
    states: Mapping[str, str], excluded: Collection[str], min_nodes: int, replaced: bool
) -> tuple[Decision | None, str]:
    """Before task 0 requeues: can the job start again in its partition? ``states``: every node
    of the partition (``slurm.partition_nodes``); ``excluded``: the nodes the requeue leaves out
    (by name: blamed, quarantined); ``replaced``: does the cluster replace drained nodes
    (``nodes_replaced``). Returns (a FAIL decision instead of the requeue, or None; what to
    say: "" when enough nodes are usable)."""
    ok = [n for n, s in states.items() if node_usable(s) and n not in excluded]
    if len(ok) >= min_nodes:
        return None, ""
    out = [f"{n} ({'excluded' if n in excluded else s})" for n, s in sorted(states.items())
           if n not in ok]  # fmt: skip
    why = (
        f"the requeued job cannot start: {len(ok)} usable node(s) in its partition, it needs "
        f"{min_nodes}; not usable: {', '.join(out)}"
    )
    if replaced:
        return None, f"{why}; waiting for the cluster to replace the drained nodes"
    stopping = Decision(Action.FAIL, f"{why}; nothing replaces them here: stopping", Cause.NO_NODES)
    return stopping, why
