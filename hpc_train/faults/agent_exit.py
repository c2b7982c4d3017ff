"""How torchrun ended on this node: its exit status and the rank it names as the root cause.

A worker killed by a signal (the OOM killer, ``kill -9``, a lost GPU) leaves no Python report;
only its torchrun agent saw it die, and says so on stderr in its failure summary::

    Root Cause (first observed failure):
    [0]:
      ...
      rank      : 1 (local_rank: 1)
      exitcode  : -9 (pid: 16440)  (SIGKILL)

The launcher passes torchrun's stderr through (``Tee``: every line still reaches the task log,
by way of a file that never blocks a writer) and keeps that record, and the failure reports its
ranks could not write to the save dir and said on stderr instead (``Tee.failures``). Each node's
launcher writes it in its exit record (``faults.failures.NodeExit``); task 0 reads them all with
the rest of a start's end (``hpc_train.faults.end_evidence``). An agent that is itself killed
says nothing: its launcher's exit status for torchrun is the record then.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import threading
from collections.abc import Iterable
from typing import IO

from hpc_train.contract import FAILURE_LINE, FailureRecord, failure_of_line

ROOT = "Root Cause (first observed failure):"
RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)")
EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def root_cause(lines: Iterable[str]) -> tuple[int, int] | None:
    """(rank, exit code) of torchrun's root-cause record in its stderr lines (pure)."""
    inside, rank = False, None
    for line in lines:
        if ROOT in line:
            inside, rank = True, None
            continue
        if not inside:
            continue
        if (m := RANK_RE.match(line)) is not None:
            rank = int(m.group(1))
        elif (m := EXIT_RE.match(line)) is not None and rank is not None:
            return rank, int(m.group(1))
    return None


class Tee:
    """torchrun's stderr, copied to ``out`` line by line, the failure summary kept.

    torchrun and its ranks write to a file (``file``: pass it as ``stderr``), never to a pipe: a
    pipe holds 64 KiB, and a launcher that is stopped (a stuck agent, SIGSTOP) or slow would
    block every rank that writes more than that to stderr (seen: rank 0 stalled at update 249
    behind a stopped launcher). A thread follows the file; ``finish`` reads what is left once
    torchrun has exited. The file is unlinked from the start (a ``TemporaryFile``)."""

    KEEP = 200  # lines kept from the ``Root Cause`` line on
    POLL_S = 0.2  # how often the thread looks for new lines at the end of the file

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.kept: list[str] = []
        # this node's ranks' failure reports that could not be written to the save dir and were
        # said on stderr instead (``contract.failure_line``): evidence that needs no file there
        self.failures: list[FailureRecord] = []
        self.file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        # a second open file description: its own offset, while the writers append
        self._reader = open(f"/proc/self/fd/{self.file.fileno()}", "rb")  # noqa: SIM115
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._copy, name="torchrun-stderr", daemon=True)

    def __enter__(self) -> Tee:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Tee:
        self._thread.start()
        return self

    def _copy(self) -> None:
        partial = b""
        while True:
            # looked at before the read: after the end, an empty read means all was copied
            ended = self._ended.is_set()
            try:
                chunk = self._reader.readline()
            except ValueError:  # closed by close() with a backlog still being copied
                break
            if chunk:
                partial += chunk
                if partial.endswith(b"\n"):
                    self._line(partial.decode(errors="replace"))
                    partial = b""
            elif ended:
                break
            else:
                self._ended.wait(self.POLL_S)
        if partial:
            self._line(partial.decode(errors="replace"))

    def _line(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed task log loses the copy only
            self.out.write(line)
            self.out.flush()
        if ROOT in line or (self.kept and len(self.kept) < self.KEEP):
            self.kept.append(line)
        if FAILURE_LINE in line and (record := failure_of_line(line)) is not None:
            self.failures.append(record)

    def finish(self, timeout: float) -> tuple[int, int] | None:
        """Once torchrun has exited: copy what is left (at most ``timeout`` seconds) and return
        the root-cause record, if torchrun wrote one."""
        self._ended.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return root_cause(list(self.kept))

    def close(self) -> None:
        self.finish(timeout=1.0)
        self._reader.close()
        self.file.close()
