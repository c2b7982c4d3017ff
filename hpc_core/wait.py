"""One way to wait for something: poll with back-off until it holds or a deadline passes. Pure
but for the sleep, which callers (and tests) may replace."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delays between polls: ``first``, then times ``factor`` each poll, never above ``most``."""

    first: float = 0.2
    factor: float = 1.5
    most: float = 5.0

    def delays(self) -> Iterator[float]:
        delay = self.first
        while True:
            yield delay
            delay = min(self.most, delay * self.factor)

    def delay(self, n: int) -> float:
        """The ``n``-th delay (0: ``first``), as ``delays`` yields them."""
        return min(self.most, self.first * self.factor ** max(0, n)) if n else self.first


FAST = Backoff(0.1, 1.5, 1.0)  # things that happen within seconds (a file, a process exit)
# A node waiting on another node's word at a start's end or its next start (task 0's verdict
# or decision, the nodes' exit records and reports): at most a quarter second late, whatever the
# node count (with FAST, the last of N nodes to look was up to 1 s late, later the more nodes);
# one open a poll, 4 a second a node while it waits, seconds: 256/s at 64 nodes, for seconds.
WORD = Backoff(0.1, 1.5, 0.25)


def process_exited(pid: int) -> bool:
    """True once ``pid`` has exited (zombie or gone), without reaping it.

    Inside a signal handler that interrupted ``Popen.wait()``, ``Popen.poll()`` always answers
    None: the interrupted wait holds the lock poll needs. /proc does not. A stopped agent never
    reaps its children: they stay zombies, and count as exited here.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rpartition(")")[2].split()[0] in {"Z", "X"}


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R, S, D, T stopped, Z zombie), "" when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return ""


def wait_until(
    check: Callable[[], T | None],
    what: str,
    timeout: float | None = None,
    backoff: Backoff = Backoff(),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``check`` until it returns something other than None/False; return that.

    Raises TimeoutError naming ``what`` once ``timeout`` seconds have passed (None: wait forever).
    """
    deadline = None if timeout is None else clock() + timeout
    for delay in backoff.delays():
        result = check()
        if result is not None and result is not False:
            return result
        if deadline is not None:
            left = deadline - clock()
            if left <= 0:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
            delay = min(delay, left)
        sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover - delays() never ends
