"""A checkpoint file that proves itself whole: a digest sealed into it as it is written, and one
read that checks the digest and every record's CRC32.

``torch.save`` writes a zip archive: one record per storage and one for the pickle, stored (not
compressed), each with the CRC32 of its bytes in its local header and in the central directory
at the end of the file, then the end record. ``torch.load`` checks none of those CRCs (with or
without ``mmap``): a bit flipped inside a tensor loads, as a wrong weight. Two checks close that:

- **every record's CRC32**, as torch wrote it: it covers the records' bytes;
- **the file's digest**: the sha256 of the file with each record's bytes replaced by the CRC32
  they have and their length (the archive's skeleton: every header, torch's alignment padding,
  the central directory and the end record byte for byte, and each record through its CRC32).
  ``seal`` computes it right after ``torch.save`` has written the file, from the page cache,
  checking every record's CRC32 on the way (a write that came out wrong is never renamed into
  place), and puts ``hpc-train sha256:<64 hex digits>`` into the archive's comment, the end
  record's last field, the one place of a zip archive meant for free text. A flipped bit anywhere
  in the file changes the digest (a header, the padding, the directory), a record's CRC32 (its
  bytes: every burst of up to 32 bits, and all but 1 in 2^32 of any other change), or breaks the
  comment or the end record's place.

Why the skeleton and not the sha256 of every byte: measured on a roberta-large checkpoint
(``make bench-verify``), sha256 runs at ~2 GB/s on one core, slower than ``torch.load`` reads
the file from the page cache (2.4-3 GB/s): a plain whole-file sha256 beside the load added 81 %
(warm) to it; the CRCs, which the check needs anyway, run at ~5 GB/s. Why in the file and not in
a sidecar or the ledger: the digest becomes visible with the same rename that makes the
checkpoint visible (no moment at which a checkpoint and its record disagree, no record without
its file), it travels with every copy and every hard link (fairseq's ``checkpoint_last.pt`` is a
link to the newest interval checkpoint: one inode, one record), and nothing is left behind when
fairseq deletes an old checkpoint. torch and Python's ``zipfile`` read an archive with a comment
as any other. The ledger's checkpoint event repeats the digest, as a record for people
(``worker.ledger_hooks``).

``verify(path)`` reads the file once, front to back, in large blocks: each block goes to the
CRC32 of the records it holds and the rest to the digest (the records' places from the central
directory, read first from the end of the file). A file without a comment (written by torch or
fairseq alone) is verified by its CRCs only, and says so. ``end_problem`` is the cheap part: the
end record where it must be and the comment well-formed (a truncated file fails here). A file
that fails is set aside (``set_aside``: renamed beside itself, never deleted;
``CorruptCheckpoint`` says so).

Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hpc_core.rundir import set_aside_name

END = b"PK\x05\x06"  # the end of central directory record's signature
END_LEN = 22  # its fixed part; the comment's length is its last two bytes
LOCAL = b"PK\x03\x04"  # a local file header's signature
LOCAL_LEN = 30
TAG = b"hpc-train sha256:"
RECORD_RE = re.compile(rb"hpc-train sha256:([0-9a-f]{64})")
TAIL_MAX = END_LEN + 0xFFFF  # the end record and the longest comment a zip archive can have
BLOCK = 8 << 20  # the read size of ``verify``


@dataclass(frozen=True)
class IntegrityCheck:
    """What ``verify`` found: ``problem`` None when the file is whole; ``sha256`` the digest
    recorded when it was written (None: none recorded, the CRCs alone were checked)."""

    path: Path
    problem: str | None
    sha256: str | None = None
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        if self.problem is not None:
            return f"{self.path.name}: {self.problem}"
        what = f"{self.records} record CRC32s"
        what += f" and its sha256 {self.sha256[:12]}..." if self.sha256 else " (no digest recorded)"
        return f"{self.path.name}: {what} verified ({self.bytes:,} bytes in {self.seconds:.2f} s)"


@dataclass(frozen=True)
class _End:
    at: int  # where the end record begins
    digest: str | None  # recorded in the comment


def _end(fd: int, size: int) -> _End | str:
    """The end record at its one right place (its comment reaching the file's last byte) and
    the digest in its comment; a problem (str) otherwise."""
    start = max(0, size - TAIL_MAX)
    tail = os.pread(fd, size - start, start)
    at = tail.rfind(END)
    while at >= 0:
        fits = at + END_LEN <= len(tail)
        if fits and at + END_LEN + struct.unpack_from("<H", tail, at + 20)[0] == len(tail):
            comment = tail[at + END_LEN :]
            if not comment:
                return _End(start + at, None)
            found = RECORD_RE.fullmatch(comment)
            if found is None:
                return "its digest record (the zip comment) is damaged"
            return _End(start + at, found.group(1).decode())
        at = tail.rfind(END, 0, at)
    return "truncated or garbage: no zip end record where it belongs"


def _read_end(path: Path) -> _End | str:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            return _end(fh.fileno(), size) if size else "empty (0 bytes)"
    except FileNotFoundError:
        return "missing"
    except OSError as err:
        return f"unreadable: {err}"


def end_problem(path: Path) -> str | None:
    """The cheap check (one read of the file's last 64 KiB at most): the end record where it
    belongs and the digest record, if any, well-formed. None: fine so far."""
    found = _read_end(path)
    return found if isinstance(found, str) else None


def recorded(path: Path) -> str | None:
    """The digest recorded in ``path`` as it was written (None: none, or no whole end)."""
    found = _read_end(path)
    return None if isinstance(found, str) else found.digest


@dataclass(frozen=True)
class _Record:
    name: str
    offset: int  # of its local header
    size: int
    crc: int


def _records(fh: IO[bytes], end_at: int) -> list[_Record] | str:
    """The records the central directory lists, by place; a problem (str) when it is unreadable,
    compressed or reaches past the end record."""
    try:
        infos = zipfile.ZipFile(fh).infolist()
    except Exception as err:  # zipfile raises many kinds for a damaged directory
        return f"its central directory is unreadable ({err})"
    records = []
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            return f"record {info.filename} is compressed: not written by torch.save"
        records.append(_Record(info.filename, info.header_offset, info.compress_size, info.CRC))
    records.sort(key=lambda r: r.offset)
    if records and records[-1].offset + LOCAL_LEN + records[-1].size > end_at:
        return "a record reaches past the end record"
    return records


def _data_span(fd: int, block: memoryview, pos: int, rec: _Record) -> tuple[int, int] | str:
    """Where ``rec``'s bytes begin and end, from its local header (in ``block``, read at ``pos``,
    or read on its own when it straddles the block)."""
    at = rec.offset - pos
    head = bytes(block[at : at + LOCAL_LEN]) if at >= 0 else b""
    if len(head) < LOCAL_LEN:
        head = os.pread(fd, LOCAL_LEN, rec.offset)
    if len(head) < LOCAL_LEN or not head.startswith(LOCAL):
        return f"record {rec.name}: its local header is damaged"
    name_len, extra_len = struct.unpack_from("<HH", head, 26)
    name = os.pread(fd, name_len, rec.offset + LOCAL_LEN)
    if name.decode(errors="replace") != rec.name:
        return f"record {rec.name}: its local header names another ({name[:60]!r})"
    start = rec.offset + LOCAL_LEN + name_len + extra_len
    return start, start + rec.size


class _Pass:
    """One front-to-back read of an archive (``feed`` each block in order): every record's CRC32
    computed and compared with its directory's, everything else, and each record's (CRC32,
    length), into the digest (the skeleton: see the module docstring)."""

    def __init__(self, fd: int, records: list[_Record]) -> None:
        self.fd, self.records = fd, records
        self.sha = hashlib.sha256()
        self.i = 0  # the record being read
        self.span: tuple[int, int] | None = None  # where its bytes are, once its header is read
        self.crc = 0

    def feed(self, block: memoryview, pos: int) -> str | None:
        """The bytes [pos, pos + len(block)); a problem (str) as soon as one is found."""
        end, at = pos + len(block), pos
        while at < end:
            if (
                self.span is None
                and self.i < len(self.records)
                and self.records[self.i].offset < end
            ):
                span = _data_span(self.fd, block, pos, self.records[self.i])
                if isinstance(span, str):
                    return span
                self.span, self.crc = span, 0
            if self.span is None or at < self.span[0]:  # headers, padding, directory, end
                stop = end if self.span is None else min(end, self.span[0])
                self.sha.update(block[at - pos : stop - pos])
                at = stop
                continue
            stop = min(self.span[1], end)
            self.crc = zlib.crc32(block[at - pos : stop - pos], self.crc)
            at = stop
            if at == self.span[1] and (problem := self._record_done()) is not None:
                return problem
        return None

    def _record_done(self) -> str | None:
        rec = self.records[self.i]
        if self.crc != rec.crc:
            return f"CRC32 mismatch in record {rec.name}"
        self.sha.update(struct.pack("<IQ", self.crc, rec.size))
        self.i, self.span = self.i + 1, None
        return None

    def read(self, stop: int) -> str | None:
        """Read bytes [0, stop) in ``BLOCK``s; a problem (str), or None when every record was
        whole (``self.sha`` then holds the digest)."""
        view = memoryview(bytearray(min(BLOCK, max(stop, 1))))
        pos = 0
        while pos < stop:
            n = os.preadv(self.fd, [view[: min(len(view), stop - pos)]], pos)
            if not n:
                return "shorter than its central directory says"
            if (problem := self.feed(view[:n], pos)) is not None:
                return problem
            pos += n
        if self.span is not None and self.span[0] == self.span[1] == stop:
            return self._record_done()  # an empty record at the very end (never torch's)
        return None if self.i == len(self.records) else "shorter than its central directory says"


def _skeleton(fd: int, end: _End) -> tuple[str | None, str, int]:
    """(a problem or None, the digest, the records) of the archive open at ``fd`` whose end
    record is ``end``: one ``_Pass`` over every byte up to the comment."""
    with open(fd, "rb", closefd=False) as fh:
        records = _records(fh, end.at)
    if isinstance(records, str):
        return records, "", 0
    one = _Pass(fd, records)
    problem = one.read(end.at + END_LEN)
    return problem, one.sha.hexdigest(), len(records)


def seal(path: Path) -> str | None:
    """Right after ``torch.save`` wrote the archive ``path`` (flushed, not yet renamed into
    place): check every record's CRC32, compute the digest and put it in the comment; the
    digest, or None when the file is no zip with an empty comment (left as it is).
    CorruptCheckpoint when a record's bytes do not match their CRC32: the write came out wrong."""
    with open(path, "r+b") as fh:
        fd = fh.fileno()
        size = os.fstat(fd).st_size
        end = _end(fd, size) if size else None
        if not isinstance(end, _End) or end.digest is not None or end.at + END_LEN != size:
            return None
        os.pwrite(fd, struct.pack("<H", len(TAG) + 64), end.at + 20)  # the comment's length
        problem, digest, _ = _skeleton(fd, end)  # first: the digest covers it
        if problem is not None:
            os.pwrite(fd, b"\0\0", end.at + 20)
            raise CorruptCheckpoint(
                f"a checkpoint just written does not read back whole: {problem}"
            )
        os.pwrite(fd, TAG + digest.encode(), size)
    return digest


def verify(path: Path | str) -> IntegrityCheck:
    """Read ``path`` once and check its end record, every record's CRC32 and the digest
    recorded when it was written (see the module docstring). Never raises for a bad file."""
    path, began = Path(path), time.monotonic()
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            end = _end(fh.fileno(), size) if size else "empty (0 bytes)"
            if isinstance(end, str):
                return IntegrityCheck(path, end, bytes=size)
            problem, digest, records = _skeleton(fh.fileno(), end)
    except FileNotFoundError:
        return IntegrityCheck(path, "missing")
    except OSError as err:
        return IntegrityCheck(path, f"unreadable: {err}")
    if problem is None and end.digest is not None and digest != end.digest:
        problem = f"digest {digest[:12]}... is not the {end.digest[:12]}... recorded"
    return IntegrityCheck(path, problem, end.digest, records, size, time.monotonic() - began)


# --- what fails verification ------------------------------------------------------------------


@dataclass(frozen=True)
class SetAside:
    """A checkpoint that failed verification: the name it had, where it went, why."""

    file: str
    moved_to: Path
    why: str

    def describe(self) -> str:
        return f"set aside {self.file} ({self.why}) as {self.moved_to.name}"


class CorruptCheckpoint(RuntimeError):
    """A checkpoint failed verification (as a rank loaded it, or as a copy); ``aside``: where
    it was set aside (None: a copy, never given its name)."""

    aside: SetAside | None = None


def set_aside(path: Path, why: str) -> SetAside:
    """Move ``path`` aside (``rundir.set_aside_name``: renamed beside itself, never deleted)."""
    moved = set_aside_name(path)
    os.replace(path, moved)
    return SetAside(path.name, moved, why)


def refuse_copy(path: Path) -> None:
    """CorruptCheckpoint unless ``path`` verifies: a copy, before it takes its name
    (``rundir.atomic_writer``'s and ``atomic_copy``'s ``check``)."""
    check = verify(path)
    if not check.ok:
        raise CorruptCheckpoint(f"a copy failed verification: {check.describe()}")
