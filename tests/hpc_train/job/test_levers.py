"""Speed levers chosen per compute capability (sm70 V100, sm80 A100, sm90 H100, CPU ranks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.job import command_lines, levers
from hpc_train.job.levers import Speed
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, SpecError, Training, validate


def states(cc, asked=None) -> dict[str, bool]:
    return {c.lever.name: c.on for c in levers.choose(cc, asked)}


@pytest.mark.parametrize(
    ("cc", "expected"),
    [
        ((7, 0), {"flash": False, "fused-adamw": True, "gelu": False}),  # V100: no flash
        ((8, 0), {"flash": True, "fused-adamw": True, "gelu": False}),  # gelu unmeasured there
        ((9, 0), {"flash": True, "fused-adamw": True, "gelu": True}),  # measured on an H200
        (None, {"flash": False, "fused-adamw": False, "gelu": False}),  # CPU ranks
    ],
)
def test_defaults_per_compute_capability(cc, expected):
    """On by default only where measured faster: gelu from sm90 (the H200 sessions of 2026-11-29,
    +10-12 %); a lever measured inside the noise (pad-check, host-sizes, lazy-stats,
    foreach-grads), changing the samples (pack) or costing each start its compile (compile) is
    off and says its figure."""
    off = {"compile", "pad-check", "host-sizes", "lazy-stats", "foreach-grads", "pack"}
    assert states(cc) == {**expected, **dict.fromkeys(off, False)}
    evidence = {name: levers.BY_NAME[name].evidence for name in (*off, "gelu")}
    assert "each start compiles" in evidence["compile"]
    assert all("inside the noise" in evidence[n] for n in ("lazy-stats", "foreach-grads"))
    for name in off | {"gelu"}:
        assert "measured on an H200 (2026-11-29" in evidence[name] and "words/s" in evidence[name]


def test_every_new_lever_runs_on_cpu_ranks_when_asked():
    """The CPU is where each is proven equivalent and its syncs and ops are counted."""
    new = ("gelu", "pad-check", "host-sizes", "lazy-stats", "foreach-grads", "pack", "fused-adamw")
    assert all(states(None, dict.fromkeys(new, "on"))[name] for name in new)


@pytest.mark.parametrize("cc", [(7, 0), (8, 0), (9, 0)])
def test_compile_runs_on_every_supported_gpu_when_asked_and_each_lever_turns_off(cc):
    assert states(cc, {"compile": "on"})["compile"]
    off = {name: "off" for name in levers.BY_NAME}
    assert not any(states(cc, off).values())


def test_flash_needs_sm80_whatever_was_asked():
    assert not states((7, 0), {"flash": "on"})["flash"]
    assert (
        levers.problem((7, 0), {"flash": "on"}, "V100") == "--flash on: V100 (sm70) cannot run it"
    )
    assert levers.problem((8, 0), {"flash": "on"}, "A100") is None
    assert levers.problem(None, {"compile": "on"}, "a CPU rank") is None  # Inductor's C++ backend
    assert "unknown speed lever" in (levers.problem((9, 0), {"cuda-graphs": "on"}, "x") or "")
    assert "choose from" in (levers.problem((9, 0), {"flash": "yes"}, "x") or "")


def test_instance_types_map_to_their_gpus_compute_capability():
    assert levers.compute_capability("p3dn.24xlarge") == (7, 0)
    assert levers.compute_capability("p4d.24xlarge") == (8, 0)
    assert levers.compute_capability("p5.48xlarge") == (9, 0)
    assert levers.compute_capability("g9.unknown") == levers.FALLBACK_CC


def test_the_rank_gets_the_levers_that_are_on_in_one_argument():
    args = levers.worker_args(levers.choose((9, 0), {"compile": "on"}))
    assert args == [levers.WORKER_FLAG, "compile,flash,fused-adamw,gelu"]
    assert levers.parse_worker_value(args[1]) == {"compile", "flash", "fused-adamw", "gelu"}
    assert levers.worker_args(levers.choose(None)) == [levers.WORKER_FLAG, "none"]
    assert levers.parse_worker_value("none") == frozenset()
    with pytest.raises(ValueError, match="unknown lever"):
        levers.parse_worker_value("compile,warp-speed")


def spec(instance_type: str, gpus: int = 8, **asked: str) -> JobSpec:
    """roberta-large on ``instance_type``, the levers ``asked`` (by their fields' names)."""
    return JobSpec(Training("roberta-large", Path("/d"), Path("/s")),
                   Sizing(gpus_per_node=gpus, instance_type=instance_type),
                   speed=Speed(**asked))  # fmt: skip


def test_submit_refuses_a_lever_the_instance_types_gpu_cannot_run():
    with pytest.raises(SpecError, match=r"--flash on: the GPU of p3dn\.24xlarge"):
        validate(spec("p3dn.24xlarge", flash="on"), check_paths=False)
    validate(spec("p5.48xlarge", flash="on"), check_paths=False)


def test_the_command_line_carries_the_choices():
    def arg(argv, flag):
        return argv[argv.index(flag) + 1]

    p3dn, _ = command_lines.fairseq_args(spec("p3dn.24xlarge"), world_size=8, gpu=True)
    assert arg(p3dn, levers.WORKER_FLAG) == "fused-adamw"  # no flash on a V100
    assert arg(p3dn, "--optimizer") == "fused_adamw" and "--fp16" in p3dn
    asked = spec("p5.48xlarge", compile="on", fused_adamw="off")
    p5, _ = command_lines.fairseq_args(asked, world_size=8, gpu=True)
    assert arg(p5, levers.WORKER_FLAG) == "compile,flash,gelu"  # gelu: sm90's default
    assert arg(p5, "--optimizer") == "adam"  # fused-adamw off: fairseq's own


def test_dry_run_lists_every_lever_with_its_reason_and_evidence():
    lines = levers.describe(spec("p3dn.24xlarge").lever_choices(True), (7, 0))
    assert lines[0].startswith("# speed levers for sm70")
    assert len(lines) == 1 + len(levers.LEVERS)
    flash = next(line for line in lines if "flash" in line)
    assert "off" in flash and "sm70 cannot run it" in flash
    assert "199k vs 192k words/s" in next(line for line in lines if "compile" in line)


def test_the_speed_section_has_one_option_per_lever_in_the_tables_order():
    """``JobSpec.speed`` is a section like the others (no special case in ``job.options``): one
    field per lever, named by its member, its option ``--NAME`` with the lever's help."""
    import dataclasses

    fields = dataclasses.fields(levers.Speed)
    assert [f.name for f in fields] == [levers.field_of(lever.name) for lever in levers.LEVERS]
    assert [f.metadata["option"].flag for f in fields] == [f"--{x.name}" for x in levers.LEVERS]
    assert [f.metadata["option"].help for f in fields] == [x.what for x in levers.LEVERS]
    asked = levers.Speed.of({levers.LeverName.FUSED_ADAMW: "off"})
    assert asked.fused_adamw == "off" and asked.asked() == {levers.LeverName.FUSED_ADAMW: "off"}
