"""One start of a job: which node this is, why the start before ended, and the decision task 0
makes for every node (geometry and what to resume from).

Each node's launcher writes what it found (``NodeReport``: its GPUs, and where ``--node-check``
asks, why its GPU check failed) to the run directory; task 0 waits for every node's report,
decides, and writes one ``contract.StartDecision`` that the other tasks wait for and use as is:
one world per start, never one computed per node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpc_core import doorbell, ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train.contract import NodeReport, StartDecision, StartFiles, node_name
from hpc_train.faults import quarantine
from hpc_train.job.batch import BatchPlan
from hpc_train.job.spec import JobSpec
from hpc_train.launch import geometry, restart_policy
from hpc_train.worker import checkpoints

DECISION_WAIT_S = 300.0


@dataclass(frozen=True)
class Start:
    """One node's view of one start of the job (from submitit's JobEnvironment)."""

    job_id: str
    task: int  # 0 decides for everyone
    num_nodes: int
    first_host: str  # hosts the c10d rendezvous
    restart: int  # SLURM_RESTART_COUNT: 0 on the first start
    hosts: tuple[str, ...] = ()  # every node of this start, in task order
    round: int = 0  # in-job restarts within this Slurm start (0: the allocation's first)
    standby: tuple[str, ...] = ()  # hot spares (``--spares``): allocated, idle, not in ``hosts``

    def next_round(self, members: Sequence[str], me: str, standby: Sequence[str] = ()) -> Start:
        """This node's view of the in-job restart on ``members`` (it must be one of them)."""
        return Start(self.job_id, list(members).index(me), len(members), members[0],
                     self.restart, tuple(members), self.round + 1, tuple(standby))  # fmt: skip

    def others(self) -> tuple[str, ...]:
        """Every node of this start but this one, the hot spares too: who task 0's word is for."""
        me = self.hosts[self.task] if self.task < len(self.hosts) else ""  # hosts may be unsaid
        return tuple(h for h in (*self.hosts, *self.standby) if h != me)

    @property
    def bell_key(self) -> str:
        """The Slurm start whose launchers ring one another (``hpc_core.doorbell``): its
        launchers keep their bells through the in-job rounds."""
        return f"{self.job_id}-{self.restart}"

    def ring_decider(self, run: RunDir) -> None:
        """A word for task 0 was written (this node's report, its exit record): ring its bell."""
        if self.task != 0:
            doorbell.ring(run.bells, [self.first_host], self.bell_key)

    def ring_others(self, run: RunDir) -> None:
        """Task 0's word for the others was written (a decision, a verdict): ring their bells."""
        doorbell.ring(run.bells, self.others(), self.bell_key)

    def ring_round(self, run: RunDir) -> None:
        """A word for every node of this round was written (a hang declared, the last hang
        report: ``watch.hang_monitor``): ring the others' bells (not the spares': they run
        no ranks)."""
        me = self.hosts[self.task]
        doorbell.ring(run.bells, [h for h in self.hosts if h != me], self.bell_key)

    def files(self, run: RunDir) -> StartFiles:
        """This start's files in ``run`` (its round's own: ``41.1`` for an in-job restart), its
        key bound once."""
        return StartFiles(run, self.job_id, self.restart, self.round)


def allocation_start(
    job_id: str, task: int, hosts: Sequence[str], restart: int, spares: int
) -> Start | None:
    """This task's first start in the allocation ``hosts`` (task order): the first
    ``len(hosts) - spares`` nodes train, the last ``spares`` stand by. None: this task is a spare."""
    members, standby = tuple(hosts[: len(hosts) - spares]), tuple(hosts[len(hosts) - spares :])
    if task >= len(members):
        return None
    return Start(job_id, task, len(members), members[0], restart, members, 0, standby)


def previous_stop(files: StartFiles) -> str:
    """Why the job's Slurm start before ``files``' ended (its last round), for the log. Asked
    with the start's files, it reads the job's id (``files.job``), never a round's name."""
    job_id, restart = files.job, files.restart
    if restart == 0:
        return "first start"
    events = ledger.read(files.run.ledger)
    before = files.previous_start(events)
    marker = before.stop() if before is not None else None
    grown = [
        e for e in events if e.kind == Kind.GROWN and (e.job, e.restart) == (job_id, restart - 1)
    ]
    if grown and marker is not None:
        width = f"grown from {grown[-1].get('from')} to {grown[-1].get('to')} node(s)"
        return f"{width}: saved on notice at update {marker.update}"
    if marker is not None:
        return f"saved on notice ({marker.signal or 'peer'}) at update {marker.update}"
    for event in reversed(events):  # task 0 said why it stopped (a hang ...)
        if event.kind == Kind.STOPPED and (event.job, event.restart) == (job_id, restart - 1):
            detail = event.get("error") or event.get("why")
            return f"{event.get('cause')} ({detail}): last periodic checkpoint"
    return "no save on notice (node failure, requeue or crash): last periodic checkpoint"


def node_health(spec: JobSpec, gpus: int, log: Callable[[str], None]) -> str:
    """This node's GPU check before training, where ``--node-check`` asks for it: why it failed,
    one line ('' when it passed, could not run, or was not asked for; a node without GPUs is
    refused for that)."""
    if not spec.checks_nodes or gpus <= 0:
        return ""
    from nccl_checks import preflight  # NVML, only on the nodes that check

    check = preflight.node(spec.sizing.instance_type)
    log(check.said)
    return check.failed


def warm_decider(start: Start, spec: JobSpec) -> None:
    """On task 0, the decider, of a run that restarts in the job: import what verifying a
    checkpoint needs (``checkpoints.warm``) now, where nothing waits on it, so that the next
    decision, an in-job round's, does not (after a requeue a new launcher decides:
    ``decide_start`` imports while the nodes report)."""
    if start.task == 0 and spec.recovery.in_job_restarts:
        checkpoints.warm()


def decide_start(
    run: RunDir, start: Start, spec: JobSpec, gpus: int, log: Callable[[str], None]
) -> StartDecision:
    """Every node reports its GPUs (and its GPU check); task 0 decides for all, once: the geometry
    (``geometry.from_reports``, a quarantined node or one that failed its check refused), the batch plan for that world and what to
    resume from (verifying the checkpoints); the other tasks wait for its decision."""
    files = start.files(run)
    files.write_node_report(NodeReport(start.task, node_name(), gpus, node_health(spec, gpus, log)))
    start.ring_decider(run)
    if start.task != 0:
        try:
            return doorbell.await_word(files.decision, "task 0's decision", DECISION_WAIT_S)
        except TimeoutError:
            raise RuntimeError(f"task 0 wrote no decision in {DECISION_WAIT_S:.0f} s") from None
    if run.checkpoint_last.exists() or run.interval_checkpoints():
        checkpoints.warm()  # while the other nodes' launchers report
    reports = doorbell.await_word(
        lambda: files.node_reports(start.num_nodes), "every node's report", DECISION_WAIT_S
    )
    shape = geometry.from_reports(spec.sizing.gpus_per_node, reports, quarantine.nodes(run))
    if shape.refused:
        decision = StartDecision([], 0, "", shape.ranks_per_node, shape.use_gpu,
                                 refused=shape.refused, bad_nodes=list(shape.bad_nodes))  # fmt: skip
        files.write_decision(decision)
        start.ring_others(run)
        return decision
    plan = spec.batch_plan(shape.nodes * shape.ranks_per_node, shape.use_gpu)
    resume = checkpoints.choose_resume(run.root)
    log(f"resume: {resume.reason}")
    for aside in resume.set_aside:
        log(f"checkpoint {aside.describe()}")
        ledger.record(run.ledger, Kind.SET_ASIDE, start.job_id, start.restart, file=aside.file,
                      moved_to=str(aside.moved_to), why=aside.why)  # fmt: skip
    earlier = [
        int(e.get("resume_at", 0)) for e in ledger.read(run.ledger) if e.kind == Kind.STARTED
    ]
    stop = restart_policy.no_progress(
        [*earlier, resume.at_update], spec.recovery.max_no_progress_restarts
    )
    decision = StartDecision(
        resume.fairseq_args(), resume.at_update, resume.reason, shape.ranks_per_node,
        shape.use_gpu, plan.world_size, plan.batch_per_device, plan.update_freq, stop=stop,
        held=resume.held,
    )  # fmt: skip
    files.write_decision(decision)
    start.ring_others(run)
    return decision


def batch_plan_of(spec: JobSpec, decision: StartDecision) -> BatchPlan:
    """The batch plan task 0 decided, as a value (never recomputed on a node)."""
    return BatchPlan(
        spec.sequences_per_update, decision.batch_per_device, decision.world_size,
        decision.update_freq,
    )  # fmt: skip
