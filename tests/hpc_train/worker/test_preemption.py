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
