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
from hpc_train.planning import goodput
from hpc_train.runs import status
from tests.hpc_train.worker.test_verified_checkpoints import flip, tensor_bytes

pytestmark = pytest.mark.slurm

UPDATES = 70
INTERVAL = 10
PACE_S = 0.25  # an update takes at least this long: the faults land between saves


def _held(runs, job: str, what: str, restarts: int) -> dict[str, str]:
    """Slurm's record of ``job`` once it is held (requeuehold: PENDING, Reason
    job_requeued_in_held_state), after ``restarts`` requeues; its processes gone."""
    runs.wait_for(f"job {job} held ({what})", lambda: (info := slurm.job_info(job)) is not None
                  and info.get("Reason") == "job_requeued_in_held_state" and info, 240)  # fmt: skip
    runs.wait_processes_gone(job)
    info = slurm.job_info(job)
    assert info is not None and info["JobState"] == "PENDING", info
    assert int(info["Restarts"]) == restarts, info  # the hold's requeue, no restart before it
    return info


def _not_drained(nodes: list[str]) -> None:
    for node in nodes:
        state = slurm.node_info(node)["State"]
        assert "DRAIN" not in state and "DOWN" not in state, (node, state)


def _stops(save) -> list[ledger.Event]:
    return [e for e in ledger.read(RunDir(save).ledger) if e.kind == Kind.STOPPED]


def test_full_then_read_only_save_dir_holds_and_bad_checkpoints_are_set_aside(
    runs, small_fs, capsys
):
    """(1) The save dir fills to a third of a checkpoint: task 0 holds the job at the failed
    save (no restart, no drain), one line with the path, the free space, the quota unknown by
    name, the bytes a checkpoint needs and the release command, in the job's Comment, the log,
    the ledger and status; the last good checkpoint verifies and loads. (2) While it is held,
    space freed and one bit flipped in checkpoint_last.pt and in the newest interval
    checkpoint, then ``scontrol release``: both set aside, the start resumes from the one
    before. (3) The save dir read-only mid-run: held again (EROFS). (4) Writable, released:
    the run completes; goodput counts the held time as storage."""
    fs = small_fs("64m")
    save = fs.root / "run"
    runs.wait_idle_nodes(2)
    job, _ = runs.submit("storage", UPDATES, save=save, pace_s=PACE_S, fairseq=(
        "--save-interval-updates", str(INTERVAL), "--log-interval", "1"))  # fmt: skip
    run = RunDir(save)
    nodes = slurm.hostnames(runs.wait_running(job).nodes)
    runs.wait_for_update(save, 2 * INTERVAL + 3)  # checkpoints at 10 and 20 are on disk
    last_bytes = run.checkpoint_last.stat().st_size
    fs.fill(leave=last_bytes // 3)
    info = _held(runs, job, "full", restarts=1)
    _not_drained(nodes)

    comment = info["Comment"]
    assert comment.startswith(f"hpc-train: storage: {save} is full (ENOSPC): "), comment
    assert "quota unknown (no `lfs quota` on this node)" in comment
    need = re.search(r"a checkpoint needs ([\d.]+ [kMG]B)", comment)
    assert need is not None, comment
    assert f"`scontrol release {job}` resumes it" in comment
    (stop,) = _stops(save)
    assert stop.get("cause") == "storage" and f"hpc-train: {stop.get('why')}" == comment
    assert runs.launcher_log(save, job).count(stop.get("why")) == 1  # one line, said once
    assert status.main([str(save), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["held"] == stop.get("why")
    assert not run.partial_writes()  # the refused save left no half-written file
    good = sorted(run.interval_checkpoints(), key=lambda p: p.stat().st_mtime)
    assert [p.name for p in good][-2:] == ["checkpoint_1_10.pt", "checkpoint_1_20.pt"]
    assert integrity.verify(run.checkpoint_last).ok
    torch.load(run.checkpoint_last, map_location="cpu", weights_only=False)

    (fs.root / "ballast").unlink()
    for path in (run.checkpoint_last, run.root / "checkpoint_1_20.pt"):
        start, end = tensor_bytes(path)[-1]
        flip(path, (start + (end - start) // 2) * 8 + 3)  # a tensor's byte: torch loads it
    slurm.run(["scontrol", "release", job])
    runs.wait_for_update(save, 2 * INTERVAL + 3, timeout=240)
    aside = [e for e in ledger.read(run.ledger) if e.kind == Kind.SET_ASIDE]
    assert {e.get("file") for e in aside} == {"checkpoint_last.pt", "checkpoint_1_20.pt"}
    started = [e for e in ledger.read(run.ledger) if e.kind == Kind.STARTED]
    assert [e.get("resume_at") for e in started] == [0, INTERVAL], started
    assert len(run.set_aside_files()) == 2  # kept, never deleted

    runs.wait_for_update(save, 3 * INTERVAL + 3, timeout=240)
    fs.read_only_over()
    try:
        _held(runs, job, "read-only", restarts=2)
        _not_drained(nodes)
        info = slurm.job_info(job)
        assert info is not None and "is read-only (EROFS)" in info["Comment"], info
    finally:
        fs.writable_again()
    slurm.run(["scontrol", "release", job])
    final = runs.wait_done(job, timeout=600)
    assert final.state == "COMPLETED", (final, runs.explain(save, job))
    assert runs.summary(save).updates == UPDATES
    events = ledger.read(run.ledger)
    assert [e.get("cause") for e in events if e.kind == Kind.STOPPED] == ["storage"]  # the RO
    # hold's stop could not reach the read-only ledger: said on stderr, in the Comment
    g = goodput.account(events, time.time())
    assert g.storage_s > 0 and sum(g.parts.values()) == pytest.approx(g.wall_s)
