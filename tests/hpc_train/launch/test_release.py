"""Task 0 gives a node left out of an in-job restart back to Slurm once its task has ended
(``hpc_train.launch.release``). Against a fake Slurm (milliseconds; the real-Slurm checks are in
tests/hpc_core/test_slurm.py and tests/integration/test_restart_in_job.py)."""

from __future__ import annotations

import time

import pytest

from hpc_core import ledger, slurm
from hpc_core.rundir import RunDir
from hpc_train.contract import ENDED, WAITING, LauncherBeat, StartFiles, write_launcher_beat
from hpc_train.launch import release
from hpc_train.watch.watcher import Watcher


class JobSlurm:
    """A fake of the calls ``release`` makes: one running job on ``nodes``."""

    SlurmError = slurm.SlurmError

    def __init__(self, nodes: list[str], state: str = "RUNNING") -> None:
        self.nodes, self.state, self.restarts = list(nodes), state, 0
        self.released: list[str] = []

    def job_info(self, job_id: str) -> dict[str, str]:
        return {"JobId": job_id, "JobState": self.state, "NodeList": ",".join(self.nodes),
                "Restarts": str(self.restarts)}  # fmt: skip

    def hostnames(self, nodelist: str) -> list[str]:
        return nodelist.split(",") if nodelist else []

    def release(self, job_id: str, node: str) -> bool:
        if node not in self.nodes:
            return False
        self.nodes.remove(node)
        self.released.append(node)
        return True


@pytest.fixture
def fake(monkeypatch) -> JobSlurm:
    job = JobSlurm(["n1", "n2", "n3"])
    monkeypatch.setattr(release, "slurm", job)
    monkeypatch.setattr(release, "EXIT_GRACE_S", 0.0)
    monkeypatch.setattr(release, "ENDED_WAIT_S", 0.3)
    monkeypatch.setattr(release, "POLL", release.Backoff(0.01, 1.0, 0.01))
    return job


def left(run: RunDir, nodes: dict[int, str]) -> release.LeftOut:
    """The nodes left out of round 0 of job 41."""
    return release.LeftOut(StartFiles(run, "41", 0), nodes)


def beat(run: RunDir, task: int, node: str, phase: str) -> None:
    write_launcher_beat(run, "41", 0, LauncherBeat(task, node, 1, 0.0, phase))


def test_a_left_out_node_whose_task_ended_is_released_and_recorded(tmp_path, fake):
    run, said = RunDir(tmp_path), []
    beat(run, 1, "n2", ENDED)
    note = lambda kind, **data: ledger.record(run.ledger, kind, "41", 0, **data)  # noqa: E731
    release.release_when_ended(left(run, {1: "n2"}), said.append, note)
    assert fake.released == ["n2"] and fake.nodes == ["n1", "n3"]
    (event,) = [e for e in ledger.read(run.ledger) if e.kind == "released"]
    assert event.get("node") == "n2" and "released n2" in said[0]


def test_a_task_that_never_ends_keeps_its_node_its_kill_would_fail_the_job(tmp_path, fake):
    """Still running (its launcher beats WAITING): releasing it would kill the task and the
    step's srun would exit 137 at the end, so the node stays in the job."""
    run, said = RunDir(tmp_path), []
    beat(run, 1, "n2", WAITING)
    release.release_when_ended(left(run, {1: "n2"}), said.append, lambda *a, **k: 0)
    assert fake.released == [] and fake.nodes == ["n1", "n2", "n3"]
    assert "not released" in said[0]


def test_a_node_slurm_already_took_out_is_not_waited_for_nor_recorded(tmp_path, fake):
    """A node lost whole (NODE_FAIL under --no-kill): Slurm shrank the job itself."""
    run, said, notes = RunDir(tmp_path), [], []
    fake.nodes.remove("n3")
    release.release_when_ended(left(run, {2: "n3"}), said.append,
                               lambda kind, **d: notes.append(kind))  # fmt: skip
    assert fake.released == [] and notes == [] and said == []


def test_nothing_left_out_starts_no_thread(tmp_path, fake):
    assert release.start(left(RunDir(tmp_path), {}), print, print) is None


def test_the_release_is_a_watcher_thread_that_releases_then_ends(tmp_path, fake):
    run, said, notes = RunDir(tmp_path), [], []
    beat(run, 1, "n2", ENDED)
    watcher = release.start(left(run, {1: "n2"}), said.append,
                            lambda kind, **d: notes.append(kind))  # fmt: skip
    assert isinstance(watcher, Watcher) and watcher.name == release.WATCHER
    watcher.join(10)
    assert not watcher.is_alive() and fake.released == ["n2"] and notes == ["released"]


def test_its_stop_ends_the_wait_for_a_task_still_running(tmp_path, fake, monkeypatch):
    """A watcher's ``stop()`` ends it at once, never waiting out ``ENDED_WAIT_S``."""
    monkeypatch.setattr(release, "ENDED_WAIT_S", 60.0)
    monkeypatch.setattr(release, "POLL", release.Backoff(0.02, 1.0, 0.02))
    run, said = RunDir(tmp_path), []
    beat(run, 1, "n2", WAITING)
    watcher = release.start(left(run, {1: "n2"}), said.append, lambda *a, **k: 0)
    assert watcher is not None and watcher.is_alive()
    began = time.monotonic()
    watcher.stop()
    assert not watcher.is_alive() and time.monotonic() - began < 5
    assert fake.released == [] and said == []


def test_slurm_release_shrinks_the_running_job_without_its_environment(monkeypatch):
    """``hpc_core.slurm.release`` against a fake scontrol: the job's other nodes kept; never
    the batch host (that would end the job), nor a job that is not running; and scontrol runs
    without SLURM_JOB* (inside a job it would write slurm_job_<id>_resize.sh into the cwd)."""
    calls: list[tuple[list[str], dict[str, str] | None]] = []
    info = {"JobState": "RUNNING", "NodeList": "n1,n2,n3", "BatchHost": "n1"}
    monkeypatch.setattr(slurm, "job_info", lambda job: dict(info))
    monkeypatch.setattr(slurm, "hostnames", lambda nodes: nodes.split(","))
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30.0, check=True, env=None:
                        calls.append((list(args), env)) or "")  # fmt: skip
    monkeypatch.setenv("SLURM_JOBID", "41")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    assert slurm.release("41", "n2") is True
    ((args, env),) = calls
    assert args == ["scontrol", "update", "JobId=41", "NodeList=n1,n3"]
    assert env is not None and "SLURM_JOBID" not in env and "SLURM_JOB_ID" not in env
    assert slurm.release("41", "n1") is False  # the batch host
    assert slurm.release("41", "n4") is False  # not in the job
    info["JobState"] = "PENDING"
    assert slurm.release("41", "n2") is False and len(calls) == 1


def test_a_node_of_a_later_start_is_never_released(tmp_path, fake):
    """The job was requeued (Restarts 1) while the release waited: n2 may be in the new
    allocation, which is not the start that left it out."""
    run, said, notes = RunDir(tmp_path), [], []
    beat(run, 1, "n2", ENDED)
    fake.restarts = 1
    release.release_when_ended(left(run, {1: "n2"}), said.append,
                               lambda kind, **d: notes.append(kind))  # fmt: skip
    assert fake.released == [] and notes == [] and fake.nodes == ["n1", "n2", "n3"]
