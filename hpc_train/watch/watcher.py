"""The one shape of every watcher thread in the launcher: start, stop, and a look every interval.

A ``Watcher`` is a daemon thread that calls ``tick()`` every ``interval`` seconds until ``tick``
says it is done (returns True) or ``stop()`` is called; the loop is the project's one waiting loop
(``hpc_core.wait.wait_until``), its sleep an event that ``stop()`` sets, so a stop wakes the
thread at once. ``stop()`` joins the thread (at most ``join_s()``) and returns ``result()``: what
the watcher found (a hang, an evicted straggler, the width it grew to, a stuck launcher).

The watchers: ``hang_monitor.Monitor``, ``straggler_monitor.StragglerWatch``, ``grow_monitor.GrowWatch``,
``launchers.Pulse``, ``spot.SpotWatcher`` and the launcher's ``launch.release.Release``; the
launcher starts no thread but through this base (tests/hpc_train/watch/test_watcher.py).
"""

from __future__ import annotations

import threading
from typing import Generic, Self, TypeVar

from hpc_core.wait import Backoff, wait_until

R = TypeVar("R")


class Watcher(Generic[R]):
    """A thread calling ``tick()`` every ``interval`` s until it returns True or ``stop()``."""

    first_wait = True  # sleep one interval before the first tick (False: tick at once)

    def __init__(self, name: str, interval: float) -> None:
        self.name, self.interval = name, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.loop, name=name, daemon=True)

    def tick(self) -> bool | None:
        """One look; True ends the watch."""
        raise NotImplementedError

    def begin(self) -> bool:
        """Called once in the thread before the first tick; False ends the watch there."""
        return True

    def result(self) -> R:
        """What ``stop()`` returns: what this watcher found."""
        raise NotImplementedError

    def join_s(self) -> float:
        """How long ``stop()`` waits for a tick in progress to end."""
        return self.interval + 5

    def start(self) -> Self:
        self._thread.start()
        return self

    def loop(self) -> None:
        """The watch itself (in the thread ``start()`` makes, or in the caller's)."""
        if not self.begin():
            return
        waited = not self.first_wait

        def step() -> bool | None:
            nonlocal waited
            if self._stop.is_set():
                return True
            if not waited:  # the first call comes before any sleep
                waited = True
                return None
            return self.tick() or None

        every = Backoff(self.interval, 1.0, self.interval)
        wait_until(step, f"the end of {self.name}", None, every, sleep=self.nap)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def nap(self, seconds: float) -> None:
        """Sleep ``seconds`` or until ``stop()``, whichever comes first."""
        self._stop.wait(seconds)

    def stop(self) -> R:
        """End the thread (a tick in progress may finish, for ``join_s()`` at most); the result."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.join_s())
        return self.result()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()
