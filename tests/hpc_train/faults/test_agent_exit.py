"""torchrun's failure summary, as it prints it (captured from torch 2.13's torchrun with one of
two local ranks SIGKILLed), and the launcher's pass-through of its stderr."""

from __future__ import annotations

import io
import subprocess
import sys

from hpc_train.faults import agent_exit

SUMMARY = """\
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
/tmp/selfkill.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_17:38:41
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 16439)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 16439
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_17:38:41
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 16440)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 16440
=======================================================
"""


def test_the_root_cause_is_read_not_the_other_failures():
    assert agent_exit.root_cause(SUMMARY.splitlines()) == (1, -9)
    assert agent_exit.root_cause(["no summary at all"]) is None


def test_the_tee_passes_every_line_through_and_keeps_the_summary():
    out = io.StringIO()
    with agent_exit.Tee(out) as tee:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.stderr.write({SUMMARY!r} + 'no newline')"],
            stderr=tee.file,
        )
        tee.start()
        assert proc.wait() == 0
        assert tee.finish(timeout=10) == (1, -9)
    assert out.getvalue() == SUMMARY + "no newline"


def test_a_stopped_launcher_never_blocks_a_rank_writing_to_stderr():
    """The launcher's copying thread does not run (as when its launcher is SIGSTOPped): a
    writer of 1 MiB to stderr still ends (a pipe would block it at 64 KiB), and every byte
    reaches the task log once the copying resumes."""
    out = io.StringIO()
    line = "x" * 1023 + "\n"
    with agent_exit.Tee(out) as tee:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys\nfor _ in range(1024): sys.stderr.write({line!r})"],
            stderr=tee.file,
        )
        assert proc.wait(timeout=60) == 0  # nobody has read a byte yet
        tee.start()
        assert tee.finish(timeout=10) is None
    assert out.getvalue() == line * 1024
