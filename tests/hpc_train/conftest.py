"""The fake Slurm the launcher tests run against (no Slurm in the fast tier): it records what
the launcher asked of Slurm (requeues, drains, exclusions, signals, cancels) and answers a job state the test sets.
The real-Slurm versions of these tests are in tests/integration."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_core import slurm
from hpc_core.wait import FAST
from hpc_train.faults import end_evidence, quarantine
from hpc_train.job import container
from hpc_train.launch import lifecycle, recovery, release, requeue, signals


class FakeSlurm:
    """Stands in for hpc_core.slurm inside the launcher: a fake, no Slurm here."""

    SlurmError = slurm.SlurmError
    SlurmUnreachable = slurm.SlurmUnreachable
    SILENCE_PATIENCE_S = slurm.SILENCE_PATIENCE_S

    def __init__(self, state: str = "RUNNING") -> None:
        self.state = state
        self.restarts = 0  # Slurm's restart count of the job
        self.requeued: list[str] = []
        self.held: list[tuple[str, str]] = []  # (job, reason): requeued held
        self.drained: list[tuple[str, str]] = []
        self.excluded: list[tuple[str, list[str]]] = []
        self.signals: list[tuple[str, str]] = []  # scancel --signal
        self.cancelled: list[str] = []
        self.nodes: dict[str, dict[str, str]] = {}  # scontrol show node, by name (else IDLE)
        self.released: list[tuple[str, str]] = []  # (job, node) given back from a running job
        # sinfo -N of the job's partition: four idle nodes unless a test says otherwise
        self.partition: dict[str, str] = {f"n{i}": "idle" for i in range(1, 5)}
        self.gone: set[str] = set()  # nodes whose slurmd is gone: no step starts there
        self.silent = 0  # the controller answers none of the next this many look-ups
        self.asked: list[str] = []  # what was asked, in order (node, step, config)
        self.jobs_asked: list[str] = []  # each `scontrol show job` (the job's state), by job id
        self._lock = threading.Lock()  # the parts of one question are asked at once (threads)

    def _answer(self, what: str) -> None:
        with self._lock:
            self.asked.append(what)
            silent, self.silent = self.silent > 0, max(0, self.silent - 1)
        if silent:
            raise slurm.SlurmUnreachable(f"{what}: Unable to contact slurm controller")

    DEFAULT_SLURMD_TIMEOUT_S = slurm.DEFAULT_SLURMD_TIMEOUT_S
    machine = staticmethod(slurm.machine)  # pure: a node's record in, its machine out

    def job_state(self, job_id: str) -> slurm.JobState:
        self.jobs_asked.append(job_id)
        excluded = ",".join(self._excluded(job_id))
        return slurm.JobState(job_id, self.state, self.restarts, "n[1-2]", "", excluded=excluded)

    def _excluded(self, job_id: str) -> list[str]:
        return [n for job, nodes in self.excluded if job == job_id for n in nodes]

    def requeue(self, job_id: str) -> None:
        self.requeued.append(job_id)

    def hold(self, job_id: str, reason: str) -> None:
        self.held.append((job_id, reason))

    def drain(self, node: str, reason: str) -> None:
        self.drained.append((node, reason))

    def exclude(self, job_id: str, nodes: list[str]) -> list[str]:
        self.excluded.append((job_id, list(nodes)))
        return list(nodes)

    def step_starts(self, job_id: str, node: str, timeout: float = 20.0) -> bool | None:
        try:
            self._answer(f"step {node}")
        except slurm.SlurmUnreachable:
            return None  # unknown, as the real probe says while the controller is silent
        return node not in self.gone

    def slurmd_timeout_s(self) -> float:
        self._answer("config")
        return 0.5  # the local cluster's is 20 s: a test's wait for Slurm's word stays short

    def node_info(self, node: str) -> dict[str, str]:
        self._answer(f"node {node}")
        return self.nodes.get(node, {"State": "IDLE"})

    def node_machine(self, node: str) -> str:
        return slurm.machine(self.node_info(node))

    def partition_nodes(self, partition: str | None) -> dict[str, str]:
        return dict(self.partition)

    def job_info(self, job_id: str) -> dict[str, str]:
        excluded = self._excluded(job_id)
        held = [n for n in self.partition if (job_id, n) not in self.released]
        return {"JobId": job_id, "ExcNodeList": ",".join(excluded) or "(null)",
                "JobState": self.state, "Restarts": str(self.restarts),
                "NodeList": ",".join(held)}  # fmt: skip

    def hostnames(self, nodelist: str) -> list[str]:
        return nodelist.split(",")  # the fake writes plain lists (Slurm expands n[1-2])

    def signal(self, job_id: str, name: str = "USR2") -> None:
        self.signals.append((job_id, name))

    def release(self, job_id: str, node: str) -> bool:
        self.released.append((job_id, node))
        return True

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)


def _end_release_watchers(fake: FakeSlurm) -> None:
    """A test's in-job restart starts ``release``'s watcher thread (a daemon that polls for up
    to ``ENDED_WAIT_S``). Left running, it would go on polling the next test's fake and release
    a node there (CI, stop 33). So the job ends here, and each watcher sees it and returns."""
    fake.state = "COMPLETED"
    for thread in threading.enumerate():
        if thread.name == release.WATCHER:
            thread.join(timeout=10)
            assert not thread.is_alive(), "a release watcher outlived its test"


@pytest.fixture
def fake_slurm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlurm]:
    fake = FakeSlurm()
    # the modules that ask Slurm: the evidence's one reader, the executor's changes, the rest
    for part in (end_evidence, recovery, lifecycle, requeue, signals, quarantine):
        monkeypatch.setattr(part, "slurm", fake)
    monkeypatch.setattr(release, "slurm", fake)
    monkeypatch.setattr(release, "EXIT_GRACE_S", 0.0)
    monkeypatch.setattr(requeue, "REQUEUE_GRACE_S", 0.0)
    monkeypatch.setattr(release, "POLL", FAST)
    monkeypatch.setattr(lifecycle, "endpoint_to_watch", lambda: None)
    yield fake
    _end_release_watchers(fake)


def _tensors(value, prefix: str = ""):
    """(path, tensor) for every tensor in a checkpoint's nested state."""
    import torch

    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensors(v, f"{prefix}/{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{prefix}/{i}")


def assert_same_training_state(a_path: Path, b_path: Path) -> None:
    """Two checkpoint files hold the same training state: update, data position, every tensor
    of the model and the optimizer equal."""
    import torch

    from hpc_train.worker import checkpoints

    a, b = checkpoints.load(a_path), checkpoints.load(b_path)
    assert checkpoints.num_updates(a) == checkpoints.num_updates(b)
    assert a["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"]
    ta = dict(_tensors({"model": a["model"], "opt": a["last_optimizer_state"]}))
    tb = dict(_tensors({"model": b["model"], "opt": b["last_optimizer_state"]}))
    assert ta.keys() == tb.keys() and len(ta) > 10
    different = [k for k in ta if not torch.equal(ta[k], tb[k])]
    assert different == [], f"{b_path.name}: {different[:5]}"


@pytest.fixture
def same_training_state():
    """``assert_same_training_state(a, b)`` for the checkpoint comparisons (sync vs async,
    sync vs tiered)."""
    return assert_same_training_state


def oci_image(root: Path, python: bool = True) -> Path:
    """An OCI image directory as slurm/local/build-image.sh makes one (its spec cut short)."""
    image = root / "image"
    (image / "rootfs" / "usr").mkdir(parents=True)  # a mount point: empty, not the image's own
    (image / "rootfs" / "opt" / "hpc-train" / "venv" / "bin").mkdir(parents=True)
    if python:
        (image / "rootfs" / container.IMAGE_PYTHON.lstrip("/")).write_text("")
    spec = {"ociVersion": "1.0.2", "process": {"args": ["/bin/false"], "cwd": "/"},
            "root": {"path": "rootfs"},
            "mounts": [{"destination": "/usr", "type": "bind", "source": "/usr",
                        "options": ["rbind", "ro"]}]}  # fmt: skip
    (image / "config.json").write_text(json.dumps(spec))
    return image


@pytest.fixture
def slurm_with_oci(tmp_path, monkeypatch) -> Path:
    """A slurm.conf (munged's socket named in AuthInfo) with an oci.conf beside it."""
    etc, munge = tmp_path / "etc", tmp_path / "munge"
    etc.mkdir()
    munge.mkdir()
    conf = etc / "slurm.conf"
    conf.write_text(f"ClusterName=t\nAuthInfo=socket={munge}/munge.socket,cred_expire=10\n")
    (etc / "oci.conf").write_text('RunTimeRun="runc run %n -b %b"\n')
    monkeypatch.setenv("SLURM_CONF", str(conf))
    return conf
