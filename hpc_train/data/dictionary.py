"""The fairseq dictionary: checking a given one (``--srcdict``, e.g. GPT-2's ``dict.txt`` for
compatibility with released RoBERTa checkpoints) and reading what ``fairseq-preprocess`` says
about each split (sentences, tokens, the share it had to replace by ``<unk>``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hpc_train.data.base import DataError
from hpc_train.data.bpe import GPT2_VOCAB

# fairseq's "[None] /stage/train.bpe: 2400 sents, 61234 tokens, 0.0% replaced (by <unk>)"
SUMMARY_RE = re.compile(
    r"\] (?P<path>\S+): (?P<sents>\d+) sents, (?P<tokens>\d+) tokens"
    r"(?:, (?P<replaced>[0-9.eE+-]+)% replaced)?"
)
PLACEHOLDER_RE = re.compile(r"madeupword\d+")  # fairseq's padding symbols in GPT-2's dict.txt
OVERWRITE = "#fairseq:overwrite"


def check_srcdict(path: Path) -> int:
    """Symbols in a fairseq dictionary of GPT-2 BPE ids; DataError (one line) unless it is one:
    ``<symbol> <count>`` per line, symbols GPT-2 ids (0..50256) or ``madeupwordNNNN``, once each."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"--srcdict {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"--srcdict {path}: cannot read it as text ({err})") from None
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.rstrip().split(" ")
        if fields and fields[-1] == OVERWRITE:
            fields = fields[:-1]
        if len(fields) != 2 or not fields[1].isdigit():
            raise DataError(f"--srcdict {path}:{number}: not a fairseq dictionary line: {line!r}")
        symbol = fields[0]
        gpt2_id = symbol.isdigit() and int(symbol) < GPT2_VOCAB
        if not gpt2_id and not PLACEHOLDER_RE.fullmatch(symbol):
            raise DataError(
                f"--srcdict {path}:{number}: {symbol!r} is not a GPT-2 BPE id "
                "(this dictionary is for another vocabulary)"
            )
        if symbol in seen:
            raise DataError(f"--srcdict {path}:{number}: {symbol!r} listed twice")
        seen.add(symbol)
    if not seen:
        raise DataError(f"--srcdict {path}: empty")
    return len(seen)


@dataclass(frozen=True)
class Summary:
    sentences: int
    tokens: int  # fairseq's count: BPE tokens + one end-of-sentence per line
    replaced_percent: float


def summaries(output: str) -> dict[str, Summary]:
    """fairseq-preprocess's per-file summaries, by file name (``train.bpe``)."""
    out = {}
    for match in SUMMARY_RE.finditer(output):
        out[Path(match["path"]).name] = Summary(
            int(match["sents"]), int(match["tokens"]), float(match["replaced"] or 0)
        )
    return out


def symbols(dict_txt: Path) -> int:
    with dict_txt.open(encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())
