"""The failure policy: what a crash was, and when retrying stops (pure, and the worker's files)."""

from __future__ import annotations

import pytest

from hpc_core.rundir import RunDir
from hpc_train.contract import Cause, StartFiles
from hpc_train.faults import failures
from hpc_train.faults.failures import Failure, NodeExit
from hpc_train.launch import restart_policy
from hpc_train.launch.restart_policy import Action


@pytest.mark.parametrize(
    ("exc_type", "message", "cause"),
    [
        ("DistBackendError", "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", Cause.INFRASTRUCTURE),
        ("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer", Cause.INFRASTRUCTURE),
        ("RuntimeError", "CUDA error: an illegal memory access was encountered", Cause.INFRASTRUCTURE),
        ("FloatingPointError", "Minimum loss scale reached (0.0001).", Cause.USER_ERROR),
        ("KeyError", "'encoder.layers.12.weight'", Cause.USER_ERROR),
        ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", Cause.USER_ERROR),
        ("InjectedCrash", "chaos: crash injected at update 30 on rank 0", Cause.USER_ERROR),
    ],
)  # fmt: skip
def test_classify(exc_type, message, cause):
    assert failures.classify(exc_type, message) == cause


def test_the_user_error_explains_a_start_not_the_peers_it_took_down():
    peer = Failure(1, 30, "RuntimeError", "Connection closed by peer")
    raised = Failure(0, 30, "ValueError", "bad batch")
    assert failures.first([peer, raised]) == raised
    assert failures.first([]) is None


def test_the_same_error_at_the_same_update_twice_is_repeated_anything_else_is_not():
    bug = Failure(0, 30, "ValueError", "bad batch")
    assert failures.repeated([bug], [Failure(1, 30, "ValueError", "bad batch")]) == bug
    assert failures.repeated([bug], [Failure(0, 31, "ValueError", "bad batch")]) is None
    assert failures.repeated([bug], []) is None
    flaky = Failure(0, 30, "RuntimeError", "NCCL timeout")
    assert failures.repeated([flaky], [flaky]) is None  # infrastructure: retried, with exclusion


def test_reports_round_trip_and_a_cut_report_is_no_evidence(tmp_path):
    run = RunDir(tmp_path)
    failures.write(run, "41", 0, Failure(0, 30, "ValueError", "bad batch"))
    run.failure_report("41", 0, 1).write_text('{"rank": 1, "upd')
    assert failures.read(StartFiles(run, "41", 0)) == [Failure(0, 30, "ValueError", "bad batch")]
    assert failures.read(StartFiles(run, "41", 1)) == []


def test_a_repeated_user_error_stops_the_run_an_infrastructure_crash_requeues():
    bug = (Cause.USER_ERROR, "ValueError: bad batch (rank 0, update 30)")
    stop = restart_policy.after_exit(1, False, 0, 1, 20, crash=bug, repeated=True)
    assert stop.action is Action.FAIL and stop.cause == Cause.USER_ERROR
    assert "same error at the same update" in stop.why and "bad batch" in stop.why
    once = restart_policy.after_exit(1, False, 0, 0, 20, crash=bug)
    assert once.action is Action.RESTART and once.cause == Cause.USER_ERROR
    infra = restart_policy.after_exit(
        1, False, 0, 1, 20, crash=(Cause.INFRASTRUCTURE, "NCCL timeout")
    )
    assert infra.action is Action.RESTART and infra.cause == Cause.INFRASTRUCTURE


def test_what_counts_as_killed():
    assert NodeExit(0, "n1", -9).killed() == "torchrun on n1 was killed (SIGKILL)"
    assert NodeExit(0, "n1", 1, 3, -9).killed() == "rank 3 on n1 was killed (SIGKILL)"
    assert NodeExit(0, "n1", -15).killed() is None  # Slurm ended the step
    assert NodeExit(0, "n1", 1, 0, -15).killed() is None  # its agent stopped it
    assert NodeExit(0, "n1", 1, 0, 1).killed() is None  # a Python exception: its report says


def test_a_rank_that_aborted_itself_was_not_killed():
    """A peer's rank aborting on the lost connection (SIGABRT, its own) is no kill: the one node
    whose torchrun was SIGKILLed still stands out (seen on the local Slurm: the survivor's root
    cause exited -6)."""
    survivor = NodeExit(0, "n1", 1, 0, -6)
    assert survivor.killed() is None
    assert NodeExit(1, "n2", 1, 2, -9).killed() == "rank 2 on n2 was killed (SIGKILL)"
