"""Where the raw text comes from, checked before any work: the wikitext-103-raw zip read in place,
its extracted directory, or a directory of ``.txt`` files split by ratio.

    wikitext-103-raw-v1.zip        wikitext-103-raw/wiki.{train,valid,test}.raw, never extracted
    wikitext-103-raw/              wiki.{train,valid,test}.raw
    any directory of *.txt         all of them (sorted, recursively) as one stream of lines: the
                                   first --ratios share of the lines is train, then valid, test

Every file is scanned once in full (``scan``) before encoding starts: sha256 and size for the
manifest, the line count for the progress bar and the split points, and the checks that make bad
input one line instead of a traceback half-way: not UTF-8, a NUL byte (binary), no text at all.
Lines are what Python's text mode reads (``\\n``, ``\\r\\n`` and ``\\r`` end one), as in fairseq's
``multiprocessing_bpe_encoder.py``.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import io
import itertools
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hpc_train.data.base import SPLITS, DataError

# sha256 of the released wikitext zips (s3://research.metamind.io/wikitext/), for `--sha256`.
PUBLISHED_SHA256 = {
    "wikitext-103-raw-v1.zip": "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794",
    "wikitext-2-raw-v1.zip": "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
}
PUBLISHED = "published"  # `--sha256` without a value: the published sha256 of the zip's name
DEFAULT_RATIOS = (0.9, 0.05, 0.05)
BLOCK = 1 << 20
SNIFF = 1 << 16  # bytes of each file checked before a job is submitted


# --- one text file (or zip member) --------------------------------------------------------------


@dataclass(frozen=True)
class TextFile:
    path: Path
    member: str | None = None  # a file inside the zip at ``path``

    @property
    def name(self) -> str:
        return f"{self.path}:{self.member}" if self.member else str(self.path)

    def size(self) -> int:
        if self.member is None:
            return self.path.stat().st_size
        with zipfile.ZipFile(self.path) as zf:
            return zf.getinfo(self.member).file_size

    @contextlib.contextmanager
    def open_binary(self) -> Iterator[IO[bytes]]:
        if self.member is None:
            with self.path.open("rb") as fh:
                yield fh
        else:
            with zipfile.ZipFile(self.path) as zf, zf.open(self.member) as fh:
                yield fh

    @contextlib.contextmanager
    def open_text(self) -> Iterator[IO[str]]:
        with self.open_binary() as raw, io.TextIOWrapper(raw, encoding="utf-8") as fh:
            yield fh  # newline=None: the line ends fairseq's script sees

    def blocks(self, limit: int | None = None) -> Iterator[bytes]:
        with self.open_binary() as fh:
            left = limit
            while left is None or left > 0:
                block = fh.read(BLOCK if left is None else min(BLOCK, left))
                if not block:
                    return
                left = None if left is None else left - len(block)
                yield block


@dataclass(frozen=True)
class Scan:
    sha256: str
    size: int
    lines: int
    has_text: bool  # something other than whitespace


def scan_blocks(blocks: Iterable[bytes], final: bool = True) -> Scan:
    """Hash, size and count the lines of a byte stream; ValueError (with the byte offset) when it
    is not UTF-8 text. ``final=False`` accepts a character cut at the end (a sniffed prefix)."""
    digest, size, lines, has_text, last = hashlib.sha256(), 0, 0, False, ""
    decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(), True)
    for block in blocks:
        nul = block.find(b"\0")
        if nul >= 0:
            raise ValueError(f"not UTF-8 text (NUL byte at offset {size + nul}): binary?")
        try:
            text = decoder.decode(block)
        except UnicodeDecodeError as err:
            raise ValueError(
                f"not UTF-8 text (invalid byte near offset {size + err.start})"
            ) from None
        digest.update(block)
        size += len(block)
        lines += text.count("\n")
        has_text = has_text or (bool(text) and not text.isspace())
        last = text[-1:] or last
    if final:
        try:
            tail = decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ValueError(f"not UTF-8 text (cut character at offset {size})") from None
        lines += tail.count("\n")
        last = tail[-1:] or last
        if last not in ("", "\n"):  # a last line without a line end is a line
            lines += 1
    return Scan(digest.hexdigest(), size, lines, has_text)


def scan(file: TextFile, limit: int | None = None) -> Scan:
    """``scan_blocks`` of a file (its first ``limit`` bytes only: a quick check)."""
    try:
        return scan_blocks(file.blocks(limit), final=limit is None)
    except ValueError as err:
        raise DataError(f"{file.name}: {err}") from None
    except OSError as err:
        raise DataError(f"{file.name}: cannot read ({err.strerror or err})") from None


# --- splits -----------------------------------------------------------------------------------


def parse_ratios(text: str) -> tuple[float, float, float]:
    """``0.9,0.05,0.05`` → train, valid, test shares (test may be 0); ValueError otherwise."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r}: expected three numbers, e.g. 0.9,0.05,0.05") from None
    if len(values) != 3 or any(v < 0 for v in values) or abs(sum(values) - 1) > 1e-6:
        raise ValueError(f"{text!r}: expected three shares >= 0 that sum to 1, e.g. 0.9,0.05,0.05")
    if values[0] == 0 or values[1] == 0:
        raise ValueError(f"{text!r}: train and valid need a share above 0")
    return values[0], values[1], values[2]


def split_points(total: int, ratios: Sequence[float]) -> list[tuple[int, int]]:
    """Line ranges [start, stop) of each split: consecutive, together exactly ``total``."""
    bounds, cumulative = [0], 0.0
    for share in ratios[:-1]:
        cumulative += share
        bounds.append(round(total * cumulative))
    bounds.append(total)
    return list(itertools.pairwise(bounds))


def assign(file_lines: Sequence[int], start: int, stop: int) -> list[tuple[int, int, int]]:
    """Lines [start, stop) of the files read one after the other, as (file index, first line,
    end line) within each file touched."""
    parts, offset = [], 0
    for index, n in enumerate(file_lines):
        lo, hi = max(start, offset), min(stop, offset + n)
        if lo < hi:
            parts.append((index, lo - offset, hi - offset))
        offset += n
    return parts


@dataclass(frozen=True)
class Part:
    file: TextFile
    scan: Scan
    start: int
    stop: int

    def identity(self) -> dict[str, Any]:
        """What the manifest records about this part of a split's source."""
        out: dict[str, Any] = {"file": str(self.file.path)}
        if self.file.member:
            out["member"] = self.file.member
        out.update(sha256=self.scan.sha256, size=self.scan.size)
        if (self.start, self.stop) != (0, self.scan.lines):
            out["lines"] = [self.start, self.stop]
        return out


@dataclass(frozen=True)
class Split:
    name: str
    parts: tuple[Part, ...]

    @property
    def lines(self) -> int:
        return sum(p.stop - p.start for p in self.parts)

    def identity(self) -> list[dict[str, Any]]:
        return [p.identity() for p in self.parts]

    def read(self) -> Iterator[str]:
        for part in self.parts:
            with part.file.open_text() as fh:
                yield from itertools.islice(fh, part.start, part.stop)


def chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(lines)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


# --- the kinds of source ------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    kind: str  # wikitext-zip | wikitext-dir | text-dir | demo
    path: Path
    files: Mapping[str, tuple[TextFile, ...]]  # per split; text-dir: {"all": every .txt}
    ratios: tuple[float, float, float] | None = None
    zip_sha256: str | None = None  # checked against --sha256

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "path": str(self.path)}
        if self.zip_sha256:
            out["sha256"] = self.zip_sha256
        if self.ratios:
            out["ratios"] = list(self.ratios)
        return out

    def sniff(self) -> None:
        """The quick check (before a job is submitted): the first bytes of every file."""
        for file in itertools.chain.from_iterable(self.files.values()):
            if scan(file, limit=SNIFF).size == 0:
                raise DataError(f"{file.name}: empty")

    def splits(self) -> dict[str, Split]:
        """Scan every file in full and cut the splits; DataError for anything unusable."""
        if self.ratios is None:
            out = {}
            for split, files in self.files.items():
                parts = tuple(_whole(f, scan(f)) for f in files)
                if not any(p.scan.has_text for p in parts):
                    raise DataError(f"{files[0].name}: empty or only blank lines (no {split} text)")
                out[split] = Split(split, parts)
            return out
        files = self.files["all"]
        scans = [scan(f) for f in files]
        total = sum(s.lines for s in scans)
        out = {}
        for split, (start, stop), share in zip(
            SPLITS, split_points(total, self.ratios), self.ratios, strict=True
        ):
            if share == 0:
                continue
            if stop <= start:
                raise DataError(
                    f"{self.path}: the {split} split is empty ({total} lines in {len(files)} "
                    f".txt files, ratios {','.join(map(str, self.ratios))})"
                )
            pieces = assign([s.lines for s in scans], start, stop)
            out[split] = Split(split, tuple(Part(files[i], scans[i], a, b) for i, a, b in pieces))
        return out


def _whole(file: TextFile, scanned: Scan) -> Part:
    return Part(file, scanned, 0, scanned.lines)


def expected_sha256(zip_path: Path, wanted: str) -> str:
    if wanted != PUBLISHED:
        if len(wanted) != 64 or any(c not in "0123456789abcdef" for c in wanted.lower()):
            raise DataError(f"--sha256 {wanted}: not a sha256 (64 hex digits)")
        return wanted.lower()
    if zip_path.name not in PUBLISHED_SHA256:
        known = ", ".join(PUBLISHED_SHA256)
        raise DataError(f"--sha256: no published sha256 for {zip_path.name} (known: {known})")
    return PUBLISHED_SHA256[zip_path.name]


def wikitext_zip(path: Path, sha256: str | None) -> Source:
    digest = None
    if sha256 is not None:
        expected = expected_sha256(path, sha256)
        digest = scan_sha256(path)
        if digest != expected:
            raise DataError(f"{path}: sha256 {digest} does not match the expected {expected}")
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/")]
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(f"{path}: not a readable zip ({err})") from None
    files = {}
    for split in SPLITS:
        found = [n for n in names if n.rpartition("/")[2] == f"wiki.{split}.raw"]
        if len(found) != 1:
            what = "no" if not found else f"{len(found)} files named"
            raise DataError(
                f"{path}: {what} wiki.{split}.raw inside "
                "(expected wikitext-103-raw/wiki.{train,valid,test}.raw)"
            )
        files[split] = (TextFile(path, found[0]),)
    return Source("wikitext-zip", path, files, zip_sha256=digest)


def scan_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def find(raw: Path, ratios: tuple[float, float, float] | None, sha256: str | None) -> Source:
    """The source at ``raw`` (layout checks only; ``Source.splits`` reads the files)."""
    if not raw.exists():
        raise DataError(f"--raw {raw}: no such file or directory")
    if raw.is_file():
        if not zipfile.is_zipfile(raw):
            raise DataError(f"--raw {raw}: not a zip file (give the zip or a directory)")
        if ratios is not None:
            raise DataError("--ratios applies to a directory of .txt files, not to a zip")
        return wikitext_zip(raw, sha256)
    if sha256 is not None:
        raise DataError(f"--sha256 checks a zip; {raw} is a directory")
    if any((raw / f"wiki.{s}.raw").exists() for s in SPLITS):
        if ratios is not None:
            raise DataError(f"--ratios applies to a directory of .txt files; {raw} has wiki.*.raw")
        for split in SPLITS:
            if not (raw / f"wiki.{split}.raw").is_file():
                raise DataError(
                    f"--raw {raw}: no wiki.{split}.raw (expected wiki.{{train,valid,test}}.raw)"
                )
        return Source("wikitext-dir", raw, {s: (TextFile(raw / f"wiki.{s}.raw"),) for s in SPLITS})
    texts = sorted(p for p in raw.rglob("*.txt") if p.is_file())
    if not texts:
        raise DataError(
            f"--raw {raw}: no wiki.train.raw and no .txt files (expected wikitext-103-raw's "
            "layout, its zip, or a directory of .txt files)"
        )
    files = tuple(TextFile(p) for p in texts)
    return Source("text-dir", raw, {"all": files}, ratios=ratios or DEFAULT_RATIOS)


def split_files(kind: str, directory: Path, names: dict[str, str]) -> Source:
    """A source of one file per split, e.g. ``{"train": "train.txt"}`` (the demo's)."""
    return Source(kind, directory, {s: (TextFile(directory / n),) for s, n in names.items()})
