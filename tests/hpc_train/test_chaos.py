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
    return subprocess.Popen([sys.executable, "-c", code, "-m", "hpc_train.worker.train"], env=env)


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
        f"subprocess.Popen([sys.executable, '-c', {child!r}, '-m', 'hpc_train.worker.train'])\n"
        "time.sleep(60)"
    )
    rank = subprocess.Popen([sys.executable, "-c", code, "-m", "hpc_train.worker.train"], env=env)
    other_node = fake_rank("4244", "n1")
    agent_code = "import time; time.sleep(60)"  # torchrun's command line names the module too
    agent = subprocess.Popen(
        [sys.executable, "-c", agent_code, "bin/torchrun", "-m", "hpc_train.worker.train"], env=env
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


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


@pytest.mark.slow  # real rank processes stopped and continued: ~2 s
def test_slow_here_stops_and_continues_that_nodes_ranks_and_leaves_them_running():
    """`chaos slow`'s step on the node (the real command): the rank on n2 is stopped (T) part
    of the time and running at the end; the job's rank on n1 is never stopped."""
    rank, other_node = fake_rank("4245", "n2"), fake_rank("4245", "n1")
    try:
        deadline = time.monotonic() + 10
        while len(chaos.ranks_here("4245", "n2")) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        throttle = subprocess.Popen(
            [sys.executable, "-m", "hpc_train.chaos", "4245", chaos.SLOW_HERE, "--node", "n2",
             "--factor", "0.5", "--seconds", "2"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        seen, seen_other = set(), set()
        while throttle.poll() is None:
            seen.add(_state(rank.pid))
            seen_other.add(_state(other_node.pid))
            time.sleep(0.005)
        out = throttle.stdout.read() if throttle.stdout else ""
        assert throttle.returncode == 0, out
        cycles = int(out.split()[2])
        # 2 s of 0.02 s cycles at most; a loaded machine stretches each one (its sleeps and
        # signals wait for a core), so the floor only says it kept cycling the whole time
        assert 10 <= cycles <= 100, out
        assert "T" in seen and seen - {"T"}, seen  # stopped, and not all the time
        assert "T" not in seen_other
        time.sleep(0.05)
        assert _state(rank.pid) != "T"  # left running
        assert chaos.main(["4245", chaos.SLOW_HERE, "--node", "n3", "--seconds", "1"]) == 1
    finally:
        for p in (rank, other_node):
            p.kill()
            p.wait()


def test_slow_here_resumes_the_ranks_when_its_step_is_cancelled():
    rank = fake_rank("4246", "n2")
    try:
        deadline = time.monotonic() + 10
        while not chaos.ranks_here("4246", "n2") and time.monotonic() < deadline:
            time.sleep(0.05)
        throttle = subprocess.Popen(
            [sys.executable, "-m", "hpc_train.chaos", "4246", chaos.SLOW_HERE, "--node", "n2",
             "--factor", "0.1"],
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while _state(rank.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.005)
        throttle.terminate()  # what Slurm does to the step when the job ends or is requeued
        assert throttle.wait(10) == 0
        time.sleep(0.05)
        assert _state(rank.pid) != "T"
    finally:
        rank.kill()
        rank.wait()


def test_slow_takes_a_fraction():
    with pytest.raises(SystemExit):
        chaos.build_parser().parse_args(["1", "slow", "--factor", "1.5"])
    args = chaos.build_parser().parse_args(["1", "slow", "--node", "n2"])
    assert (args.factor, args.seconds) == (0.5, None)
