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


def hosts_as_found(before: str, dirs: list[Path]) -> bool:
    """/etc/hosts holds every line it held ``before`` but the lines of clusters that came or went
    meanwhile (the other test workers'), and no line of the clusters in ``dirs``."""
    now = Path("/etc/hosts").read_text().splitlines()
    tag = "# hpc-train local cluster "
    kept = [line for line in before.splitlines() if tag not in line]
    return all(line in now for line in kept) and not any(
        line.endswith(f"{tag}{d}") for line in now for d in dirs
    )


@pytest.fixture
def state_dir():
    """Under the repo's .local: munged (user munge) must traverse every parent directory,
    which pytest's private tmp dirs (mode 0700) do not allow."""
    path = REPO / ".local" / f"test-mini-cluster-{os.getpid()}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def home_0700():
    """A folder of mode 0700, as root's home."""
    path = Path(tempfile.mkdtemp(prefix="h7-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def deep_checkout(home: Path, length: int) -> Path:
    """A checkout placed ``length`` characters deep inside ``home``: the local cluster's scripts at
    their places in it (``cluster.sh`` finds its repository, and so its default cluster dir
    ``<checkout>/.local/cluster``, from where it lies, as ``make cluster-up`` does)."""
    checkout = home / "src"
    while len(str(checkout)) < length - len("/hpc-train"):
        checkout = (
            checkout
            / "github.com-example-lab"[: length - len("/hpc-train") - len(str(checkout)) - 1]
        )
    checkout = checkout / "hpc-train"
    assert len(str(checkout)) == length
    scripts = checkout / "slurm" / "local"
    scripts.mkdir(parents=True)
    for script in ("cluster.sh", "oci-run.sh"):
        shutil.copy2(CLUSTER_SH.parent / script, scripts / script)
    return checkout


def test_a_cluster_from_a_150_character_checkout_in_a_0700_home_runs_a_job_with_steps(
    home_0700, slurm_cluster
):
    """A checkout 150 characters deep in a folder of mode 0700 (root's home). slurmstepd makes a
    Unix socket per job step in slurmd's spool (``<spool>/<node>_<job>.<step>``, at most 107
    bytes): with the spool under the checkout, this job's batch step alone would need 187, and it
    sat held (launch failed). The spool, and munged's files (munge cannot cross a 0700 folder),
    live in a short place of this cluster's own under /run, named from the cluster dir; ``down``
    removes it. A configuration whose sockets cannot fit is refused at ``up``."""
    home = home_0700
    checkout = deep_checkout(home, 150)
    home.chmod(0o700)
    state = checkout / ".local" / "cluster"
    cluster_sh = checkout / "slurm" / "local" / "cluster.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_TRAIN_CLUSTER", "SLURM"))}
    env |= {"HPC_TRAIN_CLUSTER_PORT": "26917", "HPC_TRAIN_CLUSTER_NODES": "2",
            "HPC_TRAIN_CLUSTER_NODE_PREFIX": "u", "HPC_TRAIN_CLUSTER_FIRST_JOB_ID": "7100001"}  # fmt: skip

    def cluster(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(cluster_sh), *args], capture_output=True, text=True,
                              env={**env, **extra}, timeout=180)  # fmt: skip

    too_long = cluster("up", HPC_TRAIN_CLUSTER_NODE_PREFIX="u" * 30)
    assert too_long.returncode == 2 and len(too_long.stderr.strip().splitlines()) == 1
    assert "over the 107 a socket holds" in too_long.stderr and not state.exists()
    digest = hashlib.sha256(f"{state.resolve()}\n".encode()).hexdigest()[:16]
    place = Path("/run/hpc-train") / digest
    try:
        up = cluster("up")
        assert up.returncode == 0, up.stderr
        started = pids(state)
        assert len(started) == 4 and all(
            alive(p) for p in started.values()
        )  # munged, ctld, 2 slurmd
        assert os.readlink(state / "munge") == str(place / "munge")
        assert (place.joinpath("munge").stat().st_uid,
                place.joinpath("munge").stat().st_mode & 0o777) == (
            pwd.getpwnam("munge").pw_uid, 0o711)  # fmt: skip
        conf = (state / "etc" / "slurm.conf").read_text()
        assert f"AuthInfo=socket={place}/munge/munge.socket," in conf
        assert f"SlurmdSpoolDir={place}/spool/%n" in conf
        out = checkout / "job.out"
        job = subprocess.run(
            ["sbatch", "-N2", "--wait", f"--output={out}", "--wrap",
             'srun -N2 -l bash -c \'echo "$(hostname) $SLURM_JOB_ID $SLURM_STEP_ID"\''],
            capture_output=True, text=True, env={**env, "SLURM_CONF": str(state / "etc" / "slurm.conf")},
            timeout=120,
        )  # fmt: skip
        assert job.returncode == 0, (job.stderr, out.read_text() if out.exists() else "")
        assert sorted(out.read_text().split("\n")[:2]) == ["0: u1 7100001 0", "1: u2 7100001 0"]
        assert len(f"{state}/spool/u1/u1_7100001.4294967291") > 107  # the old place would not fit
    finally:
        down = cluster("down")
    assert down.returncode == 0, down.stderr
    assert not place.exists() and not (state / "munge").exists()  # cleaned up
    assert not any(alive(p) for p in started.values())


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports nothing listens on (a check's cluster ports)."""
    for base in range(27000, 60000, 1000):
        listening = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
        taken = {int(w.rsplit(":", 1)[1]) for line in listening.splitlines()
                 for w in line.split()[3:4] if w.rsplit(":", 1)[-1].isdigit()}  # fmt: skip
        if not taken & set(range(base, base + count)):
            return base
    raise AssertionError("no free port range")


def test_check_says_the_longest_socket_path_and_refuses_one_that_cannot_fit(tmp_path):
    """``cluster.sh check`` (``up`` runs it first) starts nothing: the longest Unix socket path of
    the configuration (a step socket of the longest node name, the largest job id, the extern
    step), and exit 2 with one line when it is over the 107 bytes a socket holds."""
    env = {
        **os.environ,
        "HPC_TRAIN_CLUSTER_DIR": str(tmp_path / "c"),
        "HPC_TRAIN_CLUSTER_NODES": "12",
        "HPC_TRAIN_CLUSTER_PORT": str(free_ports(16)),
    }
    fits = subprocess.run(
        ["bash", str(CLUSTER_SH), "check"], capture_output=True, text=True, env=env
    )
    digest = hashlib.sha256(f"{(tmp_path / 'c').resolve()}\n".encode()).hexdigest()[:16]
    sock = f"/run/hpc-train/{digest}/spool/n10/n10_67043328.4294967292"
    assert fits.returncode == 0, fits.stderr
    assert fits.stdout.splitlines()[0] == f"longest socket path: {len(sock)} of 107 bytes: {sock}"
    long = {**env, "HPC_TRAIN_CLUSTER_NODE_PREFIX": "x" * 24}  # x..x10: 59 + 2 x 26 = 111 bytes
    refused = subprocess.run(
        ["bash", str(CLUSTER_SH), "check"], capture_output=True, text=True, env=long
    )
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "would be 111 bytes, over the 107 a socket holds" in refused.stderr
    fits_just = {**env, "HPC_TRAIN_CLUSTER_NODE_PREFIX": "x" * 22}  # 59 + 2 x 24 = 107
    assert (
        subprocess.run(
            ["bash", str(CLUSTER_SH), "check"], capture_output=True, env=fits_just
        ).returncode
        == 0
    )
    bad_id = {**env, "HPC_TRAIN_CLUSTER_FIRST_JOB_ID": "67043328"}  # not below MaxJobId
    refused = subprocess.run(
        ["bash", str(CLUSTER_SH), "check"], capture_output=True, text=True, env=bad_id
    )
    assert refused.returncode == 2 and "not a job id below 67043328" in refused.stderr
    assert not (tmp_path / "c").exists()  # check makes nothing


def test_check_refuses_a_size_the_machine_cannot_hold_in_ports_or_memory(tmp_path):
    """Any size on one machine (issue 46): one port a node after the controller's, each free
    and under 65536, and the nodes' memory (``HPC_TRAIN_CLUSTER_NODE_MB`` each) within what the
    machine has available. Each refusal is one line, exit 2, and starts nothing."""
    import socket

    base = free_ports(70)
    env = {**os.environ, "HPC_TRAIN_CLUSTER_DIR": str(tmp_path / "c"),
           "HPC_TRAIN_CLUSTER_NODES": "64", "HPC_TRAIN_CLUSTER_PORT": str(base),
           "HPC_TRAIN_CLUSTER_NODE_MB": "1"}  # fmt: skip

    def check(**more: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(CLUSTER_SH), "check"], capture_output=True,
                              text=True, env={**env, **more})  # fmt: skip

    fits = check()
    assert fits.returncode == 0, fits.stderr
    assert fits.stdout.splitlines()[1:] == [
        f"ports: {base}-{base + 67}",
        f"memory: 64 nodes x 1 MB = 64 MB of {fits.stdout.split(' MB of ')[1].split()[0]} MB available",
    ]
    # more than the machine's whole memory: over what is available however the other tests'
    # processes come and go between the two checks (CI: a first ask from the available figure
    # fit, memory having been freed meanwhile)
    total = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]) // 1024
    too_big = check(HPC_TRAIN_CLUSTER_NODE_MB=str(total // 64 + 1))
    assert too_big.returncode == 2 and len(too_big.stderr.strip().splitlines()) == 1
    assert f"64 nodes need 64 x {total // 64 + 1} MB" in too_big.stderr
    assert "ask fewer nodes" in too_big.stderr
    past = check(HPC_TRAIN_CLUSTER_PORT="65500")
    assert past.returncode == 2 and "need ports up to 65567, past 65535" in past.stderr
    with socket.socket() as held:  # another daemon (another cluster's node) on one of its ports
        held.bind(("127.0.0.1", base + 40))
        held.listen()
        taken = check()
    assert taken.returncode == 2 and len(taken.stderr.strip().splitlines()) == 1
    assert (
        f"ports {base}-{base + 67} (slurmctld, then one a node) are taken already: {base + 40}"
        in taken.stderr
    )
    assert not (tmp_path / "c").exists()


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
    assert hosts_as_found(hosts_before, [state])
    assert sh("down", env=env).returncode == 0  # twice is fine
    # the session's main cluster was not touched
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    assert "UP" in ping.stdout


def test_two_clusters_with_the_same_node_names_side_by_side_keep_their_names(tmp_path):
    """The test workers' clusters share node names (n1..n4), as a file's mini clusters do: a
    cluster whose names resolve only through another cluster's /etc/hosts line adds its own, so
    the first cluster's ``down`` (which takes its line away, and only its own: the second's
    folder name starts with the first's, as .local/cluster-gw1's does with .local/cluster's)
    leaves the second one's nodes reachable; both lines are edited under one lock, and
    /etc/hosts ends as it was found."""
    hosts_before = Path("/etc/hosts").read_text()
    where = Path(tempfile.mkdtemp(prefix="hs-", dir="/tmp"))  # munged must cross its parents
    env = {**os.environ, "HPC_TRAIN_CLUSTER_NODES": "1", "HPC_TRAIN_CLUSTER_NODE_PREFIX": "v",
           "HPC_TRAIN_CLUSTER_FIRST_JOB_ID": "7300001"}  # fmt: skip
    first, second = (
        {**env, "HPC_TRAIN_CLUSTER_DIR": str(where / name), "HPC_TRAIN_CLUSTER_PORT": port,
         "SLURM_CONF": str(where / name / "etc" / "slurm.conf")}
        for name, port in (("c", "27217"), ("c-gw1", "27227"))
    )  # fmt: skip
    try:
        for cluster in (first, second):
            up = sh("up", env=cluster)
            assert up.returncode == 0, up.stderr
        lines = [line for line in Path("/etc/hosts").read_text().splitlines() if " v1 " in line]
        assert len(lines) == 2, lines  # one line each, tagged with its own cluster dir
        assert sh("down", env=first).returncode == 0
        assert subprocess.run(["getent", "hosts", "v1"], capture_output=True).returncode == 0
        out = subprocess.run(["srun", "-N1", "hostname"], capture_output=True, text=True,
                             env=second, timeout=60)  # fmt: skip
        assert out.stdout.strip() == "v1", out.stderr
    finally:
        downs = [sh("down", env=cluster) for cluster in (first, second)]
        shutil.rmtree(where, ignore_errors=True)
    assert all(d.returncode == 0 for d in downs), [d.stderr for d in downs]
    assert hosts_as_found(hosts_before, [where / "c", where / "c-gw1"])
