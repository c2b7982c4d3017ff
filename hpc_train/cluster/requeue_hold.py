"""How long a cluster made from a ParallelCluster config holds a requeued job.

Slurm holds a requeued batch job (``Reason=BeginTime``) for SchedulerParameters' ``requeue_delay``
where it honours the option (25.11+), else for AuthInfo's ``cred_expire``; ParallelCluster's
slurm.conf sets ``cred_expire=70`` and 3.16 runs Slurm 25.11. The shipped configs set
``requeue_delay`` through ``CustomSlurmSettings`` (pcluster_configs/p3dn.yaml says why). What the
controller reports is read by ``hpc_core.slurm.requeue_hold_s``; this says it for a config, as
that controller would show it (pure).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpc_core import slurm

PCLUSTER_SLURM_VERSION = "25.11"  # ParallelCluster 3.16's Slurm (its release notes)


def of_config(config: Mapping[str, Any], slurm_version: str = PCLUSTER_SLURM_VERSION) -> float:
    """The requeue hold, in seconds, of a cluster made from ``config`` (a loaded config) whose
    Slurm is ``slurm_version``."""
    settings = config.get("Scheduling", {}).get("SlurmSettings", {}).get("CustomSlurmSettings", [])
    params = [str(s["SchedulerParameters"]) for s in settings if "SchedulerParameters" in s]
    shown = [
        f"SLURM_VERSION = {slurm_version}.0",
        f"AuthInfo = cred_expire={slurm.PCLUSTER_CRED_EXPIRE_S:g}",
        *(f"SchedulerParameters = {p}" for p in params[-1:]),  # the last one wins in slurm.conf
    ]
    return slurm.requeue_hold_of("\n".join(shown))
