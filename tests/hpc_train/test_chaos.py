import os
import subprocess
import sys

import pytest

from hpc_core import slurm
from hpc_train import chaos


def fake_rank(job: str, node: str) -> subprocess.Popen:
    """A process that looks like a training rank of `job` on emulated `node` (sleeps)."""
    env = {**os.environ, "SLURM_JOB_ID": job, "SLURMD_NODENAME": node}
    code = "import time; time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code, "-m", "hpc_train.train"], env=env)


def test_kill_here_kills_only_that_jobs_ranks_on_that_node():
    victim, other_node, other_job = (
        fake_rank("4242", "n2"),
        fake_rank("4242", "n1"),
        fake_rank("4243", "n2"),
    )
    try:
        assert chaos.kill_here("4242", "n2") == 1
        assert victim.wait(10) == -9
        assert other_node.poll() is None and other_job.poll() is None
    finally:
        for p in (victim, other_node, other_job):
            p.kill()
            p.wait()


@pytest.mark.slurm
def test_chaos_refuses_a_job_that_is_not_running(slurm_cluster, capsys):
    assert chaos.main(["999999999", "preempt"]) == 2
    assert "not RUNNING" in capsys.readouterr().err
    with pytest.raises(slurm.SlurmError):
        chaos.running_nodes("999999999")
