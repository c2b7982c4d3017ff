"""Progress: the arithmetic of the status line; a bar on a terminal, periodic lines otherwise."""

from __future__ import annotations

import io

import pytest

from hpc_train.data import progress


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0:00"), (7.4, "0:07"), (725, "12:05"), (10929, "3:02:09")]
)
def test_duration(seconds, text):
    assert progress.duration(seconds) == text


@pytest.mark.parametrize(("value", "text"), [(950, "950"), (61234, "61.2k"), (1.3e6, "1.3M")])
def test_rate(value, text):
    assert progress.rate(value) == text


def test_status_has_counts_share_rate_and_eta():
    text = progress.status("train", 800_000, 1_800_000, 10.0)
    assert text == "train: 800,000/1,800,000 lines (44%), 80.0k lines/s, ETA 0:12"
    assert (
        progress.status("train", 50, 50, 2.0) == "train: 50/50 lines (100%), 25 lines/s, took 0:02"
    )
    assert progress.status("x", 0, 10, 0.0) == "x: 0/10 lines (0%), 0 lines/s"


def test_bar():
    assert progress.bar(0, 10, 4) == "[....]"
    assert progress.bar(5, 10, 4) == "[##..]"
    assert progress.bar(10, 10, 4) == "[####]"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_at_most_every_interval_then_a_last_one():
    out, clock = io.StringIO(), Clock()
    bar = progress.Progress("train", 100, stream=out, clock=clock, every=10)
    for _ in range(10):
        clock.now += 3
        bar.advance(10)
    bar.finish()
    lines = out.getvalue().splitlines()
    assert lines == [
        "[data] train: 40/100 lines (40%), 3 lines/s, ETA 0:18",
        "[data] train: 80/100 lines (80%), 3 lines/s, ETA 0:06",
        "[data] train: 100/100 lines (100%), 3 lines/s, took 0:30",
    ]


def test_a_terminal_gets_one_line_redrawn():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out, clock = Tty(), Clock()
    bar = progress.Progress("valid", 4, stream=out, clock=clock)
    for _ in range(4):
        clock.now += 1
        bar.advance(1)
    bar.finish()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("took 0:04\x1b[K\n")  # one line at the end
    frames = text.split("\r")[1:]  # redrawn in place: every 0.2 s, and at the end
    assert len(frames) == 5
    assert frames[1].startswith("[data] [" + "#" * 12 + "." * 12 + "] valid: 2/4 lines (50%)")
