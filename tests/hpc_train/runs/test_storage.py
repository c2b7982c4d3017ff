"""The save dir as storage in ``status`` and ``doctor``: the room on its file system (a tmpfs of
its own, ``small_fs``, standing for FSx for Lustre), the size of a checkpoint and the last
verified checkpoint (the ledger's, as a rank wrote them), the checkpoints set aside. Slurm's word
is an input (faked, as in test_status.py and test_doctor.py)."""

from __future__ import annotations

import json

import pytest

from hpc_core import ledger, slurm, space
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train.runs import doctor, index, metrics, status

SHA = "ab12cd34ef56" + "0" * 52


def make_run(root, checkpoint_bytes: int) -> RunDir:
    run = RunDir(root)
    run.state.mkdir(parents=True)
    run.train_log.write_text("")
    note = ledger.record
    note(run.ledger, Kind.SUBMITTED, "41", 0, when=1000.0, max_update=100, name="big")
    note(run.ledger, Kind.STARTED, "41", 1, when=1010.0, previous="first start")
    note(run.ledger, Kind.SET_ASIDE, "41", 1, when=1011.0, file="checkpoint_last.pt",
         moved_to=str(root / "checkpoint_last.pt.bad-20261128T120000-7"),
         why="CRC32 mismatch in record archive/data/3")  # fmt: skip
    note(run.ledger, Kind.VERIFIED, "41", 1, when=1012.0, file="checkpoint_1_200.pt", update=200,
         sha256=SHA, bytes=checkpoint_bytes, verify_s=0.8, load_s=1.1)  # fmt: skip
    note(run.ledger, Kind.CHECKPOINT, "41", 1, when=1050.0, update=250, seconds=0.3,
         bytes=checkpoint_bytes, sha256=SHA)  # fmt: skip
    ledger.index_run("41", run.root, "big", 100)
    return run


@pytest.fixture
def running(monkeypatch, tmp_path):
    monkeypatch.setenv(ledger.INDEX_ENV, str(tmp_path / "state"))
    said = {"41": slurm.JobState("41", "RUNNING", 1, "n[1-2]", "")}
    monkeypatch.setattr(index, "slurm_states", lambda jobs, warn=None: said)
    return said["41"]


def test_status_says_the_room_the_checkpoint_size_and_the_last_verified(small_fs, running, capsys):
    fs = small_fs("8m")
    run = make_run(fs.root / "run", checkpoint_bytes=3_000_000)
    assert status.main([str(run.root)]) == 0
    out = capsys.readouterr().out
    room = space.of(run.root)
    assert f"storage: {space.size(room.free_bytes)} free of {space.size(room.total_bytes)}" in out
    assert f"({run.root}); a checkpoint 3.0 MB" in out
    assert ("last verified checkpoint: checkpoint_1_200.pt at update 200 (sha256 ab12cd34ef56...; "
            "0.8 s beside a 1.1 s load, start 41-1)") in out  # fmt: skip
    assert ("set aside: checkpoint_last.pt (CRC32 mismatch in record archive/data/3) as "
            f"{run.root}/checkpoint_last.pt.bad-20261128T120000-7") in out  # fmt: skip
    assert status.main([str(run.root), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["storage"]["free_bytes"] == room.free_bytes
    assert row["storage"]["checkpoint_bytes"] == 3_000_000
    assert row["storage"]["verified"]["sha256"] == SHA


def test_the_doctor_finds_no_room_for_the_next_saves(small_fs, running):
    fs = small_fs("8m")
    run = make_run(fs.root / "run", checkpoint_bytes=3_000_000)
    view = metrics.observe(index.resolve(str(run.root)), running, 1060.0)
    assert [f.check for f in doctor.diagnose(view)] == []  # 2 x 3 MB fits in ~8 MB
    fs.fill(leave=4_000_000)
    view = metrics.observe(index.resolve(str(run.root)), running, 1060.0)
    (finding,) = [f for f in doctor.diagnose(view) if f.check == doctor.STORAGE]
    assert finding.what.startswith(f"no room for the next save and a save on notice: {fs.root}")
    assert "6.0 MB needed" in finding.what and "1 checkpoint(s) set aside there" in finding.what
    assert "last verified checkpoint: checkpoint_1_200.pt at update 200" in finding.what
    assert finding.fix.startswith(f"df -h {fs.root}") and not finding.sure


def test_a_run_with_nothing_verified_yet_says_so(tmp_path):
    from hpc_train.runs import storage

    found = storage.of(RunDir(tmp_path), [], None)
    assert found.lines() == [
        "storage: room unknown",
        "last verified checkpoint: none yet (each start verifies the one it resumes from)",
    ]
    assert found.short() is None
