"""What every hpc-train command line shares: help that shows defaults and examples, and bad
input as one line with exit status 2."""

from __future__ import annotations

import argparse
from typing import NoReturn


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and epilog's line breaks (examples) and appends each option's
    default to its help, unless it has none (None, False) or the help already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, argparse.SUPPRESS)
            or action.option_strings == []
        ):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (no usage dump) and exit 2."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def examples(doc: str | None, command: str) -> str:
    """The lines of a module docstring that show ``command`` being run (with their ``\\``
    continuation lines): an epilog."""
    picked: list[str] = []
    continued = False
    for line in (doc or "").splitlines():
        if command in line or continued:
            picked.append(line)
            continued = line.rstrip().endswith("\\")
    return "examples:\n" + "\n".join(picked) if picked else ""
