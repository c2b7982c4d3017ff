"""Storage and checkpoint faults through the one decision path (issue 41, second half): the
evidence (reports, said on stderr too, and every node's probe of the save dir) -> the policy's
``Hold`` or, where only one node sees it, a requeue without that node; a checkpoint that failed
verification as it loaded -> a restart from the newest good one; none good -> held.

The end cases are ``hpc_train.testing.end_case``'s (no file, no Slurm); the evidence test reads a
real run dir (exit records, a ledger) with ``faults.end_evidence.at_exit``. The real faults on
the local cluster are tests/integration/test_storage_faults.py."""

from __future__ import annotations

import errno
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from hpc_core import ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train.contract import Cause, FailureRecord, StartFiles
from hpc_train.faults import end_evidence, failures, storage
from hpc_train.faults.end_evidence import Ended, EndEvidence, Ending, Where
from hpc_train.faults.failures import CORRUPT_CHECKPOINT, Failure, NodeExit, Probe
from hpc_train.faults.suspects import Evidence
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Training
from hpc_train.launch import launcher, restart_policy
from hpc_train.launch.transition import Hold, InJobRound, Requeue, Stop
from hpc_train.testing import HOSTS, end_case, on_task

EIO_REPORT = ("OSError", "[Errno 5] Input/output error")


def _exit_with(case, failures_=(), probes=(), before=()):
    return replace(case, evidence=replace(case.evidence, failures=tuple(failures_),
                                          probes=tuple(probes), before=tuple(before)))  # fmt: skip


def test_eio_on_one_node_while_the_other_writes_blames_and_drains_that_node(tmp_path):
    """An evicted Lustre client (EIO on n2 only; n1's probe writes): n2's fault, not the file
    system's: blamed on ``Evidence.STORAGE`` (drained at once), the run requeued without it,
    the stop's cause storage; no hold."""
    case = end_case(tmp_path, Cause.USER_ERROR, "requeue")
    path = str(tmp_path / "checkpoint_last.pt")
    report = Failure(1, 40, *EIO_REPORT, errno.EIO, path, node="n2")
    probes = (Probe("n1", tmp_path, 10**9, 10**5), Probe("n2", tmp_path, None, None, errno.EIO))
    t = restart_policy.after_end(_exit_with(case, [report], probes).evidence, case.options)
    assert isinstance(t, Requeue) and t.stopped.cause == Cause.STORAGE, t
    ((blame),) = t.blames
    assert (blame.node, blame.evidence, blame.verdict.drain) == ("n2", Evidence.STORAGE, True)
    assert t.exclude == ("n2",) and "on n2 only" in blame.why


def test_the_same_eio_on_every_node_holds_and_blames_none(tmp_path):
    case = end_case(tmp_path, Cause.USER_ERROR, "in-job")
    path = str(tmp_path / "checkpoint_last.pt")
    reports = [Failure(r, 40, *EIO_REPORT, errno.EIO, path, node=n) for r, n in enumerate(HOSTS)]
    probes = [Probe(n, tmp_path, None, None, errno.EIO) for n in HOSTS]
    t = restart_policy.after_end(_exit_with(case, reports, probes).evidence, case.options)
    assert isinstance(t, Hold) and t.blames == () and t.stopped.cause == Cause.STORAGE
    assert "failing with I/O errors (EIO)" in t.why and "`scontrol release 41`" in t.why


def test_a_probe_alone_finds_storage_where_no_report_survived(tmp_path):
    """A rank's report lost with the file system: the probes that cannot write say storage
    (read-only everywhere), not a crash blamed on a node."""
    case = end_case(tmp_path, Cause.CRASH, "requeue")
    probes = [Probe(n, tmp_path, 10**9, 10**5, errno.EROFS, "OSError: read-only") for n in HOSTS]
    t = restart_policy.after_end(_exit_with(case, (), probes).evidence, case.options)
    assert isinstance(t, Hold) and t.blames == () and "read-only (EROFS)" in t.why


def test_other_tasks_leave_the_hold_to_task_0(tmp_path):
    case = on_task(end_case(tmp_path, Cause.STORAGE, "requeue"), 1)
    t = restart_policy.after_end(case.evidence, case.options)
    assert isinstance(t, Stop) and t.fails and "task 0 decides" in t.why


def test_a_bad_checkpoint_at_load_restarts_at_once_and_is_never_the_same_error_again(tmp_path):
    """CorruptCheckpoint (set aside by the rank as it loaded) at update 0 in two starts in a
    row (checkpoint_last.pt, then the newest interval one): each restarts from the next good
    one, no blame, never stopped as "the same error"; a user error so would stop the run."""
    case = end_case(tmp_path, Cause.CHECKPOINT, "in-job")
    bad = Failure(0, 0, CORRUPT_CHECKPOINT, "checkpoint_1_40.pt failed verification (CRC)")
    before = Failure(0, 0, CORRUPT_CHECKPOINT, "checkpoint_last.pt failed verification (CRC)")
    t = restart_policy.after_end(_exit_with(case, [bad], (), [before]).evidence, case.options)
    assert isinstance(t, InJobRound) and t.blames == () and t.stopped.cause == Cause.CHECKPOINT
    user = Failure(0, 0, "ValueError", "bad batch 12")
    again = Failure(0, 0, "ValueError", "bad batch 13")
    u = restart_policy.after_end(_exit_with(case, [user], (), [again]).evidence, case.options)
    assert isinstance(u, Stop) and u.stopped.cause == Cause.USER_ERROR  # the contrast


def test_no_checkpoint_that_verifies_holds_the_job_with_its_own_cause(tmp_path):
    files = StartFiles(RunDir(tmp_path), "41", 0)
    detail = "checkpoint_last.pt failed (CRC32 mismatch) and no interval checkpoint verifies"
    for task, kind in ((0, Hold), (1, Stop)):
        where = Where(files, task, HOSTS, 2, node=HOSTS[task])
        ev = EndEvidence(Ending.NO_GOOD_CHECKPOINT, where, 1.0, detail=detail)
        t = restart_policy.after_end(ev, case_options())
        assert isinstance(t, kind) and t.cause == Cause.CHECKPOINT and detail in t.why
        assert "`scontrol release 41`" in t.why and "user error" not in t.why


def case_options():
    return end_case(Path("/nonexistent"), Cause.FINISHED, "requeue").options


def test_the_evidence_reads_reports_said_on_stderr_and_every_nodes_probe(tmp_path, monkeypatch):
    """A real run dir: n2's rank could not write its report (the save dir full) and said it on
    stderr; n2's launcher put it and its probe in its exit record; task 0 (n1) has its own
    probe in memory and the ledger's last checkpoint size. The evidence holds all of it, the
    policy holds the job, naming the bytes a checkpoint needs."""
    run = RunDir(tmp_path)
    files = StartFiles(run, "41", 0)
    ledger.record(run.ledger, Kind.CHECKPOINT, "41", 0, update=40, bytes=4_200_000)
    said = FailureRecord(1, 40, "CheckpointWriteError", "a background checkpoint write failed",
                         errno.ENOSPC, str(tmp_path / "checkpoint_1_50.pt"), node="n2")  # fmt: skip
    full = Probe("n2", tmp_path, 8192, 3, errno.ENOSPC, "OSError: [Errno 28]")
    failures.write_exit(files, NodeExit(0, "n1", 1, 1, 1))
    failures.write_exit(files, NodeExit(1, "n2", 1, 1, 1, (asdict(said),), asdict(full)))
    mine = Probe("n1", tmp_path, 8192, 3, errno.ENOSPC, "OSError: [Errno 28]")
    monkeypatch.setattr(end_evidence, "EVIDENCE_WAIT_S", 0.3)
    where = Where(files, 0, HOSTS, 2, node="n1")
    ev = end_evidence.at_exit(where, Ended(1, False, probe=mine), (), 100)
    assert [(f.rank, f.errno) for f in ev.failures] == [(1, errno.ENOSPC)]
    assert [p.node for p in ev.probes] == ["n1", "n2"] and ev.needed == 4_200_000
    opt = replace(case_options(), in_job=False)
    t = restart_policy.after_end(ev.answered(end_case(tmp_path, Cause.FINISHED, "requeue")
                                             .evidence.slurm), opt)  # fmt: skip
    assert isinstance(t, Hold), t
    assert "is full (ENOSPC): 8 kB free" in t.why and "a checkpoint needs 4.2 MB" in t.why


def test_an_exit_record_the_save_dir_refuses_is_said_instead(tmp_path, capsys):
    files = StartFiles(RunDir(tmp_path / "gone" / "x"), "41", 0)
    (tmp_path / "gone").write_text("a file where the run dir's parent should be")
    failures.write_exit(files, NodeExit(0, "n1", 1))
    assert "exit record not written" in capsys.readouterr().err


def test_lfs_quota_in_words_and_unknown_by_name_without_lfs(monkeypatch, tmp_path):
    """``lfs quota -q -u`` lines as FSx for Lustre prints them (kbytes, quota, limit, grace,
    files, ...; a ``*`` marks one over its limit); no ``lfs`` here: said unknown, never 0."""
    assert storage.lfs_quota("/fsx 1048576* 0 1048576 - 12 0 0 -") == (
        "quota 1.07 GB used of 1.07 GB"
    )
    assert storage.lfs_quota("/fsx 2048 0 0 - 3 0 0 -") == "no quota set (2.1 MB used)"
    assert storage.lfs_quota("garbage").startswith("quota unknown (`lfs quota` said")
    monkeypatch.setenv("PATH", str(tmp_path))  # no lfs on it
    assert storage.quota(tmp_path) == failures.QUOTA_UNKNOWN
    assert storage.probe(tmp_path, "n1").quota == failures.QUOTA_UNKNOWN


def test_a_save_dir_that_does_not_answer_fails_the_probe_in_time(monkeypatch, tmp_path):
    """A Lustre client blocked on its servers: the probe gives up after its timeout (the look
    stood in for by one that blocks: a hung statvfs cannot be made without a hung client)."""
    import threading

    stuck = threading.Event()
    monkeypatch.setattr(storage, "_look", lambda *a: stuck.wait(5) and None)
    found = storage.probe(tmp_path, "n1", timeout=0.2)
    stuck.set()
    assert found.fails(None) and "no answer" in (found.error or "")


def test_checkpoint_bytes_from_the_ledger_else_the_file(tmp_path):
    last = tmp_path / "checkpoint_last.pt"
    assert failures.checkpoint_bytes([], last) is None
    last.write_bytes(b"x" * 300)
    assert failures.checkpoint_bytes([], last) == 300
    save = ledger.Event(Kind.CHECKPOINT, 1.0, "41", 0, {"bytes": 4_200_000})
    assert failures.checkpoint_bytes([save], last) == 4_200_000


class ReadOnlyRank(launcher.Launcher):
    """torchrun stood in for by one rank (no fairseq: the launcher's side is what is tried)
    that makes the save dir read-only under itself (a read-only bind stacked over it, as the
    local cluster's test does), fails a real checkpoint write there with EROFS and reports it
    as a worker does (``worker.crash.report``: the report cannot be written, so it is said on
    stderr), then exits 1."""

    fs = None

    def torchrun_command(self, start, nproc, args):
        save = self.spec.training.save_dir
        body = (
            "import subprocess, sys; from pathlib import Path\n"
            "from hpc_core.rundir import RunDir; from hpc_train.worker import crash\n"
            f"subprocess.run(['mount', '--bind', '-o', 'ro', {str(self.fs.backing)!r}, "
            f"{str(self.fs.root)!r}], check=True)\n"
            "try:\n"
            f"    Path({str(save / 'checkpoint_1_20.pt')!r}).write_bytes(b'x')\n"
            "except OSError as err:\n"
            f"    crash.report(RunDir(Path({str(save)!r})), ('41', 0), 0, err, 20)\n"
            "sys.exit(1)\n"
        )
        return [sys.executable, "-c", body]


def test_a_launcher_on_a_read_only_save_dir_holds_the_job_from_its_own_evidence(
    small_fs, fake_slurm, monkeypatch, capfd
):
    """The save dir goes read-only while the rank trains: no file can be written there (the
    rank's report, the exit record, the ledger, the round's verdict: each said on stderr
    instead), and task 0 still holds the job, from what it has in memory: its rank's report
    said on stderr and its own probe of the save dir."""
    fs = small_fs("4m")
    fs.stacked += 1  # the stand-in stacks a read-only bind: the fixture takes it off
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    save = fs.root / "run"
    save.mkdir()
    ReadOnlyRank.fs = fs
    spec = JobSpec(Training("tiny", Path("/d"), save), sizing=Sizing(gpus_per_node=0))
    with pytest.raises(RuntimeError, match="read-only"):
        ReadOnlyRank(spec).run(launcher.Start("41", 0, 1, "n1", 0, ("n1",)), gpus=0)
    ((job, reason),) = fake_slurm.held
    assert job == "41" and fake_slurm.requeued == [] and fake_slurm.drained == []
    assert reason.startswith(f"hpc-train: storage: {save} is read-only (EROFS): ")
    assert "quota unknown" in reason and "`scontrol release 41` resumes it" in reason
    err = capfd.readouterr().err
    assert "failure report not written" in err and "exit record not written" in err


def test_a_start_with_no_checkpoint_that_verifies_is_held_not_trained_from_scratch(
    tmp_path, fake_slurm, monkeypatch
):
    """Only a damaged checkpoint_last.pt in the save dir (no interval checkpoint): task 0 sets
    it aside and holds the job (cause ``bad checkpoint``) before torchrun; no fresh start."""
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    save = tmp_path / "run"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(b"PK\x03\x04 not a whole archive")
    spec = JobSpec(Training("tiny", Path("/d"), save), sizing=Sizing(gpus_per_node=0))
    with pytest.raises(RuntimeError, match="no checkpoint verifies"):
        launcher.Launcher(spec).run(launcher.Start("41", 0, 1, "n1", 0, ("n1",)), gpus=0)
    ((job, reason),) = fake_slurm.held
    assert job == "41" and "`scontrol release 41`" in reason and fake_slurm.requeued == []
    events = ledger.read(RunDir(save).ledger)
    assert [e.kind for e in events if e.kind in (Kind.STARTED, Kind.SET_ASIDE)] == [Kind.SET_ASIDE]
    assert [e.get("cause") for e in events if e.kind == Kind.STOPPED] == [Cause.CHECKPOINT]
    assert len(RunDir(save).set_aside_files()) == 1
