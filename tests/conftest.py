"""Shared fixtures. The real local Slurm cluster is started once per test session."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "slurm" / "local" / "cluster.sh"
# Fixtures that make a test slow: the tier markers follow from them (`make test-fast` skips them).
TIER_FIXTURES = {
    "slurm_cluster": "slurm",
    "corpus": "fairseq",
    "trained_save_dir": "fairseq",
    "fake_account": "aws",  # ParallelCluster's validators against moto's fake AWS
}


def worker_cluster_env(worker: str | None, default_dir: str, base_port: int) -> dict[str, str]:
    """The local cluster of a pytest-xdist worker (``make test`` runs ``pytest -n 2``).

    Worker gw0, or a run without workers, keeps the default cluster (``make cluster-up``'s). Worker
    gwN (N >= 1) gets a cluster of its own beside it: its own directory (pid files, logs; its
    spools and munge in a short place of its own under /run: slurm/local/cluster.sh), ports 1000 N
    above the default cluster's (``base_port``), and job ids from 1,001,000 N + 1, so
    that two clusters on one machine never share a job id (chaos finds a job's processes by
    SLURM_JOB_ID) nor, as long as each hands out fewer than 500 ids, a torchrun rendezvous port
    (``hpc_core.slurm.rendezvous_port``: 8 ports a job, one for each in-job restart round, from
    20000 + 8 x the id mod 12,000: gwN's are 4,000 N ports further on; every node is 127.0.0.1;
    tests/hpc_core/test_wait.py proves it). Every node name a test knows (n1..n4) stays the same.
    """
    n = int(worker[2:]) if worker and worker.startswith("gw") else 0
    if n == 0:
        return {}
    cluster = f"{default_dir}-gw{n}"
    return {
        "HPC_TRAIN_CLUSTER_DIR": cluster,
        "HPC_TRAIN_CLUSTER_PORT": str(base_port + 1000 * n),
        "HPC_TRAIN_CLUSTER_FIRST_JOB_ID": str(1_001_000 * n + 1),
        "SLURM_CONF": f"{cluster}/etc/slurm.conf",
    }


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, point this worker at its own local cluster before any test runs."""
    default_dir = os.environ.get("HPC_TRAIN_CLUSTER_DIR") or str(REPO / ".local" / "cluster")
    base_port = int(os.environ.get("HPC_TRAIN_CLUSTER_PORT") or 16817)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    os.environ.update(worker_cluster_env(worker, default_dir, base_port))


def nvidia_driver_present() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


@pytest.hookimpl(tryfirst=True)  # before xdist's own: it reads the xdist_group marks set here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by the fixtures they use (slurm, fairseq, aws) and skip `nogpu` tests on a machine
    with an NVIDIA driver (they check what this toolkit says where there is none)."""
    gpu = nvidia_driver_present()
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if fixture in TIER_FIXTURES:
                item.add_marker(TIER_FIXTURES[fixture])
        if gpu and item.get_closest_marker("nogpu"):
            item.add_marker(pytest.mark.skip(reason="asserts the no-GPU path; a driver is here"))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        spread_over_workers(items)


SHARED_SCOPES = ("package", "module", "class")


def spread_over_workers(items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (make test) each test goes to the next free worker, in
    collection order, unless it shares a fixture with its neighbours: a test that uses a module-
    or class-scoped fixture stays with the rest of its file (``xdist_group``: the fixture runs
    once). The real-Slurm tests come first, then the other slow tiers, so that no long test
    starts last and leaves the other workers idle (a stable sort: each file keeps its order)."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d[-1].scope in SHARED_SCOPES for d in defs if d):
            item.add_marker(pytest.mark.xdist_group(str(item.path)))

    def tier(item: pytest.Item) -> int:
        if item.get_closest_marker("slurm"):
            return 0
        slow = ("fairseq", "slow", "aws")
        return 1 if any(item.get_closest_marker(m) for m in slow) else 2

    items.sort(key=tier)


@pytest.fixture(autouse=True, scope="session")
def private_run_index(tmp_path_factory) -> Path:
    """Every test, and every command a test runs, records runs in a throwaway index, never in
    the user's ~/.local/state/hpc-train (``submit`` appends to it)."""
    from hpc_core import ledger

    home = tmp_path_factory.mktemp("state-home")
    os.environ[ledger.INDEX_ENV] = str(home)
    return home


def cluster_up() -> str:
    proc = subprocess.run(
        ["bash", str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=180
    )
    if proc.returncode != 0:
        pytest.fail(f"local Slurm cluster did not come up:\n{proc.stderr}")
    return proc.stdout.strip().rpartition("SLURM_CONF=")[2]


@pytest.fixture
def restart_local_cluster(slurm_cluster):
    """Call to bring back daemons a test stopped (idempotent `up`); also runs at teardown."""
    yield cluster_up
    cluster_up()


@pytest.fixture(scope="session")
def slurm_cluster() -> Path:
    """Bring up the local cluster (idempotent) and export SLURM_CONF; yield the config path.

    The cluster is left running for the next session (`make cluster-down` stops it).
    """
    conf = cluster_up()
    os.environ["SLURM_CONF"] = conf
    return Path(conf)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A real GPT-2-BPE binarized corpus from the offline demo text (~2,500 sentences)."""
    from hpc_train import data

    out = tmp_path_factory.mktemp("corpus") / "bin"
    return data.prepare_demo(out, lines=2500)


def run_tiny(
    corpus: Path, save: Path, max_update: int, *extra: str, prelude: str = "", ok: bool = True
) -> subprocess.CompletedProcess[str]:
    """Real fairseq, one CPU process (no Slurm, no torchrun): the tiny preset to ``max_update``
    through the worker, with ``extra`` fairseq flags after the toolkit's. ``prelude``: Python
    the worker's process runs first (a test injects what the worker would measure). ``ok``:
    the worker must succeed (False: the test looks at how it failed)."""
    import sys

    from hpc_train.job.command_lines import TRAIN_MODULE, fairseq_args
    from hpc_train.job.sizing import Sizing
    from hpc_train.job.spec import JobSpec, Saves, Training

    spec = JobSpec(
        Training("tiny", corpus, save, max_update=max_update),
        sizing=Sizing(gpus_per_node=0),
        saves=Saves(keep_checkpoints=5),
    )
    args, _ = fairseq_args(spec, world_size=1, gpu=False)
    worker = ["-m", TRAIN_MODULE]
    if prelude:
        main = f"import runpy; runpy.run_module({TRAIN_MODULE!r}, run_name='__main__')"
        worker = ["-c", f"{prelude}\n{main}"]
    proc = subprocess.run(
        [sys.executable, *worker, *args, *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0 or not ok, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="session")
def tiny_run():
    """``run_tiny`` for test modules (they cannot import conftest)."""
    return run_tiny


@pytest.fixture(scope="session")
def trained_save_dir(corpus, tmp_path_factory) -> Path:
    """A real fairseq run (one CPU process, no Slurm): 12 updates, interval checkpoints at 5
    and 10, checkpoint_last.pt at 12. Tests copy it before changing anything."""
    save = tmp_path_factory.mktemp("trained") / "run"
    save.mkdir()
    run_tiny(corpus, save, 12, "--save-interval-updates", "5")
    return save


class FakeImds:
    """A tiny EC2 instance-metadata server (IMDSv2) on 127.0.0.1 — a fake: no EC2 here.

    ``post(action)`` makes the next instance-action request answer 200 once, then 404 again.
    """

    TOKEN = "test-token"

    def __init__(self) -> None:
        self.action: dict | None = None
        self.served = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self):
                ok = self.path == "/latest/api/token" and self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                )
                self._reply(200 if ok else 400, fake.TOKEN if ok else "")

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") != fake.TOKEN:
                    return self._reply(401, "")
                if self.path != "/latest/meta-data/spot/instance-action" or fake.action is None:
                    return self._reply(404, "")
                body, fake.action = json.dumps(fake.action), None
                fake.served.set()
                self._reply(200, body)

            def _reply(self, code: int, body: str) -> None:
                self.send_response(code)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"

    def post(self, action: dict) -> None:
        self.served.clear()
        self.action = action


@pytest.fixture
def fake_imds() -> Iterator[FakeImds]:
    fake = FakeImds()
    # shutdown() waits for serve_forever's next poll: 0.5 s by default, at every teardown
    threading.Thread(target=fake.server.serve_forever, args=(0.02,), daemon=True).start()
    yield fake
    fake.server.shutdown()


class SmallFs:
    """A file system of its own for a storage fault: a tmpfs (mounted as root) seen at ``root``
    through a bind mount; it stands for the save dir's FSx for Lustre, which fills (ENOSPC),
    goes read-only (EROFS) or runs out of inodes the same way to a writer. ``read_only``
    remounts the bind read-only: a plain ``remount,ro`` of the tmpfs fails (EBUSY) while a file
    is open for writing. Unmounted by the ``small_fs`` fixture."""

    def __init__(self, root: Path, size: str, inodes: int | None = None) -> None:
        self.root, self.backing = root, root.with_name(f"{root.name}.tmpfs")
        self.stacked = 0  # read-only binds stacked over root (``read_only_over``)
        root.mkdir(parents=True)
        self.backing.mkdir()
        opts = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
        self._mount("-t", "tmpfs", "-o", opts, "tmpfs", str(self.backing))
        self._mount("--bind", str(self.backing), str(root))

    @staticmethod
    def _mount(*args: str) -> None:
        subprocess.run(["mount", *args], check=True, capture_output=True)

    def free(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int) -> None:
        """A ballast file (``fallocate``: real blocks taken) leaving about ``leave`` bytes."""
        page = os.sysconf("SC_PAGE_SIZE")
        take = (self.free() - leave) // page * page
        subprocess.run(["fallocate", "-l", str(take), str(self.root / "ballast")], check=True)

    def read_only(self) -> None:
        self._mount("-o", "remount,bind,ro", str(self.root))

    def read_only_over(self) -> None:
        """Read-only from now on while files are open for writing (a running job's): a
        read-only bind of the tmpfs stacked over ``root`` (``remount,bind,ro`` fails with EBUSY
        while a writer holds the mount, seen on this kernel). Every path opened from then on
        is on the read-only mount (EROFS for a new file, an append, a rename); a descriptor
        opened before (Slurm's task log) still writes. ``writable_again`` takes it off."""
        self._mount("--bind", "-o", "ro", str(self.backing), str(self.root))
        self.stacked += 1

    def writable_again(self) -> None:
        subprocess.run(["umount", str(self.root)], check=True, capture_output=True)
        self.stacked -= 1

    def writable(self) -> None:
        self._mount("-o", "remount,bind,rw", str(self.root))

    def unmount(self) -> None:
        for where in (*[self.root] * self.stacked, self.root, self.backing):
            subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


@pytest.fixture
def small_fs(tmp_path) -> Iterator[Callable[..., SmallFs]]:
    """Mount small tmpfs file systems under this test's tmp dir: ``small_fs("2m")``; each is
    unmounted after the test. Needs root (``mount``), as the suite has."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[SmallFs] = []

    def make(size: str = "2m", inodes: int | None = None) -> SmallFs:
        fs = SmallFs(tmp_path / f"fs{len(mounted)}", size, inodes)
        mounted.append(fs)
        return fs

    yield make
    for fs in mounted:
        fs.unmount()
