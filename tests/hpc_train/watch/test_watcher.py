"""The one watcher base: a look every interval, a stop that wakes the thread at once, the
result ``stop()`` returns. Real threads, intervals of milliseconds."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

from hpc_train.watch.watcher import Watcher

ROOT = Path(__file__).resolve().parents[3]
# the threads not a Watcher: faults sits below watch (the import layers); the copy of torchrun's
# stderr must drain the file after torchrun's end, where a Watcher's stop ends at once; the
# storage probe's look may block on a hung file system for good (a daemon thread left behind)
NOT_A_WATCHER = {"hpc_train/faults/agent_exit.py", "hpc_train/faults/storage.py"}


class Counter(Watcher[int]):
    def __init__(self, interval: float, done_at: int = 0, first_wait: bool = True) -> None:
        super().__init__("counter", interval)
        self.first_wait, self.done_at, self.ticks = first_wait, done_at, 0
        self.ticked = threading.Event()

    def tick(self) -> bool:
        self.ticks += 1
        self.ticked.set()
        return self.ticks == self.done_at

    def result(self) -> int:
        return self.ticks


def test_it_ticks_every_interval_until_a_tick_says_done():
    watcher = Counter(0.01, done_at=3).start()
    watcher.join(5)
    assert not watcher.is_alive() and watcher.stop() == 3


def test_stop_wakes_a_long_interval_at_once_and_returns_the_result():
    watcher = Counter(60.0).start()
    began = time.monotonic()
    assert watcher.stop() == 0  # the first tick waits one interval: none yet
    assert time.monotonic() - began < 5 and not watcher.is_alive()


def test_without_first_wait_the_first_tick_comes_at_once():
    watcher = Counter(60.0, first_wait=False).start()
    assert watcher.ticked.wait(5)
    assert watcher.stop() == 1


def test_begin_false_ends_the_watch_before_any_tick():
    class Off(Counter):
        def begin(self) -> bool:
            return False

    watcher = Off(0.01)
    watcher.loop()  # in this thread: returns at once
    assert watcher.ticks == 0


def threads_made() -> list[str]:
    """Where the toolkit makes a ``threading.Thread`` itself (``Thread(...)``)."""
    found = []
    for path in sorted((ROOT / "hpc_train").rglob("*.py")):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), where)):
            func = node.func if isinstance(node, ast.Call) else None
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "Thread":
                found.append(where)
    return found


def test_every_thread_of_the_launcher_is_started_through_the_watcher_base():
    """Pulse, the spot watch, the hang, straggler and grow monitors, the release of left-out
    nodes: each a ``Watcher`` (start, stop, naming, daemon), none a thread of its own."""
    made = threads_made()
    assert "hpc_train/watch/watcher.py" in made  # the scan sees the base's own thread
    assert set(made) - {"hpc_train/watch/watcher.py"} == NOT_A_WATCHER
