"""Where the Slurm clients' configuration is, and what it says: slurm.conf read as a file.

No Slurm command runs here (``hpc_core.slurm`` runs them), so code that must not talk to Slurm
(a training rank, and what it imports) may still ask where the cluster's configuration lives.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpc_core.slurm_env import SlurmEnv

DEFAULT_CONFS = (
    "/etc/slurm/slurm.conf",
    "/opt/slurm/etc/slurm.conf",
)  # Debian's, ParallelCluster's


def conf_path() -> Path | None:
    """The slurm.conf the clients read: ``SLURM_CONF``, else the first default that exists."""
    conf = SlurmEnv().conf
    if conf:
        return Path(conf)
    return next((Path(p) for p in DEFAULT_CONFS if os.path.isfile(p)), None)


def conf_value(conf: Path, key: str) -> str | None:
    """The value of ``key`` (case-insensitive, as Slurm reads it) in ``conf``, or None."""
    try:
        lines = conf.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.split("#", 1)[0].strip().partition("=")
        if value and name.strip().lower() == key.lower():
            return value.strip()
    return None
