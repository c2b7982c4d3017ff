"""What Slurm tells a process through its environment: one property per variable, like
Lightning's ``SLURMEnvironment``. No other module reads a ``SLURM_*`` variable, or names one
(tests/hpc_core/test_slurm_env.py reads the code for it).

``SlurmEnv()`` reads this process's environment as it is at each read (``os.environ``);
``SlurmEnv(env)`` another one (a test's, a child's). A variable unset or empty reads as None,
and so does a count that is not a number (Slurm writes digits).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

JOB_ID = "SLURM_JOB_ID"  # in every process of an allocation (sbatch, salloc, srun)
JOB_NODELIST = "SLURM_JOB_NODELIST"  # the allocation's nodes, as a Slurm node list (n[1-3])
JOB_NUM_NODES = "SLURM_JOB_NUM_NODES"
JOB_PREFIX = "SLURM_JOB"  # every variable of the job's own (scontrol acts on the job inside one)
RESTART_COUNT = "SLURM_RESTART_COUNT"  # the job's requeues so far; unset before the first
PROCID = "SLURM_PROCID"  # this task's rank in its step
NTASKS = "SLURM_NTASKS"  # the step's tasks
LOCALID = "SLURM_LOCALID"  # this task's rank on its node
CPUS_PER_TASK = "SLURM_CPUS_PER_TASK"  # set only when the job asked for --cpus-per-task
CPUS_ON_NODE = "SLURM_CPUS_ON_NODE"  # the allocation's CPUs on this node
NODENAME = "SLURMD_NODENAME"  # this node as Slurm names it (emulated nodes share one host name)
CONF = "SLURM_CONF"  # the slurm.conf Slurm's clients read; unset: their default
PREFIX = "SLURM_"  # what every variable of Slurm's starts with (SLURMD_NODENAME aside)


class _Text:
    """A variable's value; unset or empty: None."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, slurm: SlurmEnv | None, owner: object = None) -> str | None:
        if slurm is None:  # the class's own attribute (help(), introspection)
            return None
        return slurm.env.get(self.name) or None


class _Count:
    """A variable's count; unset, empty or not a number: None."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, slurm: SlurmEnv | None, owner: object = None) -> int | None:
        value = "" if slurm is None else slurm.env.get(self.name, "")
        return int(value) if value.isdigit() else None


@dataclass(frozen=True)
class SlurmEnv:
    """Slurm's variables in ``env`` (this process's environment by default), one property each."""

    env: Mapping[str, str] = field(default_factory=lambda: os.environ)

    job_id = _Text(JOB_ID)  # None: outside any allocation
    job_nodelist = _Text(JOB_NODELIST)
    job_num_nodes = _Count(JOB_NUM_NODES)
    procid = _Count(PROCID)
    ntasks = _Count(NTASKS)
    localid = _Count(LOCALID)
    cpus_per_task = _Count(CPUS_PER_TASK)
    cpus_on_node = _Count(CPUS_ON_NODE)
    nodename = _Text(NODENAME)  # set by slurmd in every process of a step
    conf = _Text(CONF)
    _restarts = _Count(RESTART_COUNT)

    @property
    def restart_count(self) -> int:
        """How many times Slurm requeued the job (0 on its first start: the variable is unset)."""
        return self._restarts or 0

    def outside_job(self) -> dict[str, str]:
        """The environment without the job's variables (``SLURM_JOB*``): a Slurm client run
        with it acts as from outside the job."""
        return {k: v for k, v in self.env.items() if not k.startswith(JOB_PREFIX)}

    def clients_only(self) -> dict[str, str]:
        """The environment without Slurm's variables but ``SLURM_CONF``: an ``srun`` run with
        it starts a step of the job it names, not of the caller's own step."""
        return {k: v for k, v in self.env.items() if not k.startswith(PREFIX) or k == CONF}
