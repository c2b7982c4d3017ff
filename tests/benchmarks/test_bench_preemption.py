"""The arithmetic of the preemption benchmark (pure functions; no cluster)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from benchmarks import preemption as bench
from benchmarks import report


def stamp(t: float) -> str:
    """A log prefix for epoch time ``t``, as fairseq and submitit write it (local time)."""
    when = dt.datetime.fromtimestamp(t)
    return when.strftime("%Y-%m-%d %H:%M:%S") + f",{when.microsecond // 1000:03d}"


def metrics(t: float, update: int) -> str:
    body = json.dumps({"epoch": 1, "loss": "12.5", "num_updates": str(update)})
    return f"{stamp(t)} | INFO | train_inner | {body}"


T0 = 1_795_000_000.0  # an arbitrary whole second


@pytest.mark.parametrize(
    ("updates", "expected"),
    [
        ([], 0),
        ([1, 2, 3, 4], 0),
        ([1, 2, 3, 2, 3, 4], 2),  # resumed from 1 after 3
        ([1, 2, 3, 3, 3, 4], 2),  # 3 trained three times
    ],
)
def test_recomputed_updates_counts_every_repeat(updates, expected):
    assert bench.recomputed_updates(updates) == expected


def test_missing_updates():
    assert bench.missing_updates([1, 2, 4, 4, 5], 6) == [3, 6]
    assert bench.missing_updates(range(1, 11), 10) == []


def test_log_time_reads_fairseq_and_submitit_stamps_to_the_millisecond():
    t = T0 + 12.345
    assert bench.log_time(f"{stamp(t)} | INFO | x | y") == pytest.approx(t, abs=1e-6)
    submitit = f"submitit INFO ({stamp(t)}) - Starting with JobEnvironment(job_id=3)"
    assert bench.log_time(submitit) == pytest.approx(t, abs=1e-6)
    assert bench.log_time("[2026-11-22T02:40:54Z] hpc-train n1: start #2") is None
    assert bench.log_time("no stamp") is None


def test_first_time_ignores_lines_before_the_reference():
    lines = [
        f"{stamp(T0 - 5)} | INFO | trainer | Loaded checkpoint a.pt (epoch 1 @ 0 updates)",
        "Loaded checkpoint without a stamp",
        f"{stamp(T0 + 7)} | INFO | trainer | Loaded checkpoint a.pt (epoch 1 @ 20 updates)",
    ]
    assert bench.first_time(lines, "Loaded checkpoint", T0) == pytest.approx(T0 + 7)
    assert bench.first_time(lines, "nowhere", T0) is None


def test_resumed_update_is_the_first_update_after_the_resume():
    loaded = (
        "| INFO | fairseq.trainer | Loaded checkpoint /s/checkpoint_last.pt (epoch 1 @ 21 updates)"
    )
    lines = [
        metrics(T0 - 1, 20),
        metrics(T0 + 0.4, 21),  # the interrupted run still trains after the preemptor
        f"{stamp(T0 + 1)} | INFO | hpc_train.worker.preemption | saved on notice at update 21 in 0.1 s",
        f"{stamp(T0 + 20)} {loaded}",
        f"{stamp(T0 + 21)} | INFO | valid | "
        + json.dumps({"valid_loss": "9", "num_updates": "21"}),
        metrics(T0 + 22.5, 22),
        metrics(T0 + 22.6, 23),
    ]
    assert bench.resumed_update(lines, T0) == (pytest.approx(T0 + 22.5), 22)
    assert bench.resumed_update(lines[:4], T0) is None  # resumed, no update yet
    assert bench.resumed_update(lines, T0 + 30) is None  # no resume after the reference


def test_first_after_and_ratio():
    assert bench.first_after([10.0, 20.0, 30.0], 15) == 20.0
    assert bench.first_after([10.0], 15) is None
    assert report.ratio(3.0, 2.0) == 1.5
    assert report.ratio(None, 2.0) is None
    assert report.ratio(1.0, 0.0) is None


def test_phases_between_consecutive_moments_skip_missing_ones():
    marks = [("interrupt", 100.0), ("notice", 101.5), ("saved", None), ("restart", 110.0)]
    assert bench.phases(marks) == {"interrupt->notice": 1.5, "notice->restart": 8.5}
    assert bench.phases([]) == {}


def test_table_has_aligned_columns_and_the_goals():
    result = {
        "updates_recomputed_per_preemption": 0.0,
        "updates_recomputed_without_notice": 6.0,
        "recovery_ratio": 1.234,
        "save_ratio": None,
        "recovery_s": {"training": 30.0, "sleep": 24.3},
        "save_s": {"atomic_median": 0.05, "plain_median": 0.04},
        "settings": {"save_interval_updates": 10},
        "runs": {"save_on_notice": {"restart_s": 12.0, "startup_s": 18.0}},
    }
    text = report.table(bench.summary_rows(result))
    lines = text.splitlines()
    assert lines[0].startswith("figure") and set(lines[1]) <= {"-", "+"}
    assert len({line.index("|") for line in lines if "|" in line}) == 1
    assert "recovery ratio training / sleep" in text and "1.23" in text and "<= 1.5" in text
    assert "n/a" in text  # a figure that could not be measured


def test_write_json_replaces_the_file_whole(tmp_path):
    out = tmp_path / "results" / "preemption.json"
    report.write_json(out, {"a": 1})
    report.write_json(out, {"b": 2})
    assert json.loads(out.read_text()) == {"b": 2}
    assert [p.name for p in out.parent.iterdir()] == ["preemption.json"]  # no temporary left


def test_recovery_figures_read_a_finished_runs_logs(tmp_path):
    """The figures of one interrupted run, from its train log and task 0's log: notice at +0.5,
    saved at +1, the job restarted at +10, the checkpoint loaded at +20, update 21 trained
    again at +22.5 (one recomputed), 23 and 24 never trained."""
    from hpc_core.rundir import RunDir

    run = RunDir(tmp_path)
    lines = [metrics(T0 - 22 + u, u) for u in range(1, 22)]
    lines += [
        f"{stamp(T0 + 0.5)} | INFO | hpc_train.worker.preemption | saving at update 21",
        f"{stamp(T0 + 1)} | INFO | hpc_train.worker.preemption | saved on notice at update 21 "
        "in 0.25 s",
        f"{stamp(T0 + 20)} | INFO | fairseq.trainer | Loaded checkpoint /s/checkpoint_last.pt "
        "(epoch 1 @ 20 updates)",
        metrics(T0 + 22.5, 21),
        metrics(T0 + 23, 22),
    ]
    run.train_log.write_text("\n".join(lines) + "\n")
    run.task_log("7", 0).parent.mkdir(parents=True, exist_ok=True)
    run.task_log("7", 0).write_text(
        f"submitit INFO ({stamp(T0 + 10)}) - Starting with JobEnvironment(job_id=7)\n"
    )
    figures = bench.recovery_figures(tmp_path, "7", T0, T0 + 22.5, max_update=24)
    assert figures == {
        "updates_recomputed": 1,
        "updates_missing": [23, 24],
        "recovery_s": 22.5,
        "phases_s": {
            "interrupt->notice": 0.5, "notice->saved": 0.5, "saved->restart": 9.0,
            "restart->checkpoint_loaded": 10.0, "checkpoint_loaded->first_update": 2.5,
        },
        "restart_s": 10.0,
        "startup_s": 12.5,
        "save_on_notice_s": 0.25,
    }  # fmt: skip
    assert list(figures) == [  # in training_run's result, in this order
        "updates_recomputed", "updates_missing", "recovery_s", "phases_s", "restart_s",
        "startup_s", "save_on_notice_s",
    ]  # fmt: skip
