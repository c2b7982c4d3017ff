"""How a cluster made from a ParallelCluster config treats a requeued job (pure).

Two settings decide it, and ParallelCluster writes both into slurm.conf itself (``slurm_conf``):
- the hold: Slurm holds a requeued batch job (``Reason=BeginTime``) for SchedulerParameters'
  ``requeue_delay`` where it honours the option (25.11+), else for AuthInfo's ``cred_expire``
  (ParallelCluster's ``cred_expire=70``; 3.16 runs Slurm 25.11). The shipped configs set
  ``requeue_delay=10`` through ``CustomSlurmSettings`` (pcluster_configs/p3dn.yaml says why);
- the prolog: ParallelCluster's ``SchedulerParameters=nohold_on_prolog_fail`` requeues a job whose
  prolog (the GPU health check) failed without holding it. A custom ``SchedulerParameters`` line
  replaces ParallelCluster's whole (Slurm keeps the last), so it must repeat the option.

What a running controller reports is read by ``hpc_core.slurm.requeue_hold_s``; this says it for
a config, as that controller would show it.

A changed hold takes a new slurmctld process: Slurm 25.11 reads the delay once per process and
keeps it (``job_mgr.c`` ``_requeue_delay()``: a ``static``, set at the first requeue, from
``requeue_delay`` or else the credential lifetime). A restart gives a new process, and so does
``scontrol reconfigure`` since Slurm 23.11 (it execs a new slurmctld: scontrol(1), controller.c);
ParallelCluster's update restarts slurmctld when the cluster's CustomSlurmSettings change
(cookbook ``recipes/update/update_head_node.rb``, ``service 'slurmctld'`` ``:restart`` unless
neither the queues nor those settings changed; read at v3.11.1, 3.16's not readable here). A job
requeued before keeps the begin time it was given then. ``update_notes`` says so for an update.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpc_core import slurm
from hpc_train.cluster import slurm_conf

PCLUSTER_SLURM_VERSION = "25.11"  # ParallelCluster 3.16's Slurm (its release notes)
NOHOLD_ON_PROLOG_FAIL = "nohold_on_prolog_fail"


def shown_config(config: Mapping[str, Any], slurm_version: str = PCLUSTER_SLURM_VERSION) -> str:
    """The lines of ``scontrol show config`` that decide a requeue, for a cluster made from
    ``config`` (a loaded config) whose Slurm is ``slurm_version``."""
    lines = [f"SLURM_VERSION = {slurm_version}.0"]
    for keyword in ("AuthInfo", "SchedulerParameters"):
        value = slurm_conf.effective(keyword, config)
        if value is not None:
            lines.append(f"{keyword} = {value}")
    return "\n".join(lines)


def of_config(config: Mapping[str, Any], slurm_version: str = PCLUSTER_SLURM_VERSION) -> float:
    """The requeue hold, in seconds, of a cluster made from ``config`` whose Slurm is
    ``slurm_version``."""
    return slurm.requeue_hold_of(shown_config(config, slurm_version))


def held_on_prolog_fail(config: Mapping[str, Any]) -> bool:
    """Whether a job whose prolog fails (a node's GPU health check) is requeued and held, on a
    cluster made from ``config``: where its SchedulerParameters lost ``nohold_on_prolog_fail``."""
    shown = shown_config(config)
    return slurm.config_option(shown, "SchedulerParameters", NOHOLD_ON_PROLOG_FAIL) is None


def update_notes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What an update from ``old`` to ``new`` changes in the requeue hold, and what makes it apply
    (``check-update`` prints these); none when the hold stays."""
    before, after = of_config(old), of_config(new)
    if before == after:
        return []
    return [
        f"requeue hold {before:g} s -> {after:g} s (requeue_delay / cred_expire): slurmctld reads "
        "it once per process (Slurm 25.11 job_mgr.c _requeue_delay()), so it applies from the "
        "next slurmctld start; pcluster update-cluster restarts slurmctld when CustomSlurmSettings "
        "change. By hand: sudo systemctl restart slurmctld on the head node. Jobs requeued before "
        "keep their begin time. Then `scontrol show config | grep -i -e requeue_delay -e "
        "cred_expire` shows the hold in force."
    ]
