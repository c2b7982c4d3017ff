"""torchrun's failure summary, as it prints it (captured from torch 2.13's torchrun with one of
two local ranks SIGKILLed), and the launcher's pass-through of its stderr."""

from __future__ import annotations

import io
import subprocess
import sys

from hpc_train.faults import agent_exit
from hpc_train.faults.agent_exit import NodeExit

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
    survivor = agent_exit.NodeExit(0, "n1", 1, 0, -6)
    assert survivor.killed() is None
    assert agent_exit.NodeExit(1, "n2", 1, 2, -9).killed() == "rank 2 on n2 was killed (SIGKILL)"


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
