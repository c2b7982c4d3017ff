"""One start of a job: which node this is, why the start before ended, and the decision task 0
makes for every node (geometry and what to resume from).

Each node's launcher writes what it found (``NodeReport``: its GPUs) to the run directory; task 0
waits for every node's report, decides, and writes one ``ResumeDecision`` that the other tasks
wait for and use as is: one world per start, never one computed per node.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

from hpc_core import ledger
from hpc_core.rundir import ResumeDecision, RunDir, atomic_write
from hpc_core.wait import FAST, wait_until
from hpc_train.faults import quarantine
from hpc_train.launch import geometry
from hpc_train.launch.geometry import NodeReport
from hpc_train.worker import checkpoints
from hpc_train.worker.heartbeat import node_name

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


def previous_stop(run: RunDir, job_id: str, restart: int) -> str:
    """Why the previous run of this job ended, for the log."""
    if restart == 0:
        return "first start"
    marker = run.read_stop(job_id, restart - 1)
    if marker is not None:
        return f"saved on notice ({marker.signal or 'peer'}) at update {marker.update}"
    for event in reversed(ledger.read(run.ledger)):  # task 0 said why it stopped (a hang ...)
        if event.kind == "stopped" and (event.job, event.restart) == (job_id, restart - 1):
            detail = event.get("error") or event.get("why")
            return f"{event.get('cause')} ({detail}): last periodic checkpoint"
    return "no save on notice (node failure, requeue or crash): last periodic checkpoint"


def node_reports(run: RunDir, job_id: str, restart: int, nodes: int) -> list[NodeReport] | None:
    """Every node's report for this start, or None while one is missing."""
    reports = []
    for task in range(nodes):
        path = run.node_report(job_id, restart, task)
        if not path.exists():
            return None
        reports.append(NodeReport(**json.loads(path.read_text())))
    return reports


def decide_start(
    run: RunDir, start: Start, gpus_per_node: int, gpus: int, log: Callable[[str], None]
) -> ResumeDecision:
    """Every node reports its GPUs; task 0 decides the geometry (``hpc_train.launch.geometry``, a
    quarantined node refused) and what to resume from (verifying the checkpoints), the other
    tasks wait for its decision."""
    job_id, restart = start_key(start)
    report = NodeReport(start.task, node_name(), gpus)
    atomic_write(run.node_report(job_id, restart, start.task), json.dumps(asdict(report)))
    if start.task == 0:
        reports = wait_until(
            lambda: node_reports(run, job_id, restart, start.num_nodes),
            "every node's report", timeout=DECISION_WAIT_S, backoff=FAST,
        )  # fmt: skip
        shape = geometry.decide(gpus_per_node, reports, quarantine.nodes(run))
        if shape.refused:
            decision = ResumeDecision([], 0, "", shape.ranks_per_node, shape.use_gpu,
                                      shape.refused, list(shape.bad_nodes))  # fmt: skip
            run.write_decision(job_id, restart, decision)
            return decision
        resume = checkpoints.choose_resume(run.root)
        log(f"resume: {resume.reason}")
        if resume.moved_aside:
            log(f"kept the bad checkpoint as {resume.moved_aside}")
        decision = ResumeDecision(
            resume.fairseq_args(), resume.at_update, resume.reason,
            shape.ranks_per_node, shape.use_gpu,
        )  # fmt: skip
        run.write_decision(job_id, restart, decision)
        return decision
    try:
        return wait_until(
            lambda: run.read_decision(job_id, restart),
            "task 0's decision",
            timeout=DECISION_WAIT_S,
            backoff=FAST,
        )
    except TimeoutError:
        raise RuntimeError(f"task 0 wrote no decision in {DECISION_WAIT_S:.0f} s") from None


def start_key(start: Start) -> tuple[str, int]:
    """(job id, restart): what names this start's files in the run directory."""
    return start.job_id, start.restart
