"""A rank's crash report and a crash injected by chaos: the worker's side of the failure files
(task 0 reads them through ``hpc_train.faults.failures``). Pure file I/O, milliseconds."""

from __future__ import annotations

import pytest

from hpc_core.rundir import RunDir
from hpc_train.contract import CrashRequest, StartFiles, write_crash_request
from hpc_train.faults import failures
from hpc_train.faults.failures import Failure
from hpc_train.worker import crash


def test_a_worker_reports_its_exception_only_under_a_launcher(tmp_path):
    run = RunDir(tmp_path)
    err = ValueError("bad batch\nmore detail")
    crash.report(run, None, 0, err, 12)  # plain fairseq run: nothing to tell
    assert not (run.state / "failures").exists()
    crash.report(run, ("41", 2), 3, err, 12)
    assert failures.read(StartFiles(run, "41", 2)) == [Failure(3, 12, "ValueError", "bad batch")]
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
