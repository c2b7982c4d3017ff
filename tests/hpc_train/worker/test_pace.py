"""``chaos JOB pace --seconds S``: the file the CLI writes, the rank's per-update sleep (a fake
clock: milliseconds), and a real fairseq training loop paced (tiny model, one CPU process)."""

from __future__ import annotations

from datetime import datetime

import pytest

from hpc_core.rundir import RunDir
from hpc_train import chaos, contract
from hpc_train.worker import pace


class Clock:
    """A fake monotonic clock: ``sleep`` advances it; ``work`` is an update's compute."""

    def __init__(self) -> None:
        self.now, self.slept = 100.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def work(self, seconds: float) -> None:
        self.now += seconds


def _run(tmp_path) -> RunDir:
    run = RunDir(tmp_path)
    run.state.mkdir(parents=True)  # a run dir (what `chaos` resolves a save dir argument to)
    return run


def test_the_cli_asks_a_pace_and_zero_stops_it(tmp_path, capsys):
    run = _run(tmp_path)
    assert contract.pace_s(run) == 0.0
    assert chaos.main([str(tmp_path), "pace", "--seconds", "0.25"]) == 0
    assert contract.pace_s(run) == 0.25
    assert "updates take at least 0.25 s each" in capsys.readouterr().out
    assert chaos.main([str(tmp_path), "pace", "--seconds", "0"]) == 0
    assert not run.chaos_pace.exists() and contract.pace_s(run) == 0.0


@pytest.mark.parametrize("bad", ["-1", "fast", "7200"])
def test_a_bad_pace_is_one_line_and_exit_2(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exit_:
        chaos.main([str(tmp_path), "pace", "--seconds", bad])
    assert exit_.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_each_update_sleeps_what_its_compute_left_of_the_pace(tmp_path):
    run, clock = _run(tmp_path), Clock()
    paced = pace.Pace(run, clock=clock, sleep=clock.sleep)
    assert paced() == 0.0  # no pace asked
    contract.ask_pace(run, 0.5)
    clock.work(0.1)
    assert paced() == pytest.approx(0.4)  # 0.1 s of compute, 0.4 s of sleep
    clock.work(0.7)
    assert paced() == 0.0  # an update slower than the pace: no sleep
    clock.work(0.2)
    assert paced() == pytest.approx(0.3)
    contract.ask_pace(run, 0)  # withdrawn mid-run: the next update is not slowed
    clock.work(0.01)
    assert paced() == 0.0
    assert clock.slept == pytest.approx([0.4, 0.3])


def test_the_first_update_of_a_start_is_not_slowed(tmp_path):
    run, clock = _run(tmp_path), Clock()
    contract.ask_pace(run, 2.0)
    assert pace.Pace(run, clock=clock, sleep=clock.sleep)() == 0.0 and clock.slept == []


def test_a_garbled_pace_is_no_pace(tmp_path):
    run = _run(tmp_path)
    run.chaos_pace.write_text('{"seconds": "soon"}')
    assert contract.pace_s(run) == 0.0


@pytest.mark.fairseq
def test_fairseqs_own_loop_is_paced(tmp_path, corpus, tiny_run):
    """Real fairseq (tiny, one CPU process, ~30 updates/s unpaced): paced at 0.3 s, its log
    spans >= 0.3 s an update (train_inner's time stamps, to the millisecond; one gap may be
    shorter by the difference of two updates' compute: the log line comes before the sleep)."""
    run = RunDir(tmp_path / "paced")
    contract.ask_pace(run, 0.3)
    tiny_run(corpus, run.root, 8, "--log-interval", "1", "--save-interval-updates", "100")
    stamps = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for line in run.train_log.read_text().splitlines()
        if "| train_inner |" in line
    ]
    assert len(stamps) == 8
    assert stamps[-1] - stamps[1] >= 6 * 0.3 - 0.05, stamps  # the first update: no sleep
