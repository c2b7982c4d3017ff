"""What follows a start's end: the restart policy, pure.

``after_end(evidence, options)`` is the whole decision: it weighs one start's end, read once by
``hpc_train.faults.end_evidence`` (``EndEvidence``: torchrun's exit, the files of the round and
of the round before, the ledger, Slurm's word), and answers with one ``launch.transition``
case: finish, stop with a cause, hold, requeue without the nodes it leaves out, an in-job round
on its members and spares, follow task 0's word, or ask Slurm again after a back-off (the
executor, ``launch.recovery``, asks and calls it again). Whether to blame, whom
(``faults.suspects``' picks) and whether the blame drains are decided here, never in a
watcher. Tested as a table (tests/hpc_train/launch/test_end_policy.py): every cause by
requeue, in-job round and hot spares.

``--max-restarts N`` is the number of restarts a run may have in all, whatever caused them
(preemption, node failure, a crash, the time limit): start number N + 1 is the last one. Slurm
counts them (``SLURM_RESTART_COUNT``), so requeues Slurm performs by itself count too. One kind
is not counted: a grow (``--grow-after``), the run's own choice to trade its allocation for a
wider one (``restarts_spent``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import NoReturn

from hpc_core.slurm import DEFAULT_SLURMD_TIMEOUT_S, SILENCE_PATIENCE_S, node_usable
from hpc_core.wait import Backoff
from hpc_train.contract import Cause
from hpc_train.faults import failures
from hpc_train.faults.end_evidence import EndEvidence, Ending, JobWord, NodeWord, Question, Where
from hpc_train.faults.suspects import (
    Blame,
    Evidence,
    Suspect,
    crash_suspect,
    drain_verdict,
    earlier,
    hang_suspect,
    holds,
    quarantined,
)
from hpc_train.job.spec import JobSpec
from hpc_train.launch.transition import (
    AskSlurm,
    Finish,
    Follow,
    HangVerdict,
    Hold,
    Ignore,
    InJobRound,
    Proceed,
    Requeue,
    RequeueBy,
    Stop,
    StoppedLine,
    Transition,
)


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
    HOLD = "hold"  # task 0 holds the job in Slurm: no restart into the same failure (storage)
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
        """What a RESTART is, said truthfully once task 0 has chosen (``after_end``):
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
    node_only: bool = False,
) -> Decision:
    """The launcher's move once torchrun has exited on one node.

    ``saved_on_notice``: the workers left a stop marker for this start. ``cancelled``: Slurm says
    the job was cancelled (``scancel``): a cancel is final, whatever the exit looked like.
    ``hang``: the watchdog stopped the workers (why): task 0 blames a node and restarts.
    ``crash``: (class, description) of the exception the workers reported (``hpc_train.faults.failures``);
    ``repeated``: it is the same user error at the same update as in the round before, so the
    run stops instead of spending its restarts on it. ``blame``: a hang, or a crash that is not
    the training code's: task 0 looks for the node at fault (``after_end``, with the picks of
    ``hpc_train.faults.suspects``). A storage failure holds the job (no restart into the same
    full or broken file system), unless ``node_only``: only some nodes saw it while the others
    write (``failures.storage_failure``): those nodes are blamed and the run restarts without them.
    Only task 0 restarts the run (``Action.RESTART``: ``after_end`` chooses a round in
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
    if cause is Cause.STORAGE and not node_only:  # a restart meets the same file system
        held = "held: `scontrol release` resumes the job once the storage is fixed"
        return Decision(Action.HOLD, f"{why}; {held}", cause)
    blame = cause in BLAMED_CRASHES or node_only  # a node may be at fault: task 0 looks for one
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


# --- after_end: the whole decision once a start has ended (pure) ---------------------------------

LOST_POLL = Backoff(1.0, 1.5, 5.0)  # Slurm's word on a node whose slurmd may be gone
# the partition's word asked with a decision's first question is asked again for a requeue
# where a later ask came this long after it (a wait for Slurm's word on a node: it may say
# otherwise now), or after it failed
PARTITION_FRESH_S = 5.0


@dataclass(frozen=True)
class EndOptions:
    """What the policy reads of the job's spec, derived once per start (``of``)."""

    updates: int  # max-update
    max_restarts: int
    in_job: bool  # --restart-in-job (or --spares)
    nodes_min: int
    drain: bool  # not --no-drain
    nodes_replaced: str  # --nodes-replaced
    partition: str | None

    @classmethod
    def of(cls, spec: JobSpec) -> EndOptions:
        recovery = spec.recovery
        return cls(spec.updates, recovery.max_restarts, recovery.in_job_restarts,
                   spec.sizing.nodes_min, not recovery.no_drain, recovery.nodes_replaced,
                   spec.slurm.partition)  # fmt: skip


def refill(
    members: Sequence[str], standby: Sequence[str], width: int
) -> tuple[list[str], list[str]]:
    """An in-job restart's nodes: ``members`` (the healthy ones) topped up to ``width`` from the
    hot spares in ``standby``; returns (members, the spares left)."""
    taken = list(standby[: max(0, width - len(members))])
    return [*members, *taken], [n for n in standby if n not in taken]


class _Unanswered(Exception):
    """The decision waits on Slurm's word: ``after_end`` answers ``ask``."""

    def __init__(self, ask: AskSlurm) -> None:
        super().__init__(ask.question)
        self.ask = ask


def _ask(question: Question, after_s: float = 0.0, said: tuple[str, ...] = ()) -> NoReturn:
    raise _Unanswered(AskSlurm(question, after_s, said=said))


def after_end(ev: EndEvidence, opt: EndOptions) -> Transition:
    """What follows the end ``ev`` (see the module docstring); pure: the same evidence, the
    same answer. ``AskSlurm`` when a decision waits on Slurm's word."""
    try:
        return ENDINGS[ev.ending](ev, opt)
    except _Unanswered as unanswered:
        return unanswered.ask


def _job_word(ev: EndEvidence, also: Question | None = None) -> JobWord:
    """The job's word, asked with ``also`` (what the decision needs next: one wait for all)."""
    return ev.slurm.job or _ask(replace(also or Question(), job=True))


def _weighing(ev: EndEvidence, opt: EndOptions, hang: bool) -> Question:
    """What weighing a bad end on task 0 asks Slurm after the job's word (a cancel?), asked with
    it and answered at once (``end_evidence.ask``), not one after another (issue 46: a
    requeue's five calls in a row were 1.45 s of its decision at 39 hollow nodes, 0.07 s at 2):
    the node the evidence points to (``hang``: the hang's reports; else the crash's), whether
    Slurm lost it and its machine (the blame's); after a kill by a signal, whether a step still
    starts there (``_unless_lost``; on a node Slurm has lost already, a probe it did not need,
    at most its timeout: Slurm marks a node lost long after its ranks' peers saw it go); and,
    without in-job restarts (a restart is a requeue), whether the requeued job could start
    (the partition)."""
    found = _hang_suspect(ev) if hang else _crash_suspect(ev)
    nodes = (found.node,) if found is not None else ()
    probed = nodes if found is not None and found.evidence is Evidence.SIGNAL else ()
    return Question(nodes=nodes, steps=probed, partition=not opt.in_job,
                    partition_name=opt.partition)  # fmt: skip


def _hang_suspect(ev: EndEvidence) -> Suspect | None:
    nodes = list(ev.where.hosts) or sorted({r.node for r in ev.hang_ranks})
    return hang_suspect(ev.hang_ranks, ev.hang_reported, nodes)


def _crash_suspect(ev: EndEvidence) -> Suspect | None:
    hosts = ev.where.hosts
    ranks = {b.rank: b.node for h in hosts for b in ev.beats.get(h, ())}
    return crash_suspect(ev.failures, ev.exits, hosts, ranks)


def _node_words(
    ev: EndEvidence, nodes: Sequence[str], also: Question | None = None
) -> list[NodeWord]:
    """Slurm's word on each of ``nodes`` (asked at once for the ones it has not given, with
    ``also``: what the decision needs next)."""
    missing = tuple(n for n in dict.fromkeys(nodes) if n not in ev.slurm.nodes)
    if missing:
        _ask(replace(also or Question(), nodes=missing))
    return [ev.slurm.nodes[n] for n in nodes]


def blame_of(
    ev: EndEvidence, node: str, why: str, evidence: Evidence, cause: Cause,
    suspect: Suspect | None = None,
) -> tuple[Blame, tuple[str, ...]]:  # fmt: skip
    """``node`` blamed on ``evidence`` for a stop of ``cause``, its verdict from the machine's
    earlier blames in the ledger (``suspect``: the stop's, its rank recorded); what to say."""
    (word,) = _node_words(ev, [node])
    said = (f"cannot tell {node}'s machine ({word.error}): the blame counts against the name",)
    machine = "" if word.error else word.machine
    verdict = drain_verdict(evidence, earlier(ev.events, node, machine, ev.time))
    rank = suspect.rank if suspect is not None else None
    found = Blame(node, why, evidence, verdict, machine, cause, rank, suspect is not None)
    return found, said if word.error else ()


def _progress(ev: EndEvidence) -> dict[str, float | int]:
    """How far the round got (task 0 records it): the last update any rank completed
    (``reached``) and when (``last_progress``), from the round's heartbeats."""
    beats = [b for h in ev.where.hosts for b in ev.beats.get(h, ())]
    if ev.where.task != 0 or not beats:
        return {}
    reached = max(b.update for b in beats)
    return {"reached": reached, "last_progress": max(b.time for b in beats if b.update == reached)}


def _exit_settled(
    ev: EndEvidence, opt: EndOptions
) -> tuple[int, str | None, str | None, list[str]]:
    """torchrun's exit as the ranks left it: (returncode, hang, stuck, what to say). An agent
    killed after its ranks finished or saved on notice (the kill was ours), or one that failed
    after its ranks finished (its exit barrier lost a stuck peer's store): exit 0."""
    ended = ev.ended
    assert ended is not None
    own = ev.beats.get(ev.where.node, ())
    finished = bool(own) and min(b.update for b in own) >= opt.updates and not ev.failures
    returncode, hang, stuck = ended.returncode, ended.hang, ended.stuck
    if stuck is not None and hang is None:
        if ended.saved or finished:  # the kill was ours: the start ends as its ranks left it
            killed = f"torchrun was stuck after its ranks finished ({stuck}): killed"
            return 0, None, stuck, [killed]
        return returncode, f"torchrun stuck: {stuck}", stuck, []
    if returncode != 0 and hang is None and finished:
        stuck = f"torchrun exited {returncode} after its ranks finished training"
        return 0, None, stuck, [stuck]
    return returncode, hang, stuck, []


def _cancelled(ev: EndEvidence, opt: EndOptions, hang: bool) -> tuple[bool, list[str]]:
    """Did the user cancel the job (``scancel``)? scancel sends SIGTERM to every task with no
    notice before it; a preemption or the time limit sends the notice (USR2) first: every node
    tells a cancel by its own signals. Slurm's own word counts too, though while the steps are
    torn down it only says COMPLETING: task 0 alone asks it, one look-up for the job whatever
    its size; the other tasks follow task 0's verdict (a cancel's is ``DONE``) or fail their
    part while task 0 decides (issue 46: one ``scontrol show job`` per node before). Asked
    with what the decision needs next (``_weighing``; ``hang``: the end is a hang's)."""
    if ev.signals[:1] == ("SIGTERM",):
        return True, []
    if ev.where.task != 0:
        return False, []
    job = _job_word(ev, _weighing(ev, opt, hang))
    if job.error:
        return False, [f"cannot tell a cancel from a crash ({job.error}): treating it as a crash"]
    return job.state == "CANCELLED", []


def _unless_lost(ev: EndEvidence, found: Suspect) -> tuple[Suspect, list[str]]:
    """A signal kill (``found``) whose node Slurm then finds lost is a lost node: a node lost
    whole (chaos kill-node --stop-slurmd, a dead instance) first looks like its ranks killed,
    and Slurm marks it DOWN only after SlurmdTimeout. So: lost where Slurm says so already;
    else, where no step starts on it any more (``slurm.step_starts``), lost once Slurm marks it
    not responding or down within SlurmdTimeout, node and step asked again after ``LOST_POLL``'s
    back-off (a step that starts ends the wait: a controller just back refuses the first ones).
    The probe alone never makes a node lost: without Slurm's word the signal kill stands.
    Slurm's silence is no word: asked again, the wait begun afresh once it answers, for at most
    ``slurm.SILENCE_PATIENCE_S`` of silence in all."""
    node, word = found.node, _node_words(ev, [found.node])[0]
    said = [f"cannot read node {node} ({word.error})"] if word.error and not word.silent else []
    if word.lost:
        why = f"{found.why}, then Slurm lost it: {word.state} ({word.reason})"
        return found._replace(why=why, evidence=Evidence.LOST), said
    silent = ev.slurm.silence or (word.error if word.silent else "")
    if not silent and node not in ev.slurm.steps:
        _ask(Question(steps=(node,)))
    starts = ev.slurm.steps[node][0] if node in ev.slurm.steps else None
    if not silent and starts:
        return found, said
    if not silent and starts is False and ev.slurm.slurmd_timeout_s is None:
        _ask(Question(slurmd_timeout=True))  # how long Slurm waits for a silent slurmd
    again = LOST_POLL.delay(ev.slurm.asked.get(node, 0) - 1)
    if silent or starts is None:  # no word, or no probe answered: ask both again
        silent = silent or f"no step probed on {node}"
        if ev.slurm.silent_s > SILENCE_PATIENCE_S:
            return found, [*said, f"Slurm silent for {ev.slurm.silent_s:.0f} s ({silent}): "
                                  f"weighed as {found.evidence}"]  # fmt: skip
        waiting = f"Slurm does not answer ({silent}): asking again about {node}"
        _ask(Question(nodes=(node,), steps=(node,)), again, (f"{waiting} in {again:.0f} s",))
    timeout = ev.slurm.slurmd_timeout_s or DEFAULT_SLURMD_TIMEOUT_S
    probed, since = ev.slurm.steps[node][1], ev.slurm.no_start_since[node]
    if (waited := probed - since) < timeout:
        first = (f"no step starts on {node}: waiting up to {timeout:.0f} s for Slurm's word",)
        _ask(Question(nodes=(node,), steps=(node,)), min(again, timeout - waited),
             first if probed == since else ())  # fmt: skip
    return found, [*said, f"Slurm still counts {node} as up: weighed as {found.evidence}"]


def _stop_suspect(
    ev: EndEvidence, cause: Cause, held: failures.Storage | None
) -> tuple[Suspect | None, str, HangVerdict | None, list[str]]:
    """Task 0: the node a hang's reports, a crash's evidence or a storage failure only some
    nodes see (``held``, weighed already) point to, why (the blame's), the hang's verdict for
    ``suspect.json``, and what to say."""
    files = ev.where.files
    job = files.name  # as the log and the ledger have always said it (a round's: 41.1)
    if cause == Cause.HANG:
        found = _hang_suspect(ev)
        said = [f"hang: suspect {found.node}: {found.why}" if found else
                "hang: no suspect node (no rank had completed an update)"]  # fmt: skip
        why = f"hang in job {job}: {found.why}" if found else ""
        return found, why, HangVerdict(files.incident, found), said
    if cause == Cause.STORAGE:  # only these nodes saw it (failures.storage_failure's node_only)
        assert held is not None
        node = held.nodes[0]
        return (
            Suspect(node, held.line(), Evidence.STORAGE),
            f"storage in job {job}: {held.line()}",
            None,
            [],
        )
    found = _crash_suspect(ev)
    lost: list[str] = []
    if found is not None and found.evidence is Evidence.SIGNAL:
        found, lost = _unless_lost(ev, found)
    return found, f"crash in job {job}: {found.why}" if found else "", None, lost


def _stop_blames(
    ev: EndEvidence, outcome: Decision, held: failures.Storage | None
) -> tuple[Suspect | None, tuple[Blame, ...], HangVerdict | None, list[str]]:
    """Whom this stop blames (task 0): the node its evidence points to (``outcome.blame``: a
    hang, a crash a node may cause), and a straggler the watch evicted; the stop's suspect."""
    assert ev.ended is not None
    found, why, hang, said = (
        _stop_suspect(ev, outcome.cause, held) if outcome.blame else (None, "", None, [])
    )
    blames = []
    if found is not None:
        blame, told = blame_of(ev, found.node, why, found.evidence, outcome.cause, found)
        blames.append(blame)
        said += told
    evicted = ev.ended.evicted
    if evicted is not None and (found is None or found.node != evicted.node):
        why = f"straggler in job {ev.where.files.job}: {evicted.why}"
        blame, told = blame_of(ev, evicted.node, why, Evidence.STRAGGLER, Cause.STRAGGLER)
        blames.append(blame)
        said += told
        found = found or evicted._replace(why=f"straggler: {evicted.why}")
    return found, tuple(blames), hang, said


def _after_exit(ev: EndEvidence, opt: EndOptions) -> Transition:
    """torchrun exited on this node: finished, saved on notice, cancelled, failed, held, or (task
    0) restarted in the allocation or requeued, with the blames that follow."""
    ended, where = ev.ended, ev.where
    assert ended is not None
    if ev.decided is not None:  # recorded and carried out by whoever decided it: not twice
        done = f"the round's end was decided already ({ev.decided.action}: {ev.decided.why})"
        return Ignore(
            done, said=(f"torchrun exited with {ended.returncode}; {done}: nothing to add",)
        )
    returncode, hang, stuck, said = _exit_settled(ev, opt)
    cancelled = False
    if returncode != 0 and not ended.saved:
        cancelled, told = _cancelled(ev, opt, hang is not None)
        said += told
    crash, repeated = (None, False)
    if returncode != 0 and not hang:  # the watchdog's kill makes the peers report lost peers
        crash, repeated = failures.explain(ev.failures, ev.before)
    held = _storage(ev) if returncode != 0 and not hang and not ended.saved else None
    if held is not None:  # storage, whatever the ranks' exceptions wrap
        crash, repeated = (Cause.STORAGE, held.line()), False
    outcome = after_exit(returncode, ended.saved, where.task, where.spent, opt.max_restarts,
                         cancelled, hang, crash, repeated, held is not None and held.node_only)  # fmt: skip
    if outcome.action is Action.HOLD and held is not None:
        outcome = replace(outcome, why=held_why(held.line(), where.files.job))
    outcome = evicting(outcome, ended.evicted.node if ended.evicted else None)
    suspect, blames, verdict, told = _stop_blames(ev, outcome, held)
    if crash and crash[0] == Cause.CRASH and suspect is not None:  # the blamed node says why
        crash = (Cause.CRASH, f"{suspect.node}: {suspect.why}")
    detail = crash[1] if crash else hang or f"torchrun exited with {returncode}"
    progress = _progress(ev)
    if outcome.action is Action.FINISHED:
        why = f"{outcome.why}; then {stuck}: killed" if stuck else outcome.why
        found: Transition = Finish(why, progress)
    else:
        error = crash[1] if crash else None
        line = StoppedLine(outcome.cause, outcome.why, returncode, error, progress=progress)
        found = _outcome(ev, opt, outcome, line, detail, blames)
    said = [*said, *told, *found.said]
    return replace(found, blames=blames, hang=verdict, said=tuple(said))


def _storage(ev: EndEvidence) -> failures.Storage | None:
    """The end's storage failure, if it is one (``failures.storage_failure`` on the ranks' reports,
    files and stderr, and every node's probe of the save dir)."""
    return failures.storage_failure(ev.failures, ev.probes, ev.where.files.run.root, ev.needed)


def held_why(line: str, job: str) -> str:
    """What a held job says, in one line: what failed, then how to resume it."""
    return f"{line}; job {job} held: fix the storage, then `scontrol release {job}` resumes it"


def _outcome(
    ev: EndEvidence, opt: EndOptions, outcome: Decision, stopped: StoppedLine, detail: str,
    blames: tuple[Blame, ...],
) -> Transition:  # fmt: skip
    """A bad or early end's transition: ``stopped`` (the ledger's line) says what follows."""
    where = ev.where
    restart = outcome.action is Action.RESTART
    leave_out = tuple(b.node for b in blames if b.leaves)
    members = _in_job_round(where, opt, leave_out) if restart else None
    why = outcome.restarting(in_job=members is not None) if restart else outcome.why
    stopped = replace(stopped, why=why)
    if outcome.action in (Action.CANCELLED, Action.SAVED_ON_NOTICE):
        saved = {"stopped": True} if outcome.action is Action.SAVED_ON_NOTICE else {}
        return Stop(outcome.cause, why, False, stopped, result=saved, said=(why,))
    if outcome.action is Action.HOLD:
        return Hold(outcome.cause, why, stopped, said=(why,))
    if outcome.action is Action.FAIL:
        if where.task != 0 and opt.in_job:  # task 0 decides the round's end
            return Follow(why, said=(why,))
        return Stop(outcome.cause, why, True, stopped, said=(why,))
    said = (f"job {where.files.job}: {why}",)
    if members is not None:
        return InJobRound(f"{outcome.cause}: {detail}", stopped, *members, said=said)
    requeue = Requeue(outcome.cause, "requeue did not take effect", stopped, leave_out,
                      blames=blames, said=said)  # fmt: skip
    return _requeue(ev, opt, requeue)


def _in_job_round(
    where: Where, opt: EndOptions, left_out: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None:
    """The next round in the allocation: (members, standby, left out, spares taken in), without
    the nodes the blames leave out (a hot spare in each one's place; a node blamed but not
    drained, a first signal kill, trains on); None for a requeue instead: without in-job
    restarts, or when fewer than ``--nodes`` MIN nodes would be left."""
    healthy = [h for h in where.hosts if h not in left_out]
    members, standby = refill(healthy, where.standby, where.num_nodes)  # a spare for each
    if not opt.in_job or len(members) < opt.nodes_min:
        return None
    return tuple(members), tuple(standby), tuple(left_out), tuple(members[len(healthy) :])


def _held_now(ev: EndEvidence, blames: Sequence[Blame]) -> list[str]:
    """The nodes the quarantine holds, with this decision's blames: each still on the machine it
    quarantined (Slurm's word; one it cannot tell is held, one held by name is not asked)."""
    files = ev.where.files
    entries = quarantined([*ev.events, *(b.event(files.name, files.restart, ev.time)
                                         for b in blames)])  # fmt: skip
    listed = sorted({e.node for e in entries})
    asked = [n for n in listed if any(e.machine for e in entries if e.node == n)]
    words = dict(zip(asked, _node_words(ev, asked), strict=True))

    def machine_now(node: str) -> str | None:
        word = words.get(node)
        return None if word is None or word.error else word.machine

    return [n for n in listed if holds(entries, n, machine_now(n))]


def _requeue(ev: EndEvidence, opt: EndOptions, requeue: Requeue) -> Requeue | Stop:
    """``requeue`` once Slurm says the requeued job could start (one sinfo, the job's
    ExcNodeList; asked with the decision's first question where a restart can only be a
    requeue, ``_weighing``, and again where it is stale, ``PARTITION_FRESH_S``): which of the
    nodes it leaves out it excludes by name (``excluded_by_name``, the quarantine's:
    ``quarantined_by_name``), and whether enough usable nodes are left for ``--nodes`` MIN
    (``requeue_blocked``). Where none could replace the missing ones the run
    stops (``Stop``, ``Cause.NO_NODES``); a Slurm error is said and the requeue goes ahead,
    every node it leaves out excluded: it is Slurm's to refuse then."""
    part = ev.slurm.partition
    late = part is not None and part.time < ev.slurm.last_s
    if part is None or (late and (part.error or ev.slurm.last_s - part.time > PARTITION_FRESH_S)):
        _ask(Question(partition=True, partition_name=opt.partition))
    if part.error:
        said = f"cannot tell whether the requeued job can start ({part.error}): requeueing"
        return replace(requeue, said=(*requeue.said, said))
    held_now = _held_now(ev, requeue.blames)
    replaced = nodes_replaced(opt.nodes_replaced, part.states)
    blamed = excluded_by_name(requeue.exclude, replaced, opt.drain)
    by_name = sorted(set(blamed) | set(quarantined_by_name(held_now, part.states, replaced)))
    out = set(part.excluded) | set(held_now) | set(by_name)
    blocked, said = requeue_blocked(part.states, out, opt.nodes_min, replaced)
    told = (*requeue.said, said) if said else requeue.said
    if blocked is not None:
        return Stop(Cause.NO_NODES, blocked.why, True, requeue.stopped, blocked=said,
                    blames=requeue.blames, hang=requeue.hang, said=told)  # fmt: skip
    return replace(requeue, exclude=tuple(by_name), waiting=said, said=told)


def start_over(job: JobWord, job_id: str, restart: int) -> str:
    """Why a launcher's start is no longer the job's ("" while it is): the job is not RUNNING
    at the restart it was started at (``restart``). A launcher its slurmd left behind (a node
    lost, its processes alive) must not blame, drain or signal the job's next start. Slurm
    silent: "" (act as the one in charge)."""
    if job.error or (job.state == "RUNNING" and job.restarts == restart):
        return ""
    return (
        f"job {job_id} is {job.state} at restart {job.restarts}; this launcher belongs to "
        f"restart {restart}"
    )


def _after_refusal(ev: EndEvidence, opt: EndOptions) -> Transition:
    """The start cannot run (a node short of GPUs, quarantined, failing its check): task 0
    blames those nodes (drained: a failed health check), requeues without them while the budget
    lasts; every task fails this start."""
    why = f"start refused: {ev.detail}"
    if ev.where.task != 0:
        return Stop(Cause.BAD_NODE, f"{why}; task 0 requeues", True, said=(why,))
    requeue = Question(partition=True, partition_name=opt.partition)
    _node_words(ev, ev.nodes, requeue)  # asked at once, with the partition its requeue needs
    said, blames = [why], []
    for node in ev.nodes:
        blame, told = blame_of(ev, node, ev.detail, Evidence.HEALTH_CHECK, Cause.BAD_NODE)
        blames.append(blame)
        said += told
    left_out = [b.node for b in blames if b.leaves]
    outcome = after_refusal(why, ev.where.spent, opt.max_restarts)
    stopped = StoppedLine(Cause.BAD_NODE, ev.detail)
    if outcome.action is Action.FAIL:
        return Stop(Cause.BAD_NODE, outcome.why, True, stopped, blames=tuple(blames),
                    said=tuple(said))  # fmt: skip
    said.append(outcome.restarting(in_job=False))
    ended = f"{why}: requeued without {', '.join(left_out)}"
    return _requeue(ev, opt, Requeue(Cause.BAD_NODE, ended, stopped, tuple(left_out),
                                     blames=tuple(blames), said=tuple(said)))  # fmt: skip


def _after_no_progress(ev: EndEvidence, opt: EndOptions) -> Transition:
    """Task 0's decision said the last restarts never advanced: every task stops the run."""
    stopped = StoppedLine(Cause.NO_PROGRESS, ev.detail)
    return Stop(
        Cause.NO_PROGRESS, ev.detail, True, stopped, said=(f"stopping the run: {ev.detail}",)
    )


def _after_no_good_checkpoint(ev: EndEvidence, opt: EndOptions) -> Transition:
    """Task 0 found checkpoints but none that verifies (each set aside): held, not started from
    scratch, not counted a user error; the other tasks end this start."""
    why = held_why(f"no checkpoint verifies: {ev.detail}", ev.where.files.job)
    if ev.where.task != 0:
        return Stop(Cause.CHECKPOINT, f"{why}; task 0 holds the job", True, said=(why,))
    return Hold(Cause.CHECKPOINT, why, StoppedLine(Cause.CHECKPOINT, why), said=(why,))


def _after_reached(ev: EndEvidence, opt: EndOptions) -> Transition:
    """The checkpoint is at max-update already: nothing to train, the run is done."""
    return Finish("max-update reached before this start", said=(ev.detail,))


def _after_notice(ev: EndEvidence, opt: EndOptions) -> Transition:
    """Task 0's ``checkpoint()`` waited for the save on notice: submitit requeues; the stop's
    cause is task 0's own notice's (a grow, a stuck launcher) or the notice."""
    why = "saved on notice" if ev.saved else "notice, but no save on notice in time"
    cause = ev.own_cause or Cause.NOTICE
    stopped = StoppedLine(cause, why, saved=ev.saved, progress=_progress(ev))
    return Requeue(cause, why, stopped, by=RequeueBy.SUBMITIT)


def _after_silence(ev: EndEvidence, opt: EndOptions) -> Transition:
    """The pulse found a watched launcher stuck: blame its node (a hang with no stack: drained
    unless --no-drain), then requeue without it; while training, after a save on notice (the
    ranks are alive): task 0 sends itself the notice (submitit requeues), task 1 acting for a
    stuck task 0 saves on notice and requeues itself; where nothing could replace the node,
    the job ends."""
    why = f"stuck launcher: {ev.detail}"
    files = ev.where.files
    gone = start_over(_job_word(ev), files.job, files.restart)
    if gone:  # e.g. this node's slurmd died: the job was requeued and its processes left
        return Ignore(gone, said=(f"{why}; not acted on: {gone}",))
    (node,) = ev.nodes
    blame, told = blame_of(ev, node, why, Evidence.HANG_NO_STACK, Cause.HANG)
    said = (why, *told)
    if ev.training and ev.where.task == 0:
        return Requeue(Cause.HANG, why, by=RequeueBy.OWN_NOTICE, blames=(blame,), said=said)
    stopped = StoppedLine(Cause.HANG, why, saved=False)
    return _requeue(ev, opt, Requeue(Cause.HANG, why, stopped, (node,) if blame.leaves else (),
                                     save_first=ev.training, blames=(blame,), said=said))  # fmt: skip


def _after_unrecorded(ev: EndEvidence, opt: EndOptions) -> Transition:
    """Task 0, after a start Slurm ended by itself (NODE_FAIL): blame the nodes of it Slurm
    reports lost (down, failed, not responding: a lost node, drained; the requeued job is
    Slurm's and already left it); the start before's end, as the log and the ledger say it."""
    said, blames, lost = [], [], []
    for node, word in zip(ev.nodes, _node_words(ev, ev.nodes), strict=True):
        if word.error:
            said.append(f"cannot read node {node} ({word.error})")
        if not word.lost:
            continue
        state = f"{word.state} ({word.reason})"
        why = f"node failure in job {ev.where.files.job}: {state}"
        blame, told = blame_of(ev, node, why, Evidence.LOST, Cause.CRASH)
        blames.append(blame)
        lost.append(f"{node} {state}")
        said += told
    if not lost:
        return Proceed(ev.detail, said=tuple(said))
    why = f"node failure ({', '.join(lost)}): last periodic checkpoint"
    return Proceed(why, blames=tuple(blames), said=tuple(said))


ENDINGS: Mapping[Ending, Callable[[EndEvidence, EndOptions], Transition]] = {
    Ending.UNRECORDED: _after_unrecorded,
    Ending.EXITED: _after_exit,
    Ending.REFUSED: _after_refusal,
    Ending.NO_PROGRESS: _after_no_progress,
    Ending.NO_GOOD_CHECKPOINT: _after_no_good_checkpoint,
    Ending.REACHED: _after_reached,
    Ending.NOTICE: _after_notice,
    Ending.SILENT: _after_silence,
}
