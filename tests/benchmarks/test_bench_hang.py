"""The arithmetic of the hang benchmark (pure functions on a hand-made ledger; no cluster)."""

from __future__ import annotations

import pytest

from benchmarks import hang as bench
from benchmarks import report
from hpc_core.ledger import Event

T0 = 1_795_000_000.0  # the SIGSTOP
JOB = "42"


def ev(kind: str, dt: float, restart: int = 0, **data) -> Event:
    return Event(kind, T0 + dt, JOB, restart, data)


# A hang in start 0 declared 11 s after the SIGSTOP with T = 10 s; stacks and reports take 7 s;
# Slurm restarts the job 20 s after the requeue; the first update comes 15 s after that.
LEDGER = [
    ev("started", -60),
    ev("first_update", -50, update=1),
    ev("checkpoint", -5, update=20),
    ev("blamed", 17.9, node="n2", rank=1),
    ev("stopped", 18.0, cause="hang", why="hang: rank 0 on n1: ..."),
    ev("requeued", 18.1, by="task 0"),
    ev("started", 38.1, restart=1),
    ev("first_update", 53.1, restart=1, update=21),
    ev("finished", 80, restart=1),
]
DECLARED = {"node": "n1", "why": "rank 0 on n1: ... (train; allowed 10 s)", "time": T0 + 11,
            "allowance_s": 10.0}  # fmt: skip


def test_hang_figures_are_times_since_the_sigstop_and_multiples_of_t():
    got = bench.hang_figures(LEDGER, T0, DECLARED)
    assert got["allowance_s"] == 10.0 and got["phase"] == "train"
    assert got["detect_s"] == pytest.approx(11.0)
    assert got["detect_over_T"] == pytest.approx(1.1)
    assert got["requeue_s"] == pytest.approx(18.1)
    assert got["requeue_over_T"] == pytest.approx(1.81)
    assert got["resume_s"] == pytest.approx(53.1)
    assert got["resume_over_T"] == pytest.approx(5.31)
    assert got["cause"] == "hang" and got["resumed_at_update"] == 21
    assert got["phases_s"] == {
        "sigstop->declared": 11.0,
        "declared->stopped": 7.0,
        "stopped->requeued": 0.1,
        "requeued->started": 20.0,
        "started->first_update": 15.0,
    }


def test_events_before_the_sigstop_and_of_the_hung_start_are_not_the_resume():
    """The first update of start 0 (before the SIGSTOP) never counts as the resume, nor does a
    first_update of the hung start itself; without a later start there is no resume."""
    no_resume = [e for e in LEDGER if e.restart == 0] + [ev("first_update", 19, update=21)]
    got = bench.hang_figures(no_resume, T0, DECLARED)
    assert got["resume_s"] is None and got["resume_over_T"] is None
    assert got["requeue_s"] == pytest.approx(18.1)


def test_the_allowance_comes_from_the_why_of_an_older_record():
    older = {"why": "rank 0 on n1: no update for 12 s after update 34 (train; allowed 300 s)",
             "time": T0 + 301}  # fmt: skip
    assert bench.allowance_of(older) == 300.0
    assert bench.hang_figures(LEDGER, T0, older)["detect_over_T"] == pytest.approx(301 / 300)
    assert bench.allowance_of({"why": "no figure"}) is None
    assert bench.phase_of(older) == "train" and bench.phase_of({}) is None
    nothing = bench.hang_figures([], T0, {})
    assert nothing["detect_s"] is None and nothing["requeue_over_T"] is None


def test_hangs_declared_counts_only_this_jobs_hang_stops():
    events = [
        ev("stopped", 1, cause="hang"),
        ev("stopped", 2, restart=1, cause="cancelled"),
        Event("stopped", T0 + 3, "7", 0, {"cause": "hang"}),  # another job, same save dir
    ]
    assert bench.hangs_declared(events, JOB) == 1
    assert bench.hangs_declared(events[1:2], JOB) == 0


def test_table_states_the_no_watchdog_figure_as_the_time_limit():
    result = {
        "hang": {**bench.hang_figures(LEDGER, T0, DECLARED)},
        "fault_free": {"minutes": 3, "false_positives": 0, "updates": 300, "checkpoints": 300,
                       "validations": 300},
        "settings": {"time_limit_s": 600, "poll_s": 2.0, "factor": 10, "floor_s": 10,
                     "save_timeout_s": 60},
    }  # fmt: skip
    text = report.table(bench.summary_rows(result))
    assert "600 (stated)" in text and "24 h by default" in text
    assert "1.10" in text and "<= 1.20" in text  # detection in T, its goal T + one poll
    assert "1.81" in text and "53.10" in text
    assert "hangs declared in 3 min" in text and "phase train" in text
    assert len({line.index("|") for line in text.splitlines() if "|" in line}) == 1
