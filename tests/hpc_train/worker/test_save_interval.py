"""``--save-interval auto``: Daly's interval from the run's own figures."""

from __future__ import annotations

import math
import os
import re

import pytest

from hpc_train.contract import SAVE_INTERVAL_AUTO, WorkerEnv
from hpc_train.job.spec import JobSpec, Saves, SpecError, Training, parse_save_interval, validate
from hpc_train.planning import plan
from hpc_train.worker import save_interval
from hpc_train.worker.save_interval import AutoInterval


def test_interval_in_updates_is_dalys_interval_over_the_update_time():
    # C = 2 s, M = 3600 s: Young sqrt(2*2*3600) = 120 s; Daly: 120 * (1 + sqrt(1/3600)/3 +
    # (1/3600)/9) - 2 = 118.67 s; at 0.5 s per update: 237 updates
    assert plan.daly_interval(2, 3600) == pytest.approx(118.67, abs=0.01)
    assert save_interval.interval_updates(2, 0.5, 3600) == 237
    assert save_interval.interval_updates(0.0, 10.0, 3600) == 1  # never below one update


def test_rank_0_proposes_at_its_first_timed_update_and_after_each_save_only():
    said: list[str] = []
    auto = AutoInterval(mtbf_s=3600, estimated_save_s=2.0, log=said.append)
    auto.completed(0.0)  # the first update: nothing timed yet (start-up)
    assert auto.proposal() == 0
    auto.step_ended(0.0, 1.0, saved=False)
    auto.completed(1.5)  # one update of 0.5 s
    assert auto.proposal() == 237  # the estimate: C = 2 s
    auto.step_ended(1.5, 1.6, saved=False)
    auto.completed(2.1)
    assert auto.proposal() == 0  # between saves the interval holds
    auto.step_ended(2.1, 2.6, saved=True)  # a save point measured: 0.5 s
    auto.completed(3.1)
    expected = round(plan.daly_interval(0.5, 3600) / 0.5)
    assert auto.proposal() == expected < 237
    assert said[0].startswith("save interval: every 237 updates") and "estimated" in said[0]
    assert f"every {expected} updates" in said[1] and "measured" in said[1]


def test_only_rank_0_under_auto_gets_a_chooser():
    inputs = WorkerEnv.from_env({SAVE_INTERVAL_AUTO: "7200:1.5"}).auto_interval
    auto = AutoInterval.for_rank(inputs, 0)
    assert auto is not None and auto.mtbf_s == 7200 and auto.save_s == 1.5
    assert AutoInterval.for_rank(inputs, 3) is None
    assert AutoInterval.for_rank(WorkerEnv.from_env({}).auto_interval, 0) is None


def test_the_launcher_passes_the_job_mtbf_of_this_start(tmp_path):
    spec = JobSpec(
        Training("tiny", tmp_path, tmp_path), saves=Saves(interval="auto", mtbf_hours=100)
    )
    inputs = plan.auto_interval(spec, nodes=4, gpu=False)
    assert inputs is not None
    mtbf, estimate = inputs
    assert mtbf == pytest.approx(25 * 3600) and estimate > 0  # any of 4 nodes ends the start
    assert plan.auto_interval(JobSpec(Training("tiny", tmp_path, tmp_path)), 4, False) is None


def test_save_interval_option_values(tmp_path):
    assert parse_save_interval("AUTO") == "auto" and parse_save_interval("25") == "25"
    for bad in ("0", "-3", "often", ""):
        with pytest.raises(SpecError, match="--save-interval"):
            parse_save_interval(bad)
    spec = JobSpec(Training("tiny", tmp_path, tmp_path), saves=Saves(interval="25"))
    assert spec.save_interval_updates == 25
    assert (
        JobSpec(Training("tiny", tmp_path, tmp_path)).save_interval_updates
        == spec.recipe.save_interval_updates
    )
    with pytest.raises(SpecError, match="--mtbf-hours"):
        validate(
            JobSpec(Training("tiny", tmp_path, tmp_path), saves=Saves(mtbf_hours=0)),
            check_paths=False,
        )


# The times rank 0's chooser reasons about, injected into the worker's process so that a loaded
# machine changes nothing: every update takes 0.1 s, every save point 0.2 s. With a job MTBF of
# 10 s, Daly gives 10 updates from the estimated save (0.05 s), 19 from the measured one.
INJECTED_TIMES = """
from hpc_train.worker.save_interval import AutoInterval

_now = [0.0]
_completed, _step_ended = AutoInterval.completed, AutoInterval.step_ended


def _completed_after_0_1_s(self, now):
    _now[0] += 0.1
    _completed(self, _now[0])


def _step_of_0_2_s_when_saved(self, began, now, saved):
    began = _now[0]
    _now[0] += 0.2 if saved else 0.0
    _step_ended(self, began, _now[0], saved)


AutoInterval.completed = _completed_after_0_1_s
AutoInterval.step_ended = _step_of_0_2_s_when_saved
"""


def test_fairseq_saves_at_the_interval_chosen_from_measured_costs(
    corpus, tmp_path, tiny_run, monkeypatch
):
    """Real fairseq (one CPU process): the interval is set at update 2 from the estimate, then
    from each measured save point, and fairseq saves exactly at its multiples. The update and
    save times are injected (``INJECTED_TIMES``): the intervals do not depend on this
    machine's speed."""
    monkeypatch.setitem(os.environ, SAVE_INTERVAL_AUTO, "10:0.05")  # job MTBF 10 s
    tiny_run(corpus, tmp_path, 40, "--log-interval", "1", prelude=INJECTED_TIMES)
    log = (tmp_path / "train.log").read_text()
    chosen = [
        (m.start(), int(m.group(1)))
        for m in re.finditer(r"save interval: every (\d+) updates", log)
    ]
    assert chosen and "estimated" in log and "measured" in log, log[-3000:]
    saved = [
        (m.start(), int(m.group(1)))
        for m in re.finditer(r"Saved checkpoint \S+checkpoint_\d+_(\d+)\.pt", log)
    ]
    assert saved, log[-3000:]
    for at, update in saved:  # each interval save is a multiple of the interval then in force
        interval = [n for pos, n in chosen if pos < at][-1]
        assert update % interval == 0, (update, interval)
    assert math.isfinite(chosen[-1][1]) and len(saved) >= 2
    assert [n for _, n in chosen] == [10, 19] and [u for _, u in saved] == [10, 19, 38]
