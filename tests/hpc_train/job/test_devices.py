"""hpc_train.job.devices: the batch-per-GPU table, its arithmetic, and precision per GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_core.instances import INSTANCE_TYPES
from hpc_train.job import batch, command_lines, devices, presets
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, SpecError, Training, validate

GPU_PRESETS = ("roberta-base", "roberta-large")


def arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_fit_line_recovers_a_line_and_needs_two_sizes() -> None:
    line = devices.fit_line([(16, 3.0 + 0.5 * 16), (64, 3.0 + 0.5 * 64), (128, 3.0 + 0.5 * 128)])
    assert line == devices.MemoryLine(3.0, 0.5)
    assert line.peak_gib(10) == pytest.approx(8.0)
    with pytest.raises(ValueError):
        devices.fit_line([(32, 9.0), (32, 9.5)])


@pytest.mark.parametrize(
    ("gpu_gib", "headroom", "expected"),
    [
        (80, 0.15, 128),  # 68 GiB usable: 2 + 0.5 x 128 = 66 fits, 256 would need 130
        (80, 0.0, 128),
        (40, 0.15, 64),  # 34 usable: 64 -> 34 fits exactly
        (2.4, 0.0, 0),  # not even one sequence
    ],
)
def test_largest_fitting_is_a_power_of_two_within_the_headroom(
    gpu_gib: float, headroom: float, expected: int
) -> None:
    assert devices.largest_fitting(devices.MemoryLine(2.0, 0.5), gpu_gib, headroom) == expected


def test_chosen_batch_is_the_smallest_near_the_fastest_that_fits() -> None:
    line = devices.MemoryLine(2.0, 0.5)  # 80 GiB: up to 128 fits
    wps = {32: 100.0, 64: 150.0, 128: 152.0, 256: 300.0}  # 256 would be fastest: does not fit
    assert devices.chosen_batch(wps, line, 80) == 64  # 150 is within 3 % of 152
    assert devices.chosen_batch(wps, line, 80, within=0.0) == 128
    with pytest.raises(ValueError):
        devices.chosen_batch({512: 1.0}, line, 80)


def test_the_h100_rows_follow_the_measured_probe() -> None:
    # the probe's figures as recorded in devices.MEMORY's comment (benchmarks/results/gpu-probe.json)
    probe = {
        "roberta-base": {32: 237183, 64: 311465, 128: 374670, 256: 433331},
        "roberta-large": {16: 72607, 32: 104724, 64: 129496, 128: 145138},
    }
    h100 = INSTANCE_TYPES["p5.48xlarge"].gpu_memory_gib
    for preset in GPU_PRESETS:
        chosen = devices.chosen_batch(probe[preset], devices.MEMORY[preset], h100)
        assert chosen == devices.MEASURED_BATCH[preset]
        row = devices.table_row(preset, "p5.48xlarge")
        assert row is not None and row.batch == chosen and row.how.startswith("measured")


@pytest.mark.parametrize("preset", GPU_PRESETS)
@pytest.mark.parametrize("itype", sorted(INSTANCE_TYPES))
def test_every_row_agrees_with_its_derivation(preset: str, itype: str) -> None:
    row = devices.table_row(preset, itype)
    assert row is not None, f"no batch for {preset} on {itype}"
    if row.how.startswith("derived"):
        memory = INSTANCE_TYPES[itype].gpu_memory_gib
        line, measured = devices.MEMORY[preset], devices.MEASURED_BATCH[preset]
        assert row.batch == devices.derived_batch(line, memory, measured)
    assert row.batch & (row.batch - 1) == 0  # a power of two: divides the 2048 recipe batch


@pytest.mark.parametrize("preset", GPU_PRESETS)
@pytest.mark.parametrize("itype", sorted(INSTANCE_TYPES))
@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 8, 16, 32])
def test_global_batch_is_kept_on_every_instance_type_and_node_count(
    preset: str, itype: str, nodes: int
) -> None:
    spec = JobSpec(
        Training(preset, Path("/d"), Path("/s")),
        sizing=Sizing(nodes_min=nodes, nodes_max=nodes, gpus_per_node=8, instance_type=itype),
    )
    world = nodes * 8
    plan = batch.keep_global_batch(spec.sequences_per_update, spec.device_batch(True, world), world)
    assert plan.effective >= 2048 and plan.effective - 2048 < plan.batch_per_device * world
    if 2048 % world == 0:
        assert plan.effective == 2048  # exact on power-of-two worlds


def test_many_nodes_take_fewer_sequences_per_gpu_instead_of_refusing() -> None:
    spec = JobSpec(
        Training("roberta-base", Path("/d"), Path("/s")),
        sizing=Sizing(nodes_min=4, nodes_max=4, gpus_per_node=8, instance_type="p5.48xlarge"),
    )
    argv, plan = command_lines.fairseq_args(spec, world_size=32, gpu=True)
    assert arg(argv, "--batch-size") == "64" and plan.update_freq == 1  # 64 x 32 = 2048


def test_override_and_cpu_ranks() -> None:
    assert devices.batch_per_device("roberta-base", "p5.48xlarge", 16, 2048, 8, override=12) == 12
    # CPU ranks and GPUs the table does not know keep the preset's own batch, unshrunk
    assert devices.batch_per_device("roberta-base", None, 16, 2048, 8) == 16
    assert devices.batch_per_device("tiny", "p5.48xlarge", 8, 16, 4) == 8


@pytest.mark.parametrize(
    ("itype", "expected"),
    [
        ("p3dn.24xlarge", "fp16"),
        ("p4d.24xlarge", "bf16"),
        ("p4de.24xlarge", "bf16"),
        ("p5.48xlarge", "bf16"),
        (None, "fp16"),
    ],
)
def test_precision_by_gpu(itype: str | None, expected: str) -> None:
    assert devices.precision(itype) == expected
    assert devices.precision(itype, "fp32") == "fp32"


def test_gpu_args_carry_precision_optimizer_and_loader_workers() -> None:
    p5 = JobSpec(
        Training("roberta-large", Path("/d"), Path("/s")),
        sizing=Sizing(nodes_min=1, nodes_max=1, gpus_per_node=8, instance_type="p5.48xlarge"),
    )
    argv, plan = command_lines.fairseq_args(p5, world_size=8, gpu=True)
    assert "--bf16" in argv and "--fp16" not in argv
    assert arg(argv, "--optimizer") == presets.GPU_OPTIMIZER
    assert arg(argv, "--batch-size") == "64" and plan.update_freq == 4
    assert arg(argv, "--num-workers") == str(devices.LOADER_WORKERS)
    fp32 = JobSpec(
        Training("roberta-base", Path("/d"), Path("/s")),
        sizing=Sizing(precision="fp32", batch_per_device=8),
    )
    argv, _ = command_lines.fairseq_args(fp32, world_size=8, gpu=True)
    assert not {"--bf16", "--fp16"} & set(argv) and arg(argv, "--batch-size") == "8"
    cpu, _ = command_lines.fairseq_args(
        JobSpec(Training("tiny", Path("/d"), Path("/s"))), 1, gpu=False
    )
    assert arg(cpu, "--optimizer") == presets.CPU_OPTIMIZER and "--bf16" not in cpu


def test_validate_refuses_bf16_on_v100_and_a_zero_batch() -> None:
    v100 = JobSpec(
        Training("roberta-base", Path("/d"), Path("/s")), sizing=Sizing(precision="bf16")
    )
    with pytest.raises(SpecError, match=r"V100 of p3dn\.24xlarge has no bf16"):
        validate(v100, check_paths=False)
    with pytest.raises(SpecError, match="--batch-per-device"):
        validate(
            JobSpec(
                Training("roberta-base", Path("/d"), Path("/s")), sizing=Sizing(batch_per_device=0)
            ),
            False,
        )
    assert validate(
        JobSpec(Training("roberta-base", Path("/d"), Path("/s")), sizing=Sizing(precision="fp16")),
        False,
    )


def test_a_world_that_does_not_divide_the_global_batch_is_not_doubled():
    """2048 sequences over 24 H100s (3 p5 nodes): 43 x 24 x 2 = 2064 per update (before: 85
    per GPU, a step of 2040, so 2 steps: 4080, twice the recipe's batch)."""
    per = devices.batch_per_device("roberta-base", "p5.48xlarge", 16, 2048, 24)
    plan = batch.keep_global_batch(2048, per, 24)
    assert (per, plan.update_freq, plan.effective) == (43, 2, 2064)
    for world in range(1, 257):  # never more than one sequence per device over the recipe's
        per = devices.fitted_batch(256, 2048, world)
        if world <= 2048:
            assert batch.keep_global_batch(2048, per, world).effective < 2048 + world * 2, world


def test_an_elastic_run_keeps_one_batch_per_device_at_every_width(tmp_path):
    """--nodes 1-3 on p5: the batch per GPU is the widest world's at every width (so a resume at
    another width is sample-exact), the narrower ones take more steps per update."""
    spec = JobSpec(
        Training("roberta-base", tmp_path, tmp_path),
        sizing=Sizing(nodes_min=1, nodes_max=3, gpus_per_node=8, instance_type="p5.48xlarge"),
    )
    assert {spec.device_batch(True, 8 * n) for n in (1, 2, 3)} == {43}
