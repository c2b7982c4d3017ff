import os
import signal

from hpc_train.worker import preemption


def test_usr2_only_sets_the_flag_and_records_the_signal():
    preemption._notice.update(at=None, why=None)
    preemption.install_handler()
    try:
        assert not preemption.notice_received()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert preemption.notice_received()
        assert preemption._notice["why"] == "SIGUSR2"
        assert preemption.agree("cpu", 7) == (True, 7)  # alone: the local values
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        preemption._notice.update(at=None, why=None)


def test_a_notice_the_launcher_recorded_is_taken_once_and_only_when_recorded(tmp_path):
    """The rank's handler missed the notice (torchrun started it with USR2 ignored): the
    launcher's record at ``pending`` is the notice."""
    pending = tmp_path / "notice-7-0.json"
    preemption._notice.update(at=None, why=None)
    try:
        assert not preemption.notice_recorded(pending) and not preemption.notice_received()
        assert not preemption.notice_recorded(None)
        pending.write_text("{}")
        assert preemption.notice_recorded(pending) and preemption.notice_received()
        assert "recorded by the launcher" in preemption._notice["why"]
        assert not preemption.notice_recorded(pending)  # known already: taken once
    finally:
        preemption._notice.update(at=None, why=None)
