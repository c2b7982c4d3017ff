"""The submit CLI is generated from JobSpec's fields: one definition per option."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpc_train import submit
from hpc_train.job import options
from hpc_train.job.spec import JobSpec, SpecError, Training


def parse(*argv: str) -> JobSpec:
    args = submit.build_parser().parse_args(["--data", "d", "--save-dir", "s", *argv])
    return options.spec_from_options(args)


def test_every_field_but_the_derived_ones_has_an_option():
    with_option = {path for path, _f, _opt in options.spec_options()}
    all_fields = {path for path, _f in options.leaves()}
    # filled by --nodes, and by --
    assert all_fields - with_option == {("sizing", "nodes_max"), ("training", "extra_args")}


def test_each_speed_lever_is_an_option_and_lands_in_the_spec():
    from hpc_train.job import levers

    text = submit.build_parser().format_help()
    assert all(f"--{lever.name} {{auto,on,off}}" in text for lever in levers.LEVERS)
    spec = parse("--preset", "tiny", "--gelu", "on", "--flash", "off")
    assert spec.speed == levers.Speed(gelu="on", flash="off")
    settings = spec.speed.settings()
    assert settings[levers.LeverName.GELU] == "on" and settings[levers.LeverName.PACK] == "auto"
    assert spec.speed.asked() == {levers.LeverName.GELU: "on", levers.LeverName.FLASH: "off"}
    assert parse("--preset", "tiny").speed == levers.Speed()


def test_absent_options_keep_the_fields_defaults():
    spec = parse("--preset", "tiny")
    bare = JobSpec(Training("tiny", Path("d").resolve(), Path("s").resolve()))
    assert spec == bare


def test_help_shows_each_default_from_the_field():
    text = submit.build_parser().format_help()
    for _path, _field, opt in options.spec_options():
        assert opt.flag in text
        if opt.default_text:
            assert opt.default_text.split(",")[0] in " ".join(text.split())
    assert "(default: 20)" in text  # --max-restarts, from JobSpec.recovery.max_restarts
    assert "-- FAIRSEQ_ARGS" in text and "examples:" in text
    assert "tiny           roberta_base shrunk to 2 layers" in text  # not labelled roberta_base


def test_values_are_parsed_by_the_fields_parsers():
    spec = parse("--preset", "tiny", "--nodes", "1-4", "--time", "1:30:00", "--max-update", "9")
    sizing, training = spec.sizing, spec.training
    assert (sizing.nodes_min, sizing.nodes_max, spec.slurm.time_limit_min) == (1, 4, 90)
    assert training.max_update == 9
    assert training.data.is_absolute() and training.save_dir.is_absolute()


def test_a_value_that_does_not_parse_is_a_spec_error():
    with pytest.raises(SpecError, match="MIN-MAX"):
        parse("--preset", "tiny", "--nodes", "four")


def test_each_concerns_options_land_in_its_nested_value():
    from hpc_train.job.limits import HangLimits, StragglerLimits

    spec = parse(
        "--preset", "tiny", "--nodes", "2", "--spares", "1", "--max-restarts", "4",
        "--save-interval", "AUTO", "--sync-save", "--mail-user", "me@lab.org", "--notify", "cat",
        "--no-watchdog", "--hang-factor", "4", "--hang-startup-timeout", "60", "--no-drain",
        "--straggler-window", "90", "--evict-stragglers", "--container", "docker://img",
    )  # fmt: skip
    assert (spec.recovery.spares, spec.recovery.max_restarts, spec.recovery.grow_after) == (
        1, 4, 300.0)  # fmt: skip
    assert (spec.saves.interval, spec.saves.sync, spec.saves.keep_checkpoints) == ("auto", True, 3)
    assert (spec.notify.mail_user, spec.notify.command, spec.notify.mail_type) == (
        "me@lab.org", "cat", None)  # fmt: skip
    watch = spec.watch
    assert watch.no_watchdog and spec.recovery.no_drain and spec.recovery.evict_stragglers
    assert watch.hang == HangLimits(factor=4.0, startup_s=60.0)  # the watchdog's own value
    assert watch.stragglers == StragglerLimits(window_s=90.0)
    assert (spec.container.image, spec.container.mounts) == ("docker://img", ())
    assert (spec.sizing.nodes_min, spec.sizing.nodes_max) == (2, 2)  # --nodes fills its siblings


def test_each_flag_is_declared_once_and_its_dest_is_the_fields_path():
    flags = [opt.flag for _path, _f, opt in options.spec_options()]
    assert len(flags) == len(set(flags))
    parser = submit.build_parser()
    dests = {a.option_strings[0]: a.dest for a in parser._actions if a.option_strings}
    assert dests["--hang-factor"] == "watch.hang.factor"
    assert dests["--spares"] == "recovery.spares" and dests["--preset"] == "training.preset"
    assert dests["--no-drain"] == "recovery.no_drain" and dests["--pack"] == "speed.pack"
    paths = [path for path, _f, _opt in options.spec_options()]
    assert all(len(path) > 1 for path in paths)  # every option in a section: none at the top
    assert {path[0] for path in paths} == {
        "training", "sizing", "slurm", "recovery", "saves", "notify", "watch", "container", "speed",
        "tracking",
    }  # fmt: skip


def test_a_nested_concern_defaults_to_its_own_defaults():
    spec = JobSpec(Training("tiny", Path("d"), Path("s")))
    for f in dataclasses.fields(JobSpec):
        if f.name != "training":  # the one section without defaults: what to train, where
            assert getattr(spec, f.name) == f.metadata["nested"](), f.name
