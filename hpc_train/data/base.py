"""What every part of data preparation shares: the error users see, the log line, the splits."""

from __future__ import annotations

import sys

SPLITS = ("train", "valid", "test")


class DataError(RuntimeError):
    """Input that cannot be prepared; one line for the user (exit 2)."""


def log(msg: str) -> None:
    print(f"[data] {msg}", file=sys.stderr, flush=True)
