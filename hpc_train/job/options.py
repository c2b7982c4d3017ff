"""The submit command line, generated from the job spec's fields.

Each option's flag, help and parsing are written once, on its ``JobSpec`` field (``spec.option``);
its default is the field's default, shown in ``--help``. ``add_options`` puts them on a parser;
``spec_from_options`` turns what was parsed into a ``JobSpec``. Values that need more than
argparse's types (``--nodes 1-4``, ``--time 2:00:00``) are parsed afterwards, so their one-line
SpecError reaches the user unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from hpc_train.job import levers
from hpc_train.job.spec import JobSpec, Option


def spec_options() -> list[tuple[dataclasses.Field[Any], Option]]:
    """(field, option) for every JobSpec field that has an option, in field order."""
    return [
        (f, f.metadata["option"]) for f in dataclasses.fields(JobSpec) if "option" in f.metadata
    ]


def _default_text(f: dataclasses.Field[Any], opt: Option) -> str | None:
    if opt.default_text is not None:
        return opt.default_text
    if f.default in (dataclasses.MISSING, None, False):
        return None
    return str(f.default)


LEVER_DEST = "lever:"  # argparse's dest of each --NAME of a speed lever: "lever:NAME"


def lever_field() -> dataclasses.Field[Any]:
    """The spec field that holds the speed levers' settings (one option per lever)."""
    return next(f for f in dataclasses.fields(JobSpec) if "levers" in f.metadata)


def add_lever_options(parser: argparse.ArgumentParser) -> None:
    """``--NAME auto|on|off`` for each speed lever (``job.levers``), help from the lever."""
    for lever in lever_field().metadata["levers"]:
        parser.add_argument(
            f"--{lever.name}",
            dest=LEVER_DEST + lever.name,
            help=f"{lever.what} (default: auto)".replace("%", "%%"),
            choices=levers.SETTINGS,
            default=argparse.SUPPRESS,
        )


def add_options(parser: argparse.ArgumentParser) -> None:
    """One option per spec field that has one; an absent option leaves the field's default.
    The speed levers' options sit where their field sits."""
    lever_name = lever_field().name
    for f in dataclasses.fields(JobSpec):
        if f.name == lever_name:
            add_lever_options(parser)
        if "option" not in f.metadata:
            continue
        opt = f.metadata["option"]
        shown = _default_text(f, opt)
        text = opt.help + (f" (default: {shown})" if shown else "")
        kwargs: dict[str, Any] = {"dest": f.name, "help": text.replace("%", "%%")}
        if f.type in ("bool", bool):
            kwargs["action"] = "store_true"
        else:
            kwargs.update(metavar=opt.metavar, choices=opt.choices)
            if opt.type is not None:
                kwargs["type"] = opt.type
        if f.default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = argparse.SUPPRESS
        parser.add_argument(opt.flag, **kwargs)


def spec_from_options(args: argparse.Namespace, extra: Sequence[str] = ()) -> JobSpec:
    """The spec from parsed options (SpecError, one line, when a value does not parse)."""
    given = vars(args)
    values: dict[str, Any] = {}
    for f, opt in spec_options():
        if f.name not in given:
            continue
        value = opt.parse(given[f.name]) if opt.parse is not None else given[f.name]
        if opt.fills:
            values.update(zip(opt.fills, value, strict=True))
        else:
            values[f.name] = value
    asked = tuple((k[len(LEVER_DEST) :], v) for k, v in given.items() if k.startswith(LEVER_DEST))
    values[lever_field().name] = asked
    return JobSpec(**values, extra_args=tuple(extra))
