"""The submit command line, generated from the job spec's fields.

Each option's flag, help and parsing are written once, on its field (``fields.option``), in one
of ``JobSpec``'s sections (``fields.nested``: ``JobSpec.sizing``, ``JobSpec.watch.hang``,
``JobSpec.speed``, …), whose options sit where the section sits; its default is the field's
default, shown in ``--help``. ``spec_options`` walks the nesting, ``add_options`` puts the
options on a parser, ``spec_from_options`` turns what was parsed into a ``JobSpec``, each section
built with its own values; no section is a special case. Values that need more than argparse's
types (``--nodes 1-4``, ``--time 2:00:00``) are parsed afterwards, so their one-line SpecError
reaches the user unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from hpc_train.job.fields import Option
from hpc_train.job.spec import JobSpec

FieldPath = tuple[str, ...]  # a field's names from the spec down: ("watch", "hang", "factor")


def leaves(concern: type = JobSpec, at: FieldPath = ()) -> Iterator[tuple[FieldPath, Any]]:
    """(path, field) for every field that is not a concern, in declaration order: a nested
    concern's fields where the concern sits."""
    for f in dataclasses.fields(concern):
        inner = f.metadata.get("nested")
        if inner is not None:
            yield from leaves(inner, (*at, f.name))
        else:
            yield (*at, f.name), f


def spec_options() -> list[tuple[FieldPath, dataclasses.Field[Any], Option]]:
    """(path, field, option) for every spec field that has an option, in ``--help``'s order."""
    return [(path, f, f.metadata["option"]) for path, f in leaves() if "option" in f.metadata]


def _default_text(f: dataclasses.Field[Any], opt: Option) -> str | None:
    if opt.default_text is not None:
        return opt.default_text
    if f.default in (dataclasses.MISSING, None, False):
        return None
    return str(f.default)


def add_options(parser: argparse.ArgumentParser) -> None:
    """One option per spec field that has one (its dest: the field's path, dotted); an absent
    option leaves the field's default."""
    for path, f in leaves():
        if "option" not in f.metadata:
            continue
        opt = f.metadata["option"]
        shown = _default_text(f, opt)
        text = opt.help + (f" (default: {shown})" if shown else "")
        kwargs: dict[str, Any] = {"dest": ".".join(path), "help": text.replace("%", "%%")}
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


def build(concern: type, values: dict[FieldPath, Any], at: FieldPath = ()) -> Any:
    """``concern`` from ``values`` (by path), each nested concern built from its own; a field
    with no value keeps its default."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(concern):
        inner = f.metadata.get("nested")
        if inner is not None:
            kwargs[f.name] = build(inner, values, (*at, f.name))
        elif (*at, f.name) in values:
            kwargs[f.name] = values[(*at, f.name)]
    return concern(**kwargs)


def spec_from_options(args: argparse.Namespace, extra: Sequence[str] = ()) -> JobSpec:
    """The spec from parsed options (SpecError, one line, when a value does not parse)."""
    given = vars(args)
    values: dict[FieldPath, Any] = {}
    for path, _f, opt in spec_options():
        dest = ".".join(path)
        if dest not in given:
            continue
        value = opt.parse(given[dest]) if opt.parse is not None else given[dest]
        if opt.fills:  # siblings of the field
            values.update({(*path[:-1], name): v for name, v in zip(opt.fills, value, strict=True)})
        else:
            values[path] = value
    values[("training", "extra_args")] = tuple(extra)
    spec: JobSpec = build(JobSpec, values)
    return spec
