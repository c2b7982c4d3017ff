"""Storage faults on the local Slurm cluster (issue 41): the save dir's file system filled, made
read-only, and checkpoints with a flipped bit, in one 2-node tiny run (each fault checked on its
own start: a start per fault would triple the suite's minutes).

What stands in for FSx for Lustre: a tmpfs of its own (``small_fs``: root, mounted under the
test's /tmp dir, unmounted in the fixture's teardown) seen by both emulated nodes at the same
path, as every node of a cluster sees its FSx. Full: a ballast file (``fallocate``) leaving a
third of a checkpoint. Read-only: a read-only bind stacked over the save dir
(``SmallFs.read_only_over``: ``remount,ro`` fails with EBUSY while the job's files are open),
so every file opened from then on is refused with EROFS, as on a file system gone read-only;
descriptors opened before (Slurm's task log) still write, which FSx's would not. Not here: a
quota (tmpfs ``usrquota`` is not built into this kernel: the mount is refused) and an evicted
client's EIO on one node (both nodes share one mount): those are in the policy's tests
(tests/hpc_train/launch/test_storage_hold.py) only.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import torch

from hpc_core import integrity, ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train import testing as rehearsal
from hpc_train.planning import goodput
from hpc_train.runs import status
from tests.hpc_train.worker.test_verified_checkpoints import flip, tensor_bytes

pytestmark = pytest.mark.slurm

UPDATES = 70
INTERVAL = 10
PACE_S = 0.25  # an update takes at least this long: the faults land between saves


def _held(runs, job: str, what: str, restarts: int) -> dict[str, str]:
    """Slurm's record of ``job`` once it is held (requeuehold: PENDING, Reason
    job_requeued_in_held_state), after ``restarts`` requeues; its processes gone. The Reason
    is set at the requeue, while the job may still read COMPLETING (its steps' ends and the
    epilog not yet reported: CI's run of 2026-11-29 read it there), so both are waited for."""

    def held() -> dict[str, str] | None:
        info = slurm.job_info(job)
        if info is None or info.get("Reason") != "job_requeued_in_held_state":
            return None
        return info if info.get("JobState") == "PENDING" else None

    runs.wait_for(f"job {job} held ({what})", held, 240)
    runs.wait_processes_gone(job)
    info = slurm.job_info(job)
    assert info is not None and info["JobState"] == "PENDING", info
    assert info.get("Reason") == "job_requeued_in_held_state", info
    assert int(info["Restarts"]) == restarts, info  # the hold's requeue, no restart before it
    return info


def _not_drained(nodes: list[str]) -> None:
    for node in nodes:
        state = slurm.node_info(node)["State"]
        assert "DRAIN" not in state and "DOWN" not in state, (node, state)


def _events(save, kind: str) -> list[ledger.Event]:
    return [e for e in ledger.read(RunDir(save).ledger) if e.kind == kind]


def _flip_a_weight(path, which: int) -> None:
    """One bit in the middle of tensor record ``which`` (torch loads it: only the CRC32s tell)."""
    start, end = tensor_bytes(path)[which]
    flip(path, (start + (end - start) // 2) * 8 + 3)


def test_full_then_read_only_save_dir_holds_and_bad_checkpoints_are_set_aside(
    runs, small_fs, capsys
):
    """(1) The save dir fills to a third of a checkpoint: task 0 holds the job at the failed
    save (no restart, no drain), one line with the path, the free space, the quota unknown by
    name, the bytes a checkpoint needs and the release command, in the job's Comment, the log,
    the ledger and status; the last good checkpoint verifies and loads. (2) While it is held,
    space freed and one bit flipped in checkpoint_last.pt and (another) in the newest interval
    checkpoint, then ``scontrol release``: both set aside (the rank's load finds the first, task
    0 the second), the run resumes from the one before. (3) The save dir read-only mid-run:
    held again (EROFS). (4) Writable, released: the run completes; goodput counts the held
    time as storage."""
    fs = small_fs("64m")
    save = fs.root / "run"
    run = RunDir(save)
    runs.wait_idle_nodes(2)
    job, _ = runs.submit("storage", UPDATES, save=save, pace_s=PACE_S, fairseq=(
        "--save-interval-updates", str(INTERVAL), "--log-interval", "1"))  # fmt: skip
    nodes = slurm.hostnames(runs.wait_running(job).nodes)
    rehearsal.wait_for_event(run, "the second checkpoint", lambda e: e.kind == Kind.CHECKPOINT
                             and e.get("update") == 2 * INTERVAL, 300)  # fmt: skip
    fs.fill(leave=run.checkpoint_last.stat().st_size // 3)
    info = _held(runs, job, "full", restarts=1)
    _not_drained(nodes)

    comment = info["Comment"]
    assert comment.startswith(f"hpc-train: storage: {save} is full (ENOSPC): "), comment
    assert "quota unknown (no `lfs quota` on this node)" in comment
    assert re.search(r"a checkpoint needs [\d.]+ [kMG]B", comment), comment
    assert f"`scontrol release {job}` resumes it" in comment
    (stop,) = _events(save, Kind.STOPPED)
    why = stop.get("why")
    assert stop.get("cause") == "storage" and f"hpc-train: {why}" == comment and "\n" not in why
    assert why in runs.launcher_log(save, job)
    assert status.main([str(save), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["held"] == why
    assert not run.partial_writes()  # the refused save left no half-written file
    assert [e.get("update") for e in _events(save, Kind.CHECKPOINT)] == [INTERVAL, 2 * INTERVAL]
    assert integrity.verify(run.checkpoint_last).ok
    assert torch.load(run.checkpoint_last, map_location="cpu", weights_only=False)["model"]

    (fs.root / "ballast").unlink()
    newest = run.interval_checkpoints()[0]
    _flip_a_weight(run.checkpoint_last, -1)
    _flip_a_weight(newest, 0)  # another bit: fairseq's checkpoint_last.pt may be its hard link
    slurm.run(["scontrol", "release", job])
    rehearsal.wait_for_event(run, "a resume from the checkpoint before", lambda e: e.kind
                             == Kind.STARTED and e.get("resume_at") == INTERVAL, 300)  # fmt: skip
    aside = {e.get("file") for e in _events(save, Kind.SET_ASIDE)}
    assert aside == {"checkpoint_last.pt", newest.name}, aside
    assert len(run.set_aside_files()) == 2  # kept, never deleted
    causes = [e.get("cause") for e in _events(save, Kind.STOPPED)]
    # each bad file found by task 0 (its inode set aside before) or by the rank as it loaded
    # (a restart of its own: "bad checkpoint", never a user error)
    assert causes[0] == "storage" and set(causes[1:]) <= {"bad checkpoint"}, causes

    resumed = len(_events(save, Kind.STARTED))
    rehearsal.wait_for_event(run, "a checkpoint after the resume", lambda e: e.kind
                             == Kind.CHECKPOINT and e.get("update") == 3 * INTERVAL, 300)  # fmt: skip
    fs.read_only_over()
    try:
        info = _held(runs, job, "read-only", restarts=resumed)
        _not_drained(nodes)
        assert "is read-only (EROFS)" in info["Comment"], info
    finally:
        fs.writable_again()
    slurm.run(["scontrol", "release", job])
    final = runs.wait_done(job, timeout=600)
    assert final.state == "COMPLETED", (final, runs.explain(save, job))
    assert runs.summary(save).updates == UPDATES
    events = ledger.read(run.ledger)
    # the read-only hold's stop could not reach the ledger: said on stderr and in the Comment
    assert [e.get("cause") for e in events if e.kind == Kind.STOPPED] == causes
    g = goodput.account(events, time.time())
    assert g.storage_s > 0 and sum(g.parts.values()) == pytest.approx(g.wall_s)
    print(f"\nheld (full): {why}\nheld (read-only): {info['Comment']}\nstops: {causes}; set aside:"
          f" {sorted(aside)}; restarts {final.restarts}; {g.describe()}")  # fmt: skip
