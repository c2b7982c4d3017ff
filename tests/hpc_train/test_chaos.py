import os
import subprocess
import sys
import time
from pathlib import Path

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


def test_stop_here_stops_one_rank_of_that_job_on_that_node_not_its_dataloader_worker():
    """A fake rank with a child of the same command line (a DataLoader worker): the rank is
    stopped (state T), the child and the other node's rank keep running."""
    env = {**os.environ, "SLURM_JOB_ID": "4244", "SLURMD_NODENAME": "n2"}
    child = "import time; time.sleep(60)"
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}, '-m', 'hpc_train.train'])\n"
        "time.sleep(60)"
    )
    rank = subprocess.Popen([sys.executable, "-c", code, "-m", "hpc_train.train"], env=env)
    other_node = fake_rank("4244", "n1")
    agent_code = "import time; time.sleep(60)"  # torchrun's command line names the module too
    agent = subprocess.Popen(
        [sys.executable, "-c", agent_code, "bin/torchrun", "-m", "hpc_train.train"], env=env
    )
    try:
        deadline = time.monotonic() + 10
        while len(list(chaos._processes("4244", "n2"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert chaos.ranks_here("4244", "n2") == [rank.pid]
        assert chaos.stop_here("4244", "n2") == rank.pid

        def state() -> str:
            return Path(f"/proc/{rank.pid}/stat").read_text().rpartition(")")[2].split()[0]

        deadline = time.monotonic() + 5  # the signal is delivered asynchronously
        while state() != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state() == "T"
        assert chaos.stop_here("4244", "n3") is None
    finally:
        for pid, _ in list(chaos._processes("4244", "n2")):
            os.kill(pid, 9)
        for p in (rank, other_node, agent):
            p.kill()
            p.wait()
