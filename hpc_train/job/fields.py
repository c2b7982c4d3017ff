"""How the job spec's fields are declared: each with its command-line option, written once.

``option()`` is a dataclass field with its flag, help and default (``seconds()``: one that takes
seconds); ``nested()`` a field that holds one section's frozen dataclass of them
(``JobSpec.sizing``, ``JobSpec.watch.hang``, …), where its options appear in ``--help``.
``hpc_train.job.options`` walks the nesting and builds the submit command line from it.
``SpecError`` is what a field's parsing raises for bad input. Pure: no imports from the rest of
the toolkit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import Any


class SpecError(ValueError):
    """Bad input for a run; the message is one line meant for the user."""


@dataclass(frozen=True)
class Option:
    """How a spec field appears on the submit command line (``hpc_train.job.options`` builds it)."""

    flag: str
    help: str
    type: Callable[[str], Any] | None = None  # argparse's conversion (int, Path …)
    parse: Callable[[Any], Any] | None = None  # then ours; SpecError reaches the user as is
    fills: tuple[str, ...] = ()  # a parsed tuple spread over sibling fields (--nodes MIN-MAX)
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    default_text: str | None = None  # the default as the user writes it, when not the field's


def option(flag: str, help: str, default: Any = MISSING, **how: Any) -> Any:
    """A dataclass field with its CLI option: flag, help and default are written once, here."""
    meta = {"option": Option(flag, help, **how)}
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def seconds(flag: str, help: str, default: float) -> Any:
    """``option()`` for a duration in seconds (a float, shown as ``S``): a timeout, a window."""
    return option(flag, help, default=default, type=float, metavar="S")


def nested(section: type, required: bool = False) -> Any:
    """A field that holds ``section``, a frozen dataclass of options: its options are the
    spec's, in its place. By default it holds the section's defaults; ``required``: a section
    with options that have none (the spec cannot be built without it)."""
    if required:
        return field(metadata={"nested": section})
    return field(default_factory=section, metadata={"nested": section})
