"""The GPU benchmark's arithmetic and command lines (pure; no GPU, no timing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu as bench
from benchmarks import gpu_results
from hpc_train.job import devices

STAMP = "2026-11-22 12:32:49"
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu.json"


def inner(wps: float, gb_free: float, loss: float = 9.5, stamp: str = STAMP) -> str:
    body = {"epoch": 1, "loss": str(loss), "wps": str(wps), "gb_free": str(gb_free)}
    return f"{stamp} | INFO | train_inner | {json.dumps(body)}"


def arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.4),  # the same compute as the H100 SXM, more and faster memory
        ("NVIDIA H200 NVL", 835.5),
        ("NVIDIA A100-SXM4-40GB", 312.0),
        ("Tesla V100-SXM2-32GB", 125.0),
    ],
)
def test_peak_per_gpu_model(name: str, tflops: float) -> None:
    peak = gpu_results.peak_for(name)
    assert peak is not None and peak.tflops == tflops and "datasheet" in peak.source
    assert gpu_results.peak_for("NVIDIA GeForce RTX 4090") is None


def test_mfu_is_six_flops_per_parameter_per_token() -> None:
    assert gpu_results.mfu(100_000_000, 1_000_000, 1000.0) == pytest.approx(0.6)


def test_steady_leaves_out_the_warm_up_intervals() -> None:
    assert bench.steady([10.0, 20.0, 300.0, 310.0, 290.0]) == 300.0
    with pytest.raises(ValueError):
        bench.steady([10.0, 20.0])


def test_the_seed_run_is_the_seed_recipe_on_one_gpu(tmp_path: Path) -> None:
    lengths = bench.LENGTHS["roberta-base"]
    argv = bench.seed_argv("roberta-base", tmp_path, tmp_path / "s", 16, lengths, None)
    assert "--fp16" in argv and arg(argv, "--optimizer") == "adam"
    assert arg(argv, "--max-sentences") == "16" and arg(argv, "--ddp-backend") == "no_c10d"
    assert arg(argv, "--arch") == "roberta_base" and arg(argv, "--adam-betas") == "(0.9, 0.98)"
    assert 16 * int(arg(argv, "--update-freq")) == lengths.global_batch  # same global batch
    assert "--num-workers" not in argv  # fairseq's default loader, as the seed


def test_every_run_sees_the_same_global_batch(tmp_path: Path) -> None:
    for preset, lengths in bench.LENGTHS.items():
        argvs = bench.run_argvs(preset, tmp_path, tmp_path, "python")
        assert list(argvs) == list(bench.RUNS)
        for name, argv in argvs.items():
            per_gpu = bench.arg_after(argv, "--batch-size", "--max-sentences")
            assert int(per_gpu) * int(arg(argv, "--update-freq")) == lengths.global_batch, name
        toolkit, same = argvs["toolkit"], argvs["toolkit_same"]
        assert (
            toolkit[1:3] == ["-m", "torch.distributed.run"] and "hpc_train.worker.train" in toolkit
        )
        assert "--bf16" in toolkit and bench.arg_after(toolkit, "--optimizer") == "fused_adamw"
        assert "--fp16" in same and bench.arg_after(same, "--optimizer") == "adam"
        table = devices.table_row(preset, bench.INSTANCE_TYPE)
        assert table is not None and arg(toolkit, "--batch-size") == str(table.batch)
        bare = argvs["bare_same"]
        assert arg(bare, "--max-sentences") == str(table.batch)
        assert arg(bare, "--num-workers") == arg(toolkit, "--num-workers")


def test_parse_log_reads_params_speed_memory_and_save() -> None:
    lines = [
        f"{STAMP} | INFO | fairseq_cli.train | num. shared model params: 91,334,369 (num. "
        "trained: 91,334,369)",
        inner(100.0, 60.0),
        "not a metrics line {",
        inner(300.0, 52.5, loss=9.1, stamp="2026-11-22 12:32:53"),
        f"{STAMP} | INFO | fairseq.checkpoint_utils | Saved checkpoint /x/checkpoint_best.pt "
        "(epoch 1 @ 24 updates, score 9.3) (writing took 2.0824 seconds)",
        "2026-11-22 12:33:05 | INFO | fairseq_cli.train | done training in 22.6 seconds",
    ]
    got = bench.parse_log(lines)
    assert got["params"] == 91_334_369 and got["wps"] == [100.0, 300.0]
    assert got["gb_free_min"] == 52.5 and got["save_s"] == pytest.approx(2.0824)
    assert got["loss"] == 9.1 and got["last_s"] - got["first_s"] == 4.0
    assert got["done_s"] - got["last_s"] == 12.0


def test_summarize_run_and_figures() -> None:
    argv = ["py", "x", "--batch-size", "256", "--update-freq", "2", "--bf16"]
    argv += ["--optimizer", "fused_adamw"]
    lines = [inner(w, 27.0) for w in (50.0, 100.0, 200.0, 210.0, 190.0)]
    first = bench.parse_log(lines)["first_s"]
    samples = [(first - 5, 1024.0, 0.0), (first, 40960.0, 90.0), (first + 1, 61440.0, 70.0)]
    raw = {"lines": lines, "samples": samples, "wall_s": 80.04, "ended": first + 30}
    run = bench.summarize_run(argv, raw | {"checkpoint_bytes": 10}, total_gib=79.2)
    assert (run["batch"], run["update_freq"], run["precision"]) == (256, 2, "bf16")
    assert run["words_per_s"] == 200.0 and run["peak_mem_gib"] == 52.2
    assert run["smi_peak_gib"] == 60.0 and run["gpu_util_pct"] == 80.0  # training window only
    assert run["exit_s"] is None and run["wall_s"] == 80.0
    assert set(gpu_results.RUN_KEYS) <= set(run) and run["status"] == "ok"
    assert run["loss_last"] == 9.5
    runs = {
        "bare_seed": {"words_per_s": 100.0, "save_s": 2.0},
        "bare_same": {"words_per_s": 200.0, "save_s": 2.0},
        "toolkit_same": {"words_per_s": 198.0, "save_s": 2.5},
        "toolkit": {"words_per_s": 210.0, "save_s": 3.0},
    }
    assert bench.figures(runs) == {
        "speedup_vs_seed": 2.1,
        "toolkit_over_bare_same_settings": 0.99,
        "bf16_fused_over_fp16_adam": 1.061,
        "save_ratio": 1.5,
    }


def test_exit_is_timed_from_done_training_with_the_final_flush_apart() -> None:
    done = f"{STAMP[:-2]}50 | INFO | fairseq_cli.train | done training in 9.9 seconds"
    flushed = (
        f"{STAMP[:-2]}53 | INFO | hpc_train.worker.async_save | wrote x in the background in 3.1 s"
    )
    lines = [inner(w, 27.0) for w in (50.0, 100.0, 200.0)] + [done, flushed]
    raw = {"lines": lines, "samples": [], "wall_s": 9.0, "checkpoint_bytes": 1}
    run = bench.summarize_run(["py"], raw | {"ended": bench._epoch(STAMP) + 5.0}, total_gib=80)
    assert (run["flush_s"], run["exit_s"]) == (3.0, 1.0)  # 49 -> 50 done, 53 flushed, 54 exit


def test_merge_keeps_presets_and_figures_measured_in_another_run() -> None:
    old = {"date": "a", "presets": {"roberta-base": 1, "roberta-large": 2},
           "figures": {"toolkit_over_bare": {"roberta-base": 2.0, "roberta-large": 2.1}}}  # fmt: skip
    new = {"date": "b", "presets": {"roberta-large": 3},
           "figures": {"toolkit_over_bare": {"roberta-large": 1.6}}}  # fmt: skip
    assert gpu_results.merge(old, new) == {
        "date": "b",
        "presets": {"roberta-base": 1, "roberta-large": 3},
        "figures": {"toolkit_over_bare": {"roberta-base": 2.0, "roberta-large": 1.6}},
    }


def test_the_recorded_results_render_in_the_one_schema() -> None:
    result = json.loads(RESULTS.read_text())
    assert {"date", "device", "presets", "figures"} <= set(result)
    assert result["figures"]["toolkit_over_bare"] == {
        p: s["figures"]["speedup_vs_seed"] for p, s in result["presets"].items()
    }
    for section in result["presets"].values():
        assert all(set(gpu_results.RUN_KEYS) <= set(r) for r in section["runs"].values())
    rows = bench.markdown(result).splitlines()
    assert len(rows) == 2 + len(bench.RUNS) * len(result["presets"])
    assert all(row.count("|") == 9 for row in rows)


@pytest.mark.nogpu
@pytest.mark.parametrize("what", ["run", "probe"])
def test_without_a_gpu_it_says_so_and_exits_0(
    what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dict.txt").write_text("a 1\n")
    out = tmp_path / "out.json"
    assert bench.main([what, "--data", str(tmp_path), "--out", str(out)]) == 0
    assert "no GPU visible here: nothing measured" in capsys.readouterr().out
    assert not out.exists()


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--data", str(tmp_path / "missing")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_probe_runs_real_fairseq_steps(corpus: Path) -> None:
    """The probe's mechanics on CPU (tiny preset): the memory figures need a GPU."""
    from benchmarks import gpu_probe

    result = gpu_probe.sweep("tiny", corpus, [2, 4], warmup=1, steps=1)
    assert [r["batch"] for r in result["rows"]] == [2, 4]
    assert all(r["words_per_s"] > 0 and not r["oom"] for r in result["rows"])
    assert result["precision"] == "bf16" and result["params"] > 300_000
    assert set(result["optimizer_step_ms"]) == {
        "fairseq_adam_per_param",
        "fused_adamw_per_param",
        "fairseq_adam_flat",
        "fused_adamw_flat",
    }
