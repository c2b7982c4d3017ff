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
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stderr.write({SUMMARY!r})"],
        stderr=subprocess.PIPE,
    )
    out = io.StringIO()
    tee = agent_exit.Tee(proc.stderr, out).start()
    assert proc.wait() == 0
    assert tee.root_cause(timeout=10) == (1, -9)
    assert out.getvalue() == SUMMARY
