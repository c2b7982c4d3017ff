import json
import os
import signal
import time

import pytest

from hpc_train import contract
from hpc_train.worker import async_save, preemption


@pytest.fixture(autouse=True)
def fresh_notice():
    preemption._notice.update(at=None, why=None, via=None)
    yield
    preemption._notice.update(at=None, why=None, via=None)


def test_usr2_only_sets_the_flag_and_records_the_signal():
    preemption.install_handler()
    try:
        assert not preemption.notice_received()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert preemption.notice_received()
        assert preemption._notice["why"] == "SIGUSR2" and preemption._source() == "SIGUSR2"
        assert preemption.agree("cpu", 7) == (True, 7)  # alone: the local values
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_a_notice_the_launcher_recorded_is_taken_once_and_only_when_recorded(tmp_path):
    """The rank's handler missed the notice (torchrun started it with USR2 ignored, or Slurm
    had not signalled this process yet): the launcher's record at ``pending`` is the notice,
    under the signal's own name, timed from when the launcher got it."""
    pending = tmp_path / "notice-7-0.json"
    assert not preemption.notice_recorded(pending) and not preemption.notice_received()
    assert not preemption.notice_recorded(None)
    contract.record_notice(pending, "SIGUSR2")
    record = contract.read_notice(pending)
    assert record[0] == "SIGUSR2" and abs(record[1] - time.time()) < 60
    assert preemption.notice_recorded(pending) and preemption.notice_received()
    assert preemption._notice["why"] == "SIGUSR2"  # the same name as the handler's
    assert preemption._source() == "SIGUSR2, recorded by the launcher"
    assert time.monotonic() - preemption._notice["at"] >= time.time() - record[1] - 0.01
    assert not preemption.notice_recorded(pending)  # known already: taken once


def test_a_record_that_does_not_say_is_still_a_notice(tmp_path):
    pending = tmp_path / "notice-7-0.json"
    pending.write_text("USR2\n")
    assert contract.read_notice(pending) == (None, None)
    assert preemption.notice_recorded(pending) and preemption._notice["why"] == "SIGUSR2"


@pytest.mark.parametrize(
    "rank0_had, logged",
    [
        ({"why": "SIGUSR2"}, "SIGUSR2"),
        (
            {"why": "SIGUSR2", "via": "recorded by the launcher"},
            "SIGUSR2, recorded by the launcher",
        ),
        ({}, "SIGUSR2, from a peer rank"),
    ],
)
def test_the_stop_marker_names_the_signal_however_rank_0_learnt_of_it(
    tmp_path, monkeypatch, caplog, rank0_had, logged
):
    """CI, 2026-11-27: the launcher's record reached rank 0 before Slurm's own USR2 did, and the
    next start read "saved on notice (SIGUSR2 (recorded by the launcher))". One notice, one name.
    fairseq's save is faked (it needs a whole trainer; the real-Slurm runs make real ones)."""
    import fairseq.checkpoint_utils as checkpoint_utils

    saves: list[int] = []
    monkeypatch.setattr(checkpoint_utils, "save_checkpoint", lambda *a: saves.append(1))
    monkeypatch.setattr(async_save, "flush", lambda: None)
    preemption._notice.update(at=time.monotonic(), **rank0_had)
    trainer = type("Trainer", (), {"data_parallel_rank": 0})()
    marker = tmp_path / "stopped.json"
    caplog.set_level("INFO", "hpc_train.worker.preemption")
    config = type("Config", (), {"checkpoint": None})()
    assert preemption._save_and_stop(config, trainer, None, marker, 42) == ([None], True)
    written = contract.StopMarker(**json.loads(marker.read_text()))
    assert saves == [1] and (written.update, written.signal) == (42, "SIGUSR2")
    assert f"notice ({logged}): saving at update 42" in caplog.text
