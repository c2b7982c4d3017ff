"""Shared fixtures. The real local Slurm cluster is started once per test session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "slurm" / "local" / "cluster.sh"


@pytest.fixture(scope="session")
def slurm_cluster() -> Path:
    """Bring up the local cluster (idempotent) and export SLURM_CONF; yield the config path.

    The cluster is left running for the next session (`make cluster-down` stops it).
    """
    proc = subprocess.run(
        ["bash", str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=180
    )
    if proc.returncode != 0:
        pytest.fail(f"local Slurm cluster did not come up:\n{proc.stderr}")
    conf = proc.stdout.strip().rpartition("SLURM_CONF=")[2]
    os.environ["SLURM_CONF"] = conf
    return Path(conf)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A real GPT-2-BPE binarized corpus from the offline demo text (~2,500 sentences)."""
    from hpc_train import data

    out = tmp_path_factory.mktemp("corpus") / "bin"
    return data.prepare_demo(out, lines=2500)
