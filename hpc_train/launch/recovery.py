"""What follows a start's end: the recovery decision; a start refused; a stuck launcher.

"What happens when a rank crashes", in order: the rank's crash report (``worker.crash``) and its
node's agent exit (``faults.agent_exit``) are read back here (``crash_report``);
``restart_policy.after_exit`` (pure) says FINISHED, SAVED_ON_NOTICE, CANCELLED, RESTART or FAIL;
task 0 blames the node behind it (``faults.node_blame``), then (``Launcher._after`` chooses)
requeues without it (``launch.requeue``) or restarts training in the allocation on the healthy
nodes and the hot spares (``launch.rounds``, where the other tasks wait for task 0's word).

- ``assess``: torchrun's exit and what the watchers saw -> ``Aftermath`` (outcome, suspect, crash);
- ``refuse``: a start that could not run (a node short of GPUs): blame, requeue or fail;
  a node is left out where its blame's verdict drains it (``faults.evidence``), never on a blame
  alone: a first signal kill restarts on its node, in the job or by a requeue that may use it;
- ``on_silent``: a stuck launcher found by the pulse (``watch.launchers``): blame, save, requeue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_train.contract import Cause, StartDecision, node_name, read_beats
from hpc_train.faults import failures, node_blame
from hpc_train.faults.suspects import Suspect
from hpc_train.launch import requeue, restart_policy
from hpc_train.launch.context import Here, log
from hpc_train.launch.restart_policy import Action
from hpc_train.launch.signals import OwnNotice, save_wait_s, wait_for_save
from hpc_train.launch.starts import Start
from hpc_train.watch.launchers import Silence


@dataclass(frozen=True)
class Ended:
    """How torchrun ended on this node, and what its watchers saw meanwhile."""

    returncode: int
    saved: bool  # the save on notice is durable (the stop marker)
    hang: str | None = None  # the hang the hang monitor stopped the ranks for
    evicted: Suspect | None = None  # the straggler evicted (--evict-stragglers)
    stuck: str | None = None  # torchrun outlived its ranks: the hang monitor killed it


@dataclass(frozen=True)
class Aftermath:
    """What follows a start's end (``assess``)."""

    outcome: restart_policy.Decision
    returncode: int
    crash: tuple[Cause, str] | None  # (class, description) of what ended the workers
    suspect: Suspect | None  # the node blamed (or evicted)
    stuck: str | None  # why torchrun was killed after its ranks ended, if it was
    hang: str | None  # the hang that stopped the ranks
    leave_out: tuple[str, ...] = ()  # the suspect, where its blame's verdict drains it

    @property
    def detail(self) -> str:
        """What ended the workers, for the verdict and the ledger."""
        if self.crash:
            return self.crash[1]
        return self.hang or f"torchrun exited with {self.returncode}"


def assess(here: Here, ended: Ended, spent: int, cancelled: Callable[[], bool]) -> Aftermath:
    """The restart policy's outcome for this end, and (task 0) the node blamed for it."""
    spec, returncode, hang, stuck = here.spec, ended.returncode, ended.hang, ended.stuck
    if stuck is not None and hang is None:
        returncode, hang = after_stuck_agent(here, stuck, ended.saved, returncode)
    elif returncode != 0 and hang is None and ranks_finished(here):
        # the agent failed after its ranks finished (its exit barrier lost a stuck peer's
        # store): training is done, no rank reported an error
        stuck = f"torchrun exited {returncode} after its ranks finished training"
        log(stuck)
        returncode = 0
    # a SIGTERM after the save on notice is the requeue ending the job, not a cancel
    was_cancelled = returncode != 0 and not ended.saved and cancelled()
    # the watchdog's kill makes the peers report lost connections: that is not the cause
    crash, repeated = (None, False) if returncode == 0 or hang else crash_report(here)
    outcome = restart_policy.after_exit(
        returncode, ended.saved, here.start.task, spent, spec.recovery.max_restarts, was_cancelled,
        hang, crash, repeated,
    )  # fmt: skip
    outcome = restart_policy.evicting(outcome, ended.evicted.node if ended.evicted else None)
    if outcome.blame:
        suspect, leave = node_blame.for_stop(here.blamer(), outcome.cause)
    else:  # a straggler evicted: blamed as it was (always drained: a measured straggler)
        suspect, leave = ended.evicted, ended.evicted is not None
    if crash and crash[0] == Cause.CRASH and suspect is not None:  # the blamed node says why
        crash = (Cause.CRASH, f"{suspect.node}: {suspect.why}")
    left = (suspect.node,) if suspect is not None and leave else ()
    return Aftermath(outcome, returncode, crash, suspect, stuck, hang, left)


def after_stuck_agent(
    here: Here, stuck: str, saved: bool, returncode: int
) -> tuple[int, str | None]:
    """torchrun outlived this node's ranks and its monitor killed it: the start ends as the
    ranks left it: finished or saved on notice (the kill was ours: exit 0), else a hang."""
    if saved or ranks_finished(here):
        log(f"torchrun was stuck after its ranks finished ({stuck}): killed")
        return 0, None
    return returncode, f"torchrun stuck: {stuck}"


def ranks_finished(here: Here) -> bool:
    """Did every rank of this node reach max-update (its heartbeat) with no crash report?"""
    beats = read_beats(here.files.heartbeats(node_name()))
    return (
        bool(beats)
        and min(b.update for b in beats) >= here.spec.updates
        and not failures.read(here.files)
    )


def crash_report(here: Here) -> tuple[tuple[Cause, str] | None, bool]:
    """(class, description) of the exception that ended this round's workers, if any said,
    and whether the round just before it (``StartFiles.round_before``: this start's last round,
    else the last round of the Slurm start before) died of the same user error at the same
    update: the same bad input in in-job rounds 0 and 1 of one start is the same failure
    again, as it is across a requeue."""
    files, start = here.files, here.start
    # task 0 decides: every node's exit record and its ranks' reports
    now = node_blame.crash_evidence(files, start.hosts) if start.task == 0 else failures.read(files)
    cause = failures.first(now)
    if cause is None:
        return None, False
    before = files.round_before(ledger.read(files.run.ledger))
    repeated = failures.repeated(now, failures.read(before) if before else []) is not None
    if all(f.witness for f in now):  # only peers saw a rank go away: the peers' symptom
        return (Cause.CRASH, f"a rank died without a word; its peers saw {cause.describe()}"), False
    return (cause.cause, cause.describe()), repeated


def refuse(here: Here, decision: StartDecision, spent: int) -> None:
    """The start cannot run (a node short of GPUs): task 0 blames those nodes, drains them
    (unless --no-drain), requeues without them while the budget lasts (``spent``: the
    restarts it has counted, ``restarts_spent``); every task fails this start."""
    why = f"start refused: {decision.refused}"
    log(why)
    if here.start.task != 0:
        raise RuntimeError(f"{why}; task 0 requeues")
    here.note(Kind.STOPPED, cause=Cause.BAD_NODE, why=decision.refused)
    left_out = node_blame.refused(here.blamer(), decision.bad_nodes, decision.refused)
    outcome = restart_policy.after_refusal(why, spent, here.spec.recovery.max_restarts)
    if outcome.action is Action.FAIL:
        raise RuntimeError(outcome.why)
    log(outcome.restarting(in_job=False))
    left = ", ".join(left_out)
    requeue.requeue(here, left_out, f"{why}: requeued without {left}")


def on_silent(here: Here, silence: Silence, training: bool, own_notice: OwnNotice) -> None:
    """The pulse thread found a watched launcher stuck: blame its node (drained unless
    --no-drain), then requeue without it; while training, after a save on notice (the
    ranks are alive). Task 0 leaves the requeue to submitit's ``checkpoint()`` as for any
    notice, the notice its own (``own_notice.send(Cause.HANG, ...)``: the cause handed over
    before the USR2 that runs ``checkpoint()`` in this very process); task 1, acting for a
    stuck task 0 (``deputy``), waits for the save itself."""
    start, deputy = here.start, here.start.task != 0
    why = f"stuck launcher: {silence.describe()}"
    gone = start_over(start)
    if gone:  # e.g. this node's slurmd died: the job was requeued and its processes left
        log(f"{why}; not acted on: {gone}")
        return
    log(why)
    leave = node_blame.stuck_launcher(here.blamer(deputy), silence.node, why)
    if training and not deputy:
        own_notice.send(Cause.HANG, start.job_id)  # the save on notice, then submitit's requeue
        return
    saved = False
    if training:  # the save on notice: rank 0's marker alone says it (this node's ranks do not)
        slurm.signal(start.job_id, "USR2")
        saved = wait_for_save(here.files.stop_marker, save_wait_s(here.spec))
    note = here.deputy_note if deputy else here.note
    note(Kind.STOPPED, cause=Cause.HANG, why=why, saved=saved)
    if requeue.send(here, [silence.node] if leave else [], why, deputy) is not None:
        slurm.cancel(start.job_id)  # nothing can replace the node: end the job, not hold it


def start_over(start: Start) -> str:
    """Why this launcher's start is no longer the job's ("" while it is): the job is not
    RUNNING at the restart it was started at. A launcher its slurmd left behind (a node
    lost, its processes alive) must not blame, drain or signal the job's next start."""
    try:
        state = slurm.job_state(start.job_id)
    except slurm.SlurmError:
        return ""  # cannot tell: act as the one in charge
    if state.state == "RUNNING" and state.restarts == start.restart:
        return ""
    return (
        f"job {start.job_id} is {state.state} at restart {state.restarts}; this launcher "
        f"belongs to restart {start.restart}"
    )
