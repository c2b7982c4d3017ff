"""Task 0 requeues the job: without the nodes it blamed, and only if the job could start again.

``requeue`` asks Slurm once (``partition_check``: one sinfo, one scontrol) which blamed nodes the requeued
job excludes by name and whether enough usable nodes are left for ``--nodes`` MIN
(``restart_policy.requeue_blocked``). If so, it writes the round's verdict (``REQUEUE``: the
other launchers wait for Slurm to end them), records ``requeued``, calls ``scontrol requeue``
and excludes the nodes once the job is pending; if not, the verdict is ``FAIL`` and the run
stops, saying which nodes. After a requeue Slurm ends the task: ``await_end`` never lets it
report success meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NoReturn

from hpc_core import slurm
from hpc_core.ledger import Kind
from hpc_train.contract import RoundAction, RoundVerdict
from hpc_train.faults import node_blame, quarantine
from hpc_train.job.spec import JobSpec
from hpc_train.launch import restart_policy
from hpc_train.launch.context import Here, log

REQUEUE_GRACE_S = 60.0  # after `scontrol requeue` Slurm ends this task; never succeed meanwhile


def await_end() -> None:
    """The job was requeued (by this task or another): Slurm ends this task; wait for it."""
    time.sleep(REQUEUE_GRACE_S)


def requeue(
    here: Here, leave_out: Sequence[str], ended: str = "requeue did not take effect"
) -> NoReturn:
    """Task 0 requeues the job without ``leave_out`` (the nodes it blamed), unless the job
    could not start again: then the run stops, saying which nodes."""
    blocked = send(here, leave_out, ended)
    if blocked is not None:
        raise RuntimeError(blocked.why)
    await_end()
    raise RuntimeError(ended)


def send(
    here: Here, leave_out: Sequence[str], ended: str, deputy: bool = False
) -> restart_policy.Decision | None:
    """Requeue the job without ``leave_out`` and tell the other launchers; or, when the
    requeued job could not start, tell them to stop and return why (nothing requeued)."""
    note = here.deputy_note if deputy else here.note
    by_name, blocked, said = partition_check(here.spec, here.job_id, leave_out)
    if said:
        log(said)
        note(Kind.REQUEUE_BLOCKED, why=said, waiting=blocked is None)
    if blocked is not None:
        here.files.write_verdict(RoundVerdict(RoundAction.FAIL, blocked.why))
        return blocked
    here.files.write_verdict(RoundVerdict(RoundAction.REQUEUE, ended))
    note(Kind.REQUEUED, by=f"task {here.start.task}")
    slurm.requeue(here.job_id)
    if by_name:
        node_blame.exclude(here.job_id, by_name, log)
    return None


def partition_check(
    spec: JobSpec, job_id: str, leave_out: Sequence[str]
) -> tuple[list[str], restart_policy.Decision | None, str]:
    """Which of ``leave_out`` the requeue excludes by name, and could the requeued job
    start? (One sinfo, one scontrol; a Slurm error is said and the requeue goes ahead,
    every blamed node excluded: it is Slurm's to refuse then.)"""
    try:
        states = slurm.partition_nodes(spec.slurm.partition)
        replaced = restart_policy.nodes_replaced(spec.recovery.nodes_replaced, states)
        blamed = restart_policy.excluded_by_name(leave_out, replaced, not spec.recovery.no_drain)
        held = restart_policy.quarantined_by_name(
            quarantine.nodes(spec.run_dir), states, replaced
        )  # fmt: skip
        by_name = sorted(set(blamed) | set(held))
        out = excluded(spec, job_id) | set(by_name)
    except slurm.SlurmError as err:
        log(f"cannot tell whether the requeued job can start ({err}): requeueing")
        return list(leave_out), None, ""
    blocked, said = restart_policy.requeue_blocked(states, out, spec.sizing.nodes_min, replaced)
    return by_name, blocked, said


def excluded(spec: JobSpec, job_id: str) -> set[str]:
    """The nodes this run keeps out of its job: the job's ExcNodeList (the nodes it blamed)
    and the quarantine list."""
    info = slurm.job_info(job_id)
    listed = (info or {}).get("ExcNodeList", "(null)")
    out = set(slurm.hostnames(listed)) if listed not in ("", "(null)") else set()
    return out | set(quarantine.nodes(spec.run_dir))
