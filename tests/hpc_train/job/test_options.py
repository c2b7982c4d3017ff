"""The submit CLI is generated from JobSpec's fields: one definition per option."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpc_train import submit
from hpc_train.job import options
from hpc_train.job.spec import JobSpec, SpecError


def parse(*argv: str) -> JobSpec:
    args = submit.build_parser().parse_args(["--data", "d", "--save-dir", "s", *argv])
    return options.spec_from_options(args)


def test_every_field_but_the_derived_ones_has_an_option():
    with_option = {f.name for f, _ in options.spec_options()}
    all_fields = {f.name for f in dataclasses.fields(JobSpec)}
    # filled by --nodes, by --, and by one --NAME per speed lever
    assert all_fields - with_option == {"nodes_max", "extra_args", "speed"}


def test_each_speed_lever_is_an_option_and_lands_in_the_spec():
    from hpc_train.job import levers

    text = submit.build_parser().format_help()
    assert all(f"--{lever.name} {{auto,on,off}}" in text for lever in levers.LEVERS)
    spec = parse("--preset", "tiny", "--gelu", "on", "--flash", "off")
    assert spec.speed == (("gelu", "on"), ("flash", "off"))
    assert spec.lever_settings["gelu"] == "on" and spec.lever_settings["pack"] == "auto"
    assert parse("--preset", "tiny").speed == ()


def test_absent_options_keep_the_fields_defaults():
    spec = parse("--preset", "tiny")
    bare = JobSpec("tiny", Path("d").resolve(), Path("s").resolve())
    assert spec == bare


def test_help_shows_each_default_from_the_field():
    text = submit.build_parser().format_help()
    for _field, opt in options.spec_options():
        assert opt.flag in text
        if opt.default_text:
            assert opt.default_text.split(",")[0] in " ".join(text.split())
    assert "(default: 20)" in text  # --max-restarts, from JobSpec.max_restarts
    assert "-- FAIRSEQ_ARGS" in text and "examples:" in text
    assert "tiny           roberta_base shrunk to 2 layers" in text  # not labelled roberta_base


def test_values_are_parsed_by_the_fields_parsers():
    spec = parse("--preset", "tiny", "--nodes", "1-4", "--time", "1:30:00", "--max-update", "9")
    assert (spec.nodes_min, spec.nodes_max, spec.time_limit_min, spec.max_update) == (1, 4, 90, 9)
    assert spec.data.is_absolute() and spec.save_dir.is_absolute()


def test_a_value_that_does_not_parse_is_a_spec_error():
    with pytest.raises(SpecError, match="MIN-MAX"):
        parse("--preset", "tiny", "--nodes", "four")
