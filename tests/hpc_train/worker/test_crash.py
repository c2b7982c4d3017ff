"""A rank's crash report and a crash injected by chaos: the worker's side of the failure files
(task 0 reads them through ``hpc_train.faults.failures``). Pure file I/O, milliseconds."""

from __future__ import annotations

import errno

import pytest

from hpc_core.rundir import RunDir
from hpc_train import contract
from hpc_train.contract import CrashRequest, StartFiles, write_crash_request
from hpc_train.faults import failures
from hpc_train.worker import crash


def test_a_worker_reports_its_exception_only_under_a_launcher(tmp_path):
    run = RunDir(tmp_path)
    err = ValueError("bad batch\nmore detail")
    crash.report(run, None, 0, err, 12)  # plain fairseq run: nothing to tell
    assert not (run.state / "failures").exists()
    crash.report(run, ("41", 2), 3, err, 12)
    (found,) = failures.read(StartFiles(run, "41", 2))
    assert (found.rank, found.update, found.type, found.message) == (
        3,
        12,
        "ValueError",
        "bad batch",
    )
    assert found.chain == ("ValueError: bad batch",) and found.errno is None
    assert found.node == contract.node_name()
    crash.report(run, ("41", 3), 0, KeyboardInterrupt(), 12)  # a stop, not a crash
    assert failures.read(StartFiles(run, "41", 3)) == []


def test_an_injected_crash_raises_at_its_update_and_rank_only(tmp_path):
    run = RunDir(tmp_path)
    crash.crash_if_asked(run, 30, 0)  # nothing injected: nothing happens
    write_crash_request(run, CrashRequest(30, 1))
    crash.crash_if_asked(run, 29, 1)
    crash.crash_if_asked(run, 30, 0)
    with pytest.raises(crash.InjectedCrash, match="update 30 on rank 1"):
        crash.crash_if_asked(run, 30, 1)


# --- the chain and its errno: what a storage classification needs ------------------------------


def full_disk_error(small_fs) -> BaseException:
    """torch.save of 4 MB onto a tmpfs of 2 MB: the real chain (a full FSx for Lustre fails the
    same write with the same errno)."""
    import torch

    from hpc_core import rundir

    fs = small_fs("2m")
    try:
        with rundir.atomic_writer(fs.root / "checkpoint_1_5.pt") as fh:
            torch.save({"w": torch.zeros(1024, 1024)}, fh)
    except BaseException as err:
        return err
    raise AssertionError("the write fit")


def test_the_errno_of_a_full_disk_is_found_behind_torchs_runtime_error(small_fs):
    err = full_disk_error(small_fs)
    record = crash.from_exception(err, rank=0, update=50)
    assert record.type == "RuntimeError" and "unexpected pos" in record.message
    assert record.errno == errno.ENOSPC
    assert record.chain[0].startswith("RuntimeError: [enforce fail at inline_container.cc")
    assert record.chain[1] == "OSError: [Errno 28] No space left on device"


def test_the_errno_survives_the_background_writers_wrapping(small_fs):
    from hpc_train.worker import async_save

    fs = small_fs("2m")
    fs.fill(leave=100_000)
    saver = async_save.AsyncSaver()
    saver.save({"w": __import__("torch").zeros(100_000)}, str(fs.root / "checkpoint_1_5.pt"))
    with pytest.raises(async_save.CheckpointWriteError) as failed:
        saver.flush()
    record = crash.from_exception(failed.value, rank=0, update=5)
    assert record.type == "CheckpointWriteError" and record.errno == errno.ENOSPC
    assert record.errno_path == str(fs.root / "checkpoint_1_5.pt")
    assert record.chain[1].startswith("NoSpace: [Errno 28] no space for checkpoint_1_5.pt")


def test_an_errno_only_in_a_message_and_a_chain_that_loops():
    wrapped = RuntimeError("save failed: [Errno 122] Disk quota exceeded: '/lustre/x'")
    assert crash.from_exception(wrapped, 0, 1).errno == errno.EDQUOT
    a, b = ValueError("a"), KeyError("b")
    a.__context__, b.__context__ = b, a  # a cycle
    assert crash.from_exception(a, 0, 1).chain == ("ValueError: a", "KeyError: 'b'")
    assert crash.from_exception(ValueError("x"), 0, 1).errno is None


def test_a_report_that_cannot_be_written_is_said_on_stderr_whole(small_fs, capfd):
    """The save dir's file system read-only (a tmpfs remounted ro: FSx made read-only): the
    report goes to stderr, one line task 0's launcher reads back (agent_exit.Tee)."""
    import io

    from hpc_train.faults import agent_exit

    fs = small_fs("2m")
    run = RunDir(fs.root)
    run.state.mkdir()
    fs.read_only()
    err = RuntimeError("a background checkpoint write failed")
    err.__cause__ = OSError(
        errno.EROFS, "Read-only file system", str(fs.root / "checkpoint_last.pt")
    )
    crash.report(run, ("41", 2), 3, err, 12)  # no exception: the rank's own error stays the word
    line = capfd.readouterr().err.strip()
    assert line.startswith("hpc-train: failure report not written (") and "Read-only" in line
    record = contract.failure_of_line("[rank3]: " + line)
    assert record == crash.from_exception(err, 3, 12) and record.errno == errno.EROFS
    with agent_exit.Tee(io.StringIO()) as tee:
        tee._line("[rank3]: " + line + "\n")
        tee._line("an ordinary line\n")
        assert tee.failures == [record]
