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


@pytest.fixture(scope="session")
def trained_save_dir(corpus, tmp_path_factory) -> Path:
    """A real fairseq run (one CPU process, no Slurm): 12 updates, interval checkpoints at 5
    and 10, checkpoint_last.pt at 12. Tests copy it before changing anything."""
    import sys

    from hpc_train.commands import fairseq_args
    from hpc_train.spec import JobSpec

    save = tmp_path_factory.mktemp("trained") / "run"
    save.mkdir()
    spec = JobSpec("tiny", corpus, save, gpus_per_node=0, max_update=12, keep_checkpoints=5)
    args, _ = fairseq_args(spec, world_size=1, gpu=False)
    args += ["--save-interval-updates", "5"]
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.train", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return save
