"""slurm/local/cluster.sh: a second, private mini cluster (2 nodes t1, t2, other ports) so the
session's main cluster is left alone while `up` and `down` are exercised for real."""

import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "slurm" / "local" / "cluster.sh"

pytestmark = pytest.mark.slurm


def sh(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args], capture_output=True, text=True, env=env, timeout=180
    )


def pids(state: Path) -> dict[str, int]:
    files = [*state.glob("run/*.pid"), state / "munge" / "munged.pid"]
    return {p.name: int(p.read_text()) for p in files if p.exists()}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.fixture
def state_dir():
    """Under the repo's .local: munged (user munge) must traverse every parent directory,
    which pytest's private tmp dirs (mode 0700) do not allow."""
    path = REPO / ".local" / f"test-mini-cluster-{os.getpid()}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def home_0700():
    """A folder of mode 0700, as root's home. Short and under /tmp: slurmd's step sockets live in
    the cluster dir, and a Unix socket path longer than 108 bytes fails the launch (pytest's own
    tmp_path is too deep for that)."""
    path = Path(tempfile.mkdtemp(prefix="h7-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_cluster_in_a_0700_folder_comes_up_runs_a_job_and_cleans_up(home_0700, slurm_cluster):
    """A checkout in a folder of mode 0700 (root's home, where a root user clones by default):
    munged (user munge) cannot traverse it, so its files live in a /run place of this cluster's
    own, named from the cluster dir, linked from it, and removed at `down`."""
    home = home_0700
    state = home / "hpc-train" / ".local" / "cluster"
    state.mkdir(parents=True)
    home.chmod(0o700)
    env = {**os.environ, "HPC_TRAIN_CLUSTER_DIR": str(state), "HPC_TRAIN_CLUSTER_PORT": "26917",
           "HPC_TRAIN_CLUSTER_NODES": "1", "HPC_TRAIN_CLUSTER_NODE_PREFIX": "u",
           "HPC_TRAIN_CLUSTER_FIRST_JOB_ID": "7100001"}  # fmt: skip
    digest = hashlib.sha256(f"{state.resolve()}\n".encode()).hexdigest()[:16]
    place = Path("/run/hpc-train-munge") / digest
    try:
        up = sh("up", env=env)
        assert up.returncode == 0, up.stderr
        started = pids(state)
        assert len(started) == 3 and all(alive(p) for p in started.values())  # munged, ctld, slurmd
        assert os.readlink(state / "munge") == str(place)
        assert (place.stat().st_uid, place.stat().st_mode & 0o777) == (
            pwd.getpwnam("munge").pw_uid,
            0o711,
        )
        assert (
            f"AuthInfo=socket={place}/munge.socket," in (state / "etc" / "slurm.conf").read_text()
        )
        job = subprocess.run(
            ["srun", "-N1", "bash", "-c", 'echo "$(hostname) $SLURM_JOB_ID"'], capture_output=True,
            text=True, env={**env, "SLURM_CONF": str(state / "etc" / "slurm.conf")}, timeout=60,
        )  # fmt: skip
        assert job.stdout.split() == ["u1", "7100001"], job.stderr
    finally:
        down = sh("down", env=env)
    assert down.returncode == 0, down.stderr
    assert not place.exists() and not (state / "munge").exists()  # cleaned up
    assert not any(alive(p) for p in started.values())


def test_up_and_down_are_idempotent_and_leave_etc_hosts_as_found(state_dir, slurm_cluster):
    state = state_dir
    env = {
        **os.environ,
        "HPC_TRAIN_CLUSTER_DIR": str(state),
        "HPC_TRAIN_CLUSTER_NODES": "2",
        "HPC_TRAIN_CLUSTER_NODE_PREFIX": "t",
        "HPC_TRAIN_CLUSTER_PORT": "26817",
        "HPC_TRAIN_CLUSTER_FIRST_JOB_ID": "7000001",  # as a second test worker's cluster has
    }
    hosts_before = Path("/etc/hosts").read_text()
    try:
        first = sh("up", env=env)
        assert first.returncode == 0, first.stderr
        conf = state / "etc" / "slurm.conf"
        assert first.stdout.strip() == f"export SLURM_CONF={conf}"
        started = pids(state)
        assert len(started) == 4 and all(
            alive(p) for p in started.values()
        )  # munged, ctld, 2x slurmd

        again = sh("up", env=env)
        assert again.returncode == 0 and pids(state) == started  # nothing started twice
        # another requeue hold asked of a running cluster: said, nothing restarted
        other = sh("up", env={**env, "HPC_TRAIN_CLUSTER_CRED_EXPIRE": "70"})
        assert other.returncode == 1 and pids(state) == started
        assert "cred_expire=70 (cred_expire=10): run" in other.stderr
        # Slurm's scheduling defaults (ParallelCluster's) asked of it: the same
        slow = sh("up", env={**env, "HPC_TRAIN_CLUSTER_SCHEDULER_PARAMETERS": ""})
        assert slow.returncode == 1 and pids(state) == started
        assert "SchedulerParameters 'bf_interval=2,sched_interval=2', not ''" in slow.stderr
        # node-up: one killed slurmd started again, the rest untouched (bench-soak's clustermgtd
        # stand-in; `up` would also resume every drained node)
        killed = state / "run" / "slurmd-t2.pid"
        os.kill(started[killed.name], 9)
        back = sh("node-up", "t2", env=env)
        assert back.returncode == 0, back.stderr
        now = pids(state)
        assert alive(now[killed.name]) and now[killed.name] != started[killed.name]
        assert {k: v for k, v in now.items() if k != killed.name} == {
            k: v for k, v in started.items() if k != killed.name
        }
        started = now
        bogus = sh("node-up", "t9", env=env)
        assert bogus.returncode == 1 and "no node 't9' here (t1 t2)" in bogus.stderr

        job_env = {**env, "SLURM_CONF": str(conf)}
        out = subprocess.run(
            ["srun", "-N2", "-n2", "-l", "bash", "-c", 'echo "$(hostname) $SLURM_JOB_ID"'],
            capture_output=True, text=True, env=job_env, timeout=60,
        )  # fmt: skip
        seen = sorted(line.split(": ")[1] for line in out.stdout.splitlines())
        assert seen == ["t1 7000001", "t2 7000001"]  # its own job ids, from FirstJobId
        parts = subprocess.run(
            ["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, env=job_env
        )
        assert parts.stdout.split() == ["low*", "high"]
        assert "t1 t2" in Path("/etc/hosts").read_text()
    finally:
        down = sh("down", env=env)
    assert down.returncode == 0, down.stderr
    assert not any(alive(p) for p in started.values())
    assert Path("/etc/hosts").read_text() == hosts_before
    assert sh("down", env=env).returncode == 0  # twice is fine
    # the session's main cluster was not touched
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    assert "UP" in ping.stdout
