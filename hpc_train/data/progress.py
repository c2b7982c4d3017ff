"""Progress of a long step: a bar with the rate and ETA redrawn in place on a terminal, plain
periodic lines when the output is a file or a pipe (a Slurm job log, ``--follow``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

TTY_EVERY_S = 0.2
PLAIN_EVERY_S = 10.0
BAR_WIDTH = 24


def duration(seconds: float) -> str:
    """``0:07``, ``12:05``, ``3:02:09``."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def rate(per_second: float) -> str:
    """``950``, ``61.2k``, ``1.3M``."""
    if per_second >= 1e6:
        return f"{per_second / 1e6:.1f}M"
    if per_second >= 1e4:
        return f"{per_second / 1e3:.1f}k"
    return f"{per_second:.0f}"


def status(label: str, done: int, total: int, elapsed: float, unit: str = "lines") -> str:
    """``train: 812,345/1,801,350 lines (45%), 61.2k lines/s, ETA 0:16``."""
    speed = done / elapsed if elapsed > 0 else 0.0
    text = f"{label}: {done:,}/{total:,} {unit}"
    if total > 0:
        text += f" ({100 * done // total}%)"
    text += f", {rate(speed)} {unit}/s"
    if done >= total:
        return f"{text}, took {duration(elapsed)}"
    if speed > 0:
        text += f", ETA {duration((total - done) / speed)}"
    return text


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    filled = width if total <= 0 else min(width, width * done // total)
    return "[" + "#" * filled + "." * (width - filled) + "]"


class Progress:
    """Call ``advance(n)`` as work gets done and ``finish()`` at the end."""

    def __init__(
        self,
        label: str,
        total: int,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        every: float | None = None,
    ) -> None:
        self.label, self.total, self.done = label, total, 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.clock = clock
        self.every = every if every is not None else (TTY_EVERY_S if self.tty else PLAIN_EVERY_S)
        self.start = self.last = clock()

    def advance(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            self._show(now)

    def finish(self) -> None:
        self._show(self.clock(), end=True)

    def _show(self, now: float, end: bool = False) -> None:
        text = status(self.label, self.done, self.total, now - self.start)
        if self.tty:
            self.stream.write(f"\r[data] {bar(self.done, self.total)} {text}\033[K")
            self.stream.write("\n" if end else "")
        else:
            self.stream.write(f"[data] {text}\n")
        self.stream.flush()
