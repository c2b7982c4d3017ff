"""benchmarks.gpu_levers, the issue-29 comparison script: what each run would run (its GPU part
needs a GPU; here it takes its no-GPU path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import gpu_levers
from hpc_train.job import levers


def arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_p3dn_run_keeps_p3dns_limits_on_any_gpu(tmp_path):
    spec = gpu_levers.run_spec("large_p3dn", Path("/d"), tmp_path)
    argv = gpu_levers.run_argv("large_p3dn", spec, "python")
    assert argv[:2] == ["python", "-c"] and "set_per_process_memory_fraction" in argv[2]
    assert "32.0 * 2**30" in argv[2]  # a V100's 32 GiB
    assert "--fp16" in argv and "--bf16" not in argv
    assert arg(argv, "--batch-size") == "32"  # the p3dn row: an estimate to confirm there
    assert arg(argv, levers.WORKER_FLAG) == "fused-adamw"  # no flash: the rank disables it


def test_the_compile_runs_differ_from_the_defaults_only_by_the_lever(tmp_path):
    for short in ("large", "base"):
        plain = gpu_levers.run_argv(short, gpu_levers.run_spec(short, Path("/d"), tmp_path), "p")
        spec = gpu_levers.run_spec(f"{short}_compile", Path("/d"), tmp_path)
        compiled = gpu_levers.run_argv(f"{short}_compile", spec, "p")
        assert arg(plain, levers.WORKER_FLAG) == "flash,fused-adamw"  # p5: sm90's defaults
        assert arg(compiled, levers.WORKER_FLAG) == "compile,flash,fused-adamw"
        strip = {
            arg(plain, "--save-dir"),
            arg(compiled, "--save-dir"),
            arg(plain, levers.WORKER_FLAG),
            arg(compiled, levers.WORKER_FLAG),
        }
        assert [a for a in plain if a not in strip] == [a for a in compiled if a not in strip]


def test_figures_compare_words_and_the_last_common_loss():
    runs = {
        "large": {"words_per_s": 100.0, "losses": {2: 10.0, 4: 9.0}},
        "large_compile": {"words_per_s": 150.0, "losses": {2: 10.1, 4: 9.05}},
    }
    assert gpu_levers.figures(runs) == {
        "large_compile_speedup": 1.5,
        "large_compile_loss_diff_at_4": 0.05,
    }


@pytest.mark.nogpu
def test_without_a_gpu_it_lists_each_run_and_measures_nothing(tmp_path, capsys):
    corpus = tmp_path / "data"  # only looked at for its dictionary: nothing is trained
    corpus.mkdir()
    (corpus / "dict.txt").write_text("the 1\n")
    out = tmp_path / "levers.json"
    assert (
        gpu_levers.main(["--data", str(corpus), "--out", str(out), "--work-dir", str(tmp_path)])
        == 0
    )
    text = capsys.readouterr().out
    assert "no GPU visible" in text and not out.exists()
    assert all(f"{name}: " in text for name in gpu_levers.RUNS)
