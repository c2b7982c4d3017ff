"""The arithmetic and the commands of the data benchmark (pure; nothing timed here)."""

from __future__ import annotations

import pytest

from benchmarks import data as bench
from benchmarks.report import table


def test_steady_seconds_is_median_wall_less_median_startup():
    assert bench.steady_seconds([5.0, 9.0, 6.0], [1.0, 2.0, 1.5]) == pytest.approx(4.5)
    assert bench.steady_seconds([1.0], [2.0]) > 0  # never zero or negative


def test_rates_and_extrapolation():
    assert bench.per_second(1000, 4.0) == 250
    # 543 MB at 2 MB/s per worker: 271.5 s on one, 96 workers linear: 2.83 s
    assert bench.hours_for(543e6, 2e6, 1) * 3600 == pytest.approx(271.5)
    assert bench.hours_for(543e6, 2e6, 96) * 3600 == pytest.approx(271.5 / 96)
    assert bench.minutes(0.5) == "30.0" and bench.seconds(0.01) == "36.0"
    assert bench.minutes(None) == "n/a"


def test_the_same_commands_run_on_a_one_line_file_for_start_up(tmp_path):
    src, dest = tmp_path / "in.raw", tmp_path / "out.bpe"
    commands = bench.commands(src, dest)
    assert sorted(commands) == ["fairseq_1", "fairseq_2", "ours_1", "ours_2"]
    fairseq = commands["fairseq_2"]
    assert fairseq[1].endswith("examples/roberta/multiprocessing_bpe_encoder.py")
    assert fairseq[-3:] == ["--keep-empty", "--workers", "2"]
    assert commands["ours_1"][2:5] == ["hpc_train.data", "bpe", "--input"]
    tiny = bench.with_input(fairseq, src, dest, tmp_path / "t.raw", tmp_path / "t.bpe")
    assert str(src) not in tiny and str(tmp_path / "t.raw") in tiny
    assert str(tmp_path / "t.bpe") in tiny and len(tiny) == len(fairseq)


def test_the_coordinator_stage_runs_on_a_small_file(tmp_path):
    src = tmp_path / "in.raw"
    src.write_text(" = A = \n \n one two \n")
    assert bench.serial_stage(src, b"1\n\n2 3\n", 2, tmp_path / "out.bpe") > 0
    assert (tmp_path / "out.bpe").read_bytes() == b"1\n\n2 3\n"


def test_summary_table_has_every_figure_and_says_n_a_for_missing_ones():
    rates = {f"{k}_{n}": 1000.0 * n for k in ("fairseq", "ours") for n in (1, 2)}
    result = {
        "lines_per_s": rates,
        "speedup_1_worker": 4.0,
        "speedup_2_workers": None,
        "scaling_2_over_1": {"ours": 1.6, "fairseq": 1.4},
        "tokenizers_pipeline_over_ours": 0.4,
        "coordinator_mb_per_s": 130.0,
        "wikitext103_hours_1_process": {"ours": 0.02, "fairseq": 0.08},
        "wikitext103_hours_96_vcpus": {"ours": 0.0002, "fairseq": 0.0008},
        "wikitext103_hours_ours_coordinator": 0.001,
    }
    text = table(bench.summary_rows(result))
    assert "speedup ours / fairseq, 1 worker" in text and "4.00" in text
    assert "n/a" in text  # the 2-worker speedup that could not be measured
    assert "4.8" in text  # fairseq, one process: 0.08 h
    assert len({line.index("|") for line in text.splitlines() if "|" in line}) == 1
