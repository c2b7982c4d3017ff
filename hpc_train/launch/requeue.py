"""After a requeue: Slurm ends this task (``await_end``); and the nodes a run keeps out of its
job (``excluded``: its ExcNodeList and the quarantine list, for the grow watch).

Whether and how to requeue is the policy's (``restart_policy.after_end``: the requeued job must
be able to start, ``requeue_blocked``, on Slurm's word asked once: one sinfo, the job's
ExcNodeList); the requeue itself is the executor's (``recovery.carry_out``: the round's verdict,
``requeued``, ``scontrol requeue``, the nodes excluded once the job is pending).
"""

from __future__ import annotations

import time

from hpc_core import slurm
from hpc_train.faults import quarantine
from hpc_train.job.spec import JobSpec

REQUEUE_GRACE_S = 60.0  # after `scontrol requeue` Slurm ends this task; never succeed meanwhile


def await_end() -> None:
    """The job was requeued (by this task or another): Slurm ends this task; wait for it."""
    time.sleep(REQUEUE_GRACE_S)


def excluded(spec: JobSpec, job_id: str) -> set[str]:
    """The nodes this run keeps out of its job: the job's ExcNodeList (the nodes it blamed)
    and the quarantine list."""
    info = slurm.job_info(job_id)
    listed = (info or {}).get("ExcNodeList", "(null)")
    out = set(slurm.hostnames(listed)) if listed not in ("", "(null)") else set()
    return out | set(quarantine.nodes(spec.run_dir))
