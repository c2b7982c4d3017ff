"""What kind of error a message is, without the parts that change from one start to the next
(pure).

"The same error at the same update in two starts" stops a run (``faults.failures.repeated``),
but the text of one error differs between starts: CUDA's out-of-memory message carries the bytes
tried, in use and free, and the pids of the processes on the GPU; torch's checkpoint writer says
``unexpected pos 2082368 vs 2082256``, where the write stopped; paths of temporaries carry a pid,
addresses differ. ``normalize`` replaces each volatile part by a placeholder and keeps the words,
so the same out-of-memory or storage error reads the same in two starts, and errors of another
kind still differ. What it keeps on purpose: the exception's words, the errno of ``[Errno N]``
(ENOSPC is not EDQUOT), file and function names with their digits replaced (a checkpoint's name
at the same update is the same name anyway).
"""

from __future__ import annotations

import re

SIGNATURE_CHARS = 200  # a message's normalized head that names its kind (a report keeps 300 chars)

# in the order applied: a size with its unit first (1020.00 MiB and 1.00 GiB are one kind), then
# addresses, hashes, temporaries and their paths, then any number left (an errno excepted)
_SIZE = re.compile(r"\d+(?:\.\d+)?\s*(?:[KMGTP]i?B|[kKMGTP]B|bytes|B)\b")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")
_HASH = re.compile(r"\b[0-9a-fA-F]{12,}\b")
_TEMP_PATH = re.compile(r"(?:/tmp|/var/tmp|/dev/shm)/[^\s'\":,;)\]]+")
_TEMP_NAME = re.compile(r"\.[^\s/'\"]+\.\d+\.tmp\b|\btmp[a-z0-9_]{6,}\b")
_NUMBER = re.compile(r"(?<!\[Errno )\d+(?:\.\d+)?")
_SPACES = re.compile(r"\s+")


def normalize(message: str) -> str:
    """``message`` with its volatile parts replaced (see the module docstring)."""
    text = _SIZE.sub("<size>", message)
    text = _HEX.sub("<addr>", text)
    text = _HASH.sub("<hash>", text)
    text = _TEMP_PATH.sub("<tmp>", text)
    text = _TEMP_NAME.sub("<tmp>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACES.sub(" ", text).strip()


def kind(message: str) -> str:
    """The head of ``normalize(message)`` that says its kind (a report keeps a message's first
    line up to a length: the cut moves with the numbers before it)."""
    return normalize(message)[:SIGNATURE_CHARS]
