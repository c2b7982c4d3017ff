"""The checkpoint cost model (hpc_train.planning.costs): bytes from a preset, save seconds from storage,
and the notice-save against its windows. The fairseq-tier tests compare with fairseq's models
and real checkpoints written here; the fast ones with figures measured on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.job import presets
from hpc_train.planning import costs

REPO = Path(__file__).resolve().parents[3]

# make bench-gpu on an H100 (benchmarks/results/gpu.json), a corpus whose dictionary gives 6,881
# embedding rows: (parameters fairseq reported, bytes of checkpoint_last.pt), fp16 + fairseq adam.
GPU_MEASURED = {
    "roberta-base": (91_334_369, 1_117_248_843),
    "roberta-large": (310_942_433, 3_759_669_067),
}
GPU_VOCAB = 6881


@pytest.mark.parametrize("name", sorted(GPU_MEASURED))
def test_parameters_and_bytes_match_gpu_checkpoints(name: str) -> None:
    params, nbytes = GPU_MEASURED[name]
    d = costs.dims(presets.get(name))
    assert costs.parameters(d, GPU_VOCAB) == params
    predicted = costs.checkpoint_bytes(d, GPU_VOCAB, gpu=True)
    # 12 bytes per parameter + the tied embedding written twice: within 0.1%, not just 10%
    assert abs(predicted / nbytes - 1) < 0.001
    # without the second embedding copy it would be off by more than the overhead
    assert abs(costs.checkpoint_bytes(d, GPU_VOCAB, gpu=False) / nbytes - 1) > 0.005


def test_dims_apply_the_presets_arch_flags() -> None:
    assert costs.dims(presets.get("tiny")) == costs.Dims(2, 64, 128, 64)
    assert costs.dims(presets.get("roberta-base")) == costs.Dims(12, 768, 3072, 512)
    assert costs.dims(presets.get("roberta-large")) == costs.Dims(24, 1024, 4096, 512)


def test_roberta_sizes_with_the_gpt2_dictionary() -> None:
    # the published sizes: roberta.base ~125M, roberta.large ~355M parameters
    assert costs.parameters(costs.dims(presets.get("roberta-base"))) == 124_696_665
    assert costs.parameters(costs.dims(presets.get("roberta-large"))) == 355_411_033
    large = costs.preset_checkpoint_bytes("roberta-large")
    assert 4.4e9 < large < 4.5e9  # 355.4M x 12 + 50265 x 1024 x 4


def test_vocab_size_counts_specials_and_mask(tmp_path: Path) -> None:
    dict_txt = tmp_path / "dict.txt"
    dict_txt.write_text("".join(f"{i} {100 - i}\n" for i in range(10)))
    assert costs.vocab_size(dict_txt) == 10 + 4 + 1


def test_fsx_throughput() -> None:
    assert costs.fsx_throughput_mbs(1200, 125) == pytest.approx(150.0)
    assert costs.fsx_throughput_mbs(2400, 250) == pytest.approx(600.0)
    with pytest.raises(ValueError):
        costs.fsx_throughput_mbs(0, 125)


def test_cluster_throughput_read_from_the_templates(tmp_path: Path) -> None:
    configs = REPO / "pcluster_configs"
    assert costs.config_for("p3dn.24xlarge", configs) == configs / "p3dn.yaml"  # not -spot
    assert costs.config_for("p4d.24xlarge", configs) == configs / "p4d.yaml"
    assert costs.config_for("g5.xlarge", configs) is None
    assert costs.cluster_throughput_mbs(configs / "p5.yaml") == pytest.approx(150.0)
    bigger = tmp_path / "big.yaml"
    bigger.write_text(
        "SharedStorage:\n  - Name: x\n    StorageType: FsxLustre\n    FsxLustreSettings:\n"
        "      StorageCapacity: 4800\n      PerUnitStorageThroughput: 500\n"
    )
    assert costs.cluster_throughput_mbs(bigger) == pytest.approx(2400.0)
    (tmp_path / "none.yaml").write_text("SharedStorage: []\n")
    with pytest.raises(ValueError, match="no FsxLustre"):
        costs.cluster_throughput_mbs(tmp_path / "none.yaml")


def test_save_seconds() -> None:
    assert costs.save_seconds(4_500_000_000, 150.0) == pytest.approx(30.0)
    assert costs.save_seconds(4_500_000_000, 150.0, files=2) == pytest.approx(60.0)
    with pytest.raises(ValueError):
        costs.save_seconds(1, 0.0)


def test_windows_that_apply() -> None:
    assert costs.windows(None) == []
    found = costs.windows(90, grace_time_s=30, spot=True)
    assert [w.seconds for w in found] == [90, 30, costs.SPOT_NOTICE_S - costs.SPOT_POLL_S]
    assert found[2].seconds == 115


def test_window_check_large_model_on_default_lustre() -> None:
    # roberta-large, 4.47 GB at 150 MB/s = 29.8 s; needed 1.5 x 29.8 + 15 + 1 (one update) = 60.7
    save_s = costs.save_seconds(costs.preset_checkpoint_bytes("roberta-large"), 150.0)
    assert save_s == pytest.approx(29.8, abs=0.1)
    verdicts = costs.window_check(save_s, costs.windows(90, 30, spot=True), update_s=1.0)
    assert [v.needed_s for v in verdicts] == [pytest.approx(60.7, abs=0.1)] * 3
    assert [v.fits for v in verdicts] == [True, False, True]
    lines = costs.warnings(verdicts)
    assert len(lines) == 1 and "GraceTime" in lines[0] and "does NOT fit" in lines[0]


def test_window_check_edges_and_margin() -> None:
    w = [costs.NoticeWindow("w", 30.0)]
    assert costs.window_check(10.0, w)[0].fits  # 1.5 x 10 + 15 = 30: exactly fits
    assert not costs.window_check(10.1, w)[0].fits
    no_margin = costs.Margin(factor=1.0, fixed_s=0.0)
    assert costs.window_check(30.0, w, margin=no_margin)[0].fits
    assert not costs.window_check(30.0, w, update_s=0.5, margin=no_margin)[0].fits
    with pytest.raises(ValueError):
        costs.window_check(-1.0, w)


def test_submit_warnings() -> None:
    assert costs.submit_warnings("tiny", gpu=False, signal_delay_s=90, grace_time_s=30) == []
    assert costs.submit_warnings("roberta-large", gpu=True, signal_delay_s=90) == []
    lines = costs.submit_warnings("roberta-large", gpu=True, signal_delay_s=90, grace_time_s=30)
    assert len(lines) == 1 and "GraceTime" in lines[0]
    # a slow file system: even the spot notice is too short
    slow = costs.submit_warnings("roberta-large", True, 90, spot=True, throughput_mbs=40.0)
    assert len(slow) == 2


# --- against fairseq itself ------------------------------------------------------------------


def _fairseq_model_parameters(corpus: Path, preset: presets.Preset) -> int:
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [str(corpus), "--task", "masked_lm", "--arch", preset.arch, *preset.arch_args]
    argv += ["--tokens-per-sample", str(preset.tokens_per_sample)]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)  # full size, on CPU (~1.3 GB for roberta-large)
    assert len(task.source_dictionary) == costs.vocab_size(corpus / "dict.txt")
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(presets.PRESETS))
def test_parameter_count_equals_fairseqs_model(corpus: Path, name: str) -> None:
    preset = presets.get(name)
    vocab = costs.vocab_size(corpus / "dict.txt")
    assert _fairseq_model_parameters(corpus, preset) == costs.parameters(costs.dims(preset), vocab)


def test_bytes_of_a_real_tiny_checkpoint(trained_save_dir: Path, corpus: Path) -> None:
    vocab = costs.vocab_size(corpus / "dict.txt")
    predicted = costs.preset_checkpoint_bytes("tiny", vocab, gpu=False)
    for name in ("checkpoint_last.pt", "checkpoint_1_5.pt", "checkpoint_1_10.pt"):
        actual = (trained_save_dir / name).stat().st_size
        assert abs(predicted / actual - 1) < 0.10, (name, actual, predicted)


def test_bytes_of_a_real_roberta_base_checkpoint(corpus: Path, tmp_path: Path) -> None:
    """roberta-base at full size, one update on this CPU through the training worker (~20 s,
    1.1 GB written); roberta-large from its parameter count at the bytes per parameter seen."""
    from hpc_train.job.command_lines import fairseq_args
    from hpc_train.job.sizing import Sizing
    from hpc_train.job.spec import JobSpec, Training

    save = tmp_path / "base"
    spec = JobSpec(
        Training("roberta-base", corpus, save, max_update=1),
        sizing=Sizing(gpus_per_node=0, global_batch=1, batch_per_device=1),
    )
    args, _ = fairseq_args(spec, world_size=1, gpu=False)
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.worker.train", *args, "--disable-validation"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    actual = (save / "checkpoint_last.pt").stat().st_size
    vocab = costs.vocab_size(corpus / "dict.txt")
    base = costs.dims(presets.get("roberta-base"))
    assert abs(costs.checkpoint_bytes(base, vocab, gpu=False) / actual - 1) < 0.10
    per_param = actual / costs.parameters(base, vocab)
    large = costs.dims(presets.get("roberta-large"))
    from_ratio = per_param * costs.parameters(large, vocab)
    assert abs(costs.checkpoint_bytes(large, vocab, gpu=False) / from_ratio - 1) < 0.10


def test_the_launchers_wait_for_a_notice_save_follows_the_estimate_within_the_window():
    assert costs.notice_wait_s("tiny", gpu=False, ceiling_s=90) == 25.0  # the floor
    large = costs.notice_wait_s("roberta-large", gpu=True, ceiling_s=90)
    assert 50 < large < 90  # ~61 s: 4.5 GB at 150 MB/s, with the margin
    assert costs.notice_wait_s("roberta-large", gpu=True, ceiling_s=30) == 30  # the window


def test_the_launcher_asks_the_estimate_unless_told(monkeypatch, tmp_path):
    from hpc_train.job.sizing import Sizing
    from hpc_train.job.spec import JobSpec, Training
    from hpc_train.launch.launcher import SAVE_WAIT_ENV, Launcher

    launcher = Launcher(
        JobSpec(Training("roberta-large", tmp_path, tmp_path), sizing=Sizing(gpus_per_node=8))
    )
    monkeypatch.delenv(SAVE_WAIT_ENV, raising=False)
    assert launcher.save_wait_s() == costs.notice_wait_s("roberta-large", True, 90)
    monkeypatch.setenv(SAVE_WAIT_ENV, "12")
    assert launcher.save_wait_s() == 12.0


def test_once_the_run_has_saved_the_launcher_waits_for_its_measured_save(monkeypatch, tmp_path):
    from hpc_core import ledger
    from hpc_core.rundir import RunDir
    from hpc_train.job.sizing import Sizing
    from hpc_train.job.spec import JobSpec, Training
    from hpc_train.launch.launcher import SAVE_WAIT_ENV, Launcher

    monkeypatch.delenv(SAVE_WAIT_ENV, raising=False)
    launcher = Launcher(
        JobSpec(Training("tiny", tmp_path, tmp_path), sizing=Sizing(gpus_per_node=0))
    )
    assert launcher.save_wait_s() == 25.0  # the estimate of a tiny save: the floor
    path = RunDir(tmp_path).ledger
    ledger.record(path, "checkpoint", "5", 0, update=10, seconds=3.0)  # a sync save
    ledger.record(path, "checkpoint", "5", 0, update=20, seconds=0.2, snapshot_s=0.2, write_s=30.0)
    ledger.record(path, "checkpoint", "5", 0, update=30, seconds=0.3, snapshot_s=0.3, write_s=9.0)
    # the slowest recent save to durable (30.2 s) with the margin: 1.5 x 30.2 + 15
    assert launcher.save_wait_s() == pytest.approx(60.3)
    assert costs.measured_save_s(ledger.read(path)[-1:]) == pytest.approx(9.3)
    assert costs.measured_save_s([]) is None


def test_the_plain_on_demand_template_is_the_one_a_plan_reads():
    """p5 has variants (ODCR, Capacity Block): the plan reads p5.yaml, p3dn the on-demand one."""
    from hpc_train.planning.costs import config_for

    assert config_for("p5.48xlarge", REPO / "pcluster_configs").name == "p5.yaml"
    assert config_for("p3dn.24xlarge", REPO / "pcluster_configs").name == "p3dn.yaml"
