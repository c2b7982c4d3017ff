"""hpc_core.rundir: the save-dir layout and atomic writes (the markers' schemas: test_contract)."""

from __future__ import annotations

import os

import pytest

from hpc_core import rundir
from hpc_core.rundir import RunDir, set_aside_name


def test_layout_names_every_path_under_the_save_dir(tmp_path):
    run = RunDir(tmp_path)
    assert run.train_log == tmp_path / "train.log"
    assert run.checkpoint_last == tmp_path / "checkpoint_last.pt"
    assert run.slurm_logs == tmp_path / "slurm"
    assert run.task_log("17", 1, "err") == tmp_path / "slurm" / "17_1_log.err"
    assert run.stop_marker("12", 3) == tmp_path / ".hpc-train" / "stopped-12-3.json"
    assert run.resume_decision("12", 3).name == "resume-12-3.json"
    assert set_aside_name(run.checkpoint_last).name.startswith("checkpoint_last.pt.bad-")


def test_set_aside_files_are_no_checkpoint_and_are_listed(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "checkpoint_1_5.pt").write_bytes(b"x")
    moved = set_aside_name(tmp_path / "checkpoint_1_5.pt")
    (tmp_path / "checkpoint_1_5.pt").rename(moved)
    assert run.set_aside_files() == [moved]
    assert run.checkpoint_files() == [] and run.interval_checkpoints() == []


def test_interval_checkpoints_newest_update_first(tmp_path):
    for name in ("checkpoint_1_5.pt", "checkpoint_2_40.pt", "checkpoint_1_10.pt", "other_1_2.pt"):
        (tmp_path / name).write_bytes(b"x")
    names = [p.name for p in RunDir(tmp_path).interval_checkpoints()]
    assert names == ["checkpoint_2_40.pt", "checkpoint_1_10.pt", "checkpoint_1_5.pt"]
    assert RunDir(tmp_path / "missing").interval_checkpoints() == []


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "result.json"
    rundir.atomic_write(target, "old")
    rundir.atomic_write(target, b"new")
    assert target.read_text() == "new"
    assert os.listdir(target.parent) == ["result.json"]
    assert target.stat().st_mode & 0o777 == 0o644  # readable like any config (umask 022)


def test_a_failed_write_leaves_the_old_file_untouched(tmp_path):
    target = tmp_path / "result.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), rundir.atomic_writer(target) as fh:
        fh.write(b"half")
        raise RuntimeError("killed half-way")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["result.json"]


def test_atomic_copy_links_then_refuses_to_overwrite_when_told(tmp_path):
    src, dst = tmp_path / "a", tmp_path / "b"
    src.write_bytes(b"whole")
    assert rundir.atomic_copy(src, dst)
    assert dst.read_bytes() == b"whole" and os.stat(dst).st_ino == os.stat(src).st_ino
    assert not rundir.atomic_copy(src, dst, overwrite=False)


def test_a_failed_rename_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "cluster.yaml"
    target.write_text("old: true\n")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rundir.os, "replace", broken_replace)
    with pytest.raises(OSError):
        rundir.atomic_write(target, "new: true\n")
    assert target.read_text() == "old: true\n"
    assert os.listdir(tmp_path) == ["cluster.yaml"]


@pytest.fixture
def fsyncs(monkeypatch) -> list[tuple[str, int, bool]]:
    """Every fsync, recorded as (file or dir, its inode, its bytes), then done for real."""
    import stat

    done: list[tuple[str, int, bool]] = []
    real = os.fsync

    def recording(fd: int) -> None:
        st = os.fstat(fd)
        done.append(("dir" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino, st.st_size > 0))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return done


def test_atomic_write_fsyncs_the_file_before_the_rename_then_the_directory(tmp_path, fsyncs):
    """Durable: the new file's data reaches the disk before the rename makes it the file,
    and the rename itself (the directory entry) once done. Without either fsync a machine
    crash may leave an empty or an old file."""
    target = tmp_path / "decision.json"
    target.write_text("old")
    replaced: list[int] = []
    real_replace = os.replace

    def replace(src, dst):
        replaced.append(len(fsyncs))  # how many fsyncs came before the rename
        real_replace(src, dst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rundir.os, "replace", replace)
        rundir.atomic_write(target, "new")
    new, directory = os.stat(target).st_ino, os.stat(tmp_path).st_ino
    assert [(kind, ino) for kind, ino, _ in fsyncs] == [("file", new), ("dir", directory)]
    assert fsyncs[0][2]  # the new bytes were written when the file was synced
    assert replaced == [1]  # the file's fsync before the rename, the directory's after
    fsyncs.clear()
    rundir.atomic_write(target, "whole, may be lost in a crash", durable=False)
    assert fsyncs == []


def test_atomic_copy_fsyncs_the_directory_and_a_copy_before_its_rename(tmp_path, fsyncs):
    """A hard link shares the source's (already durable) data: only the new name is synced.
    A copy (another file system) is new data: synced before the rename, then the name."""
    src, dst = tmp_path / "checkpoint_3_30.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"weights")
    directory = os.stat(tmp_path).st_ino
    assert rundir.atomic_copy(src, dst)
    assert [(kind, ino) for kind, ino, _ in fsyncs] == [("dir", directory)]
    fsyncs.clear()

    def no_link(a, b):
        raise OSError(18, "Invalid cross-device link")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rundir.os, "link", no_link)
        assert rundir.atomic_copy(src, dst)
    copy = os.stat(dst).st_ino
    assert copy != os.stat(src).st_ino and dst.read_bytes() == b"weights"
    assert [(kind, ino) for kind, ino, _ in fsyncs] == [("file", copy), ("dir", directory)]
    assert fsyncs[0][2]  # the copy's bytes were there when it was synced


def test_a_write_into_an_existing_folder_is_a_create_and_a_rename_only(tmp_path, monkeypatch):
    """Every rank writes a heartbeat three times an update on the shared file system, where
    each metadata operation is an RPC: no mkdir, stat or unlink once the folder is there
    (bench-scale counted five operations a write before: mkdir, stat, create, rename, an
    unlink that found nothing); a missing folder is made on the first write."""
    seen: list[str] = []
    real_mkdir, real_unlink = type(tmp_path).mkdir, type(tmp_path).unlink
    monkeypatch.setattr(type(tmp_path), "mkdir",
                        lambda self, *a, **k: (seen.append("mkdir"), real_mkdir(self, *a, **k))[1])  # fmt: skip
    monkeypatch.setattr(type(tmp_path), "unlink",
                        lambda self, *a, **k: (seen.append("unlink"), real_unlink(self, *a, **k))[1])  # fmt: skip
    target = tmp_path / "beats" / "n1" / "rank-0.json"
    rundir.atomic_write(target, "1", durable=False)
    assert set(seen) == {"mkdir"} and target.read_text() == "1"  # its folders, made once
    seen.clear()
    for n in range(3):
        rundir.atomic_write(target, str(n), durable=False)
    assert seen == [] and target.read_text() == "2"
    assert sorted(p.name for p in target.parent.iterdir()) == ["rank-0.json"]
