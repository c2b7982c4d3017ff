"""The rehearsal helpers of ``hpc_train.testing`` (what integration tests and benchmarks wait on):
a real train.log and a real ledger written by a thread while they wait; no cluster."""

from __future__ import annotations

import json
import threading

import pytest

from hpc_core import ledger
from hpc_core.rundir import RunDir
from hpc_core.wait import FAST
from hpc_train import testing


def train_line(n: int) -> str:
    payload = {"epoch": 1, "loss": "9.5", "num_updates": f"{n}"}
    return f"2026-11-22 02:27:00 | INFO | train_inner | {json.dumps(payload)}\n"


def later(seconds: float, action) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_wait_for_update_returns_once_the_update_is_logged(tmp_path):
    run = RunDir(tmp_path)
    run.train_log.write_text("".join(train_line(n) for n in range(1, 4)))

    def more() -> None:
        with run.train_log.open("a") as fh:
            fh.write("".join(train_line(n) for n in range(4, 8)))

    timer = later(0.2, more)
    assert testing.wait_for_update(run, 6, timeout=10, backoff=FAST) == 7
    timer.join()
    with pytest.raises(TimeoutError, match="update 50"):
        testing.wait_for_update(run, 50, timeout=0.3, backoff=FAST)


def test_wait_for_event_returns_the_first_matching_event(tmp_path):
    run = RunDir(tmp_path)
    ledger.record(run.ledger, "first_update", "9", 0, update=1)
    timer = later(0.2, lambda: ledger.record(run.ledger, "first_update", "9", 1, update=21))
    found = testing.wait_for_event(
        run, "the resume", lambda e: e.kind == "first_update" and e.restart > 0, 10, FAST
    )
    timer.join()
    assert (found.restart, found.get("update")) == (1, 21)


def test_a_match_that_raises_gives_up_at_once(tmp_path):
    run = RunDir(tmp_path)
    ledger.record(run.ledger, "finished", "9", 0)

    def resumed(e: ledger.Event) -> bool:
        if e.kind == "finished":
            raise RuntimeError("ended without a resume")
        return False

    with pytest.raises(RuntimeError, match="without a resume"):
        testing.wait_for_event(run, "the resume", resumed, 10, FAST)
