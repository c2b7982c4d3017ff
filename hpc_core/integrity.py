"""A checkpoint file that proves itself whole: a digest recorded as it is written, and one read
that checks the digest and every record's CRC32.

``torch.save`` writes a zip archive: one record per storage and one for the pickle, stored (not
compressed), each with the CRC32 of its bytes in its local header and in the central directory
at the end of the file, then the end record. ``torch.load`` checks none of those CRCs (with or
without ``mmap``): a bit flipped inside a tensor loads, as a wrong weight. Two checks close that:

- **every record's CRC32**, as torch wrote it; it covers the records' bytes, not their headers,
  the alignment padding torch puts in them, the central directory or the end record;
- **a digest of the whole file**: ``DigestWriter`` stands between ``torch.save`` and the file and
  hashes (sha256) the bytes as they pass; when torch has written its end record, the writer puts
  ``hpc-train sha256:<64 hex digits>`` in the archive's comment (the end record's last field, the
  one place of a zip archive meant for free text). The digest covers every byte before the
  comment, the end record with the comment's length included. A flipped bit anywhere in the file
  changes the digest, or breaks the comment or the end record's place.

Why in the file and not in a sidecar or the ledger: the digest becomes visible with the same
rename that makes the checkpoint visible (no moment at which a checkpoint and its record
disagree, no record without its file), it travels with every copy and every hard link
(fairseq's ``checkpoint_last.pt`` is a link to the newest interval checkpoint: one inode, one
record), and nothing is left behind when fairseq deletes an old checkpoint. torch and Python's
``zipfile`` read an archive with a comment as any other. The ledger's checkpoint event repeats
the digest, as a record for people (``worker.ledger_hooks``).

``verify(path)`` reads the file once, front to back, in large blocks: each block updates the
digest and the CRC32 of the records it holds (their places from the central directory, read
first from the end of the file). A file without a comment (written by torch or fairseq alone) is
verified by its CRCs only, and says so. ``end_problem`` is the cheap part: the end record where
it must be and the comment well-formed (a truncated file fails here). A file that fails is set
aside (``set_aside``: renamed beside itself, never deleted; ``CorruptCheckpoint`` says so).

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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hpc_core.rundir import set_aside_name

END = b"PK\x05\x06"  # the end of central directory record's signature
END_LEN = 22  # its fixed part; the comment's length is its last two bytes
LOCAL = b"PK\x03\x04"  # a local file header's signature
LOCAL_LEN = 30
TAG = b"hpc-train sha256:"
RECORD_RE = re.compile(rb"hpc-train sha256:([0-9a-f]{64})")
TAIL_MAX = END_LEN + 0xFFFF  # the end record and the longest comment a zip archive can have
BLOCK = 8 << 20  # the read size of ``verify``
RING = 3  # blocks in flight: read, CRCs and digest overlap


class DigestWriter:
    """A binary file ``torch.save`` writes through: every byte hashed as it passes; ``finish``
    puts the digest in the archive's comment (see the module docstring).

    The last 22 bytes written are held back until ``finish``: they are torch's end record, whose
    comment length changes. Anything that is not a zip archive is passed through unchanged and
    gets no record (``finish`` returns None)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self._sha = hashlib.sha256()
        self._tail = b""
        self.size = 0  # bytes written to ``raw`` so far

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if n >= END_LEN:
            self._pass(self._tail)
            self._pass(view[: n - END_LEN])
            self._tail = bytes(view[n - END_LEN :])
        else:
            joined = self._tail + bytes(view)
            cut = max(0, len(joined) - END_LEN)
            self._pass(joined[:cut])
            self._tail = joined[cut:]
        return n

    def _pass(self, chunk: bytes | memoryview) -> None:
        if len(chunk):
            self._sha.update(chunk)
            self.raw.write(chunk)
            self.size += len(chunk)

    def flush(self) -> None:
        self.raw.flush()

    def finish(self) -> str | None:
        """Write what was held back, with the digest in the comment when it is torch's end
        record (an empty comment); the digest (hex), or None when the bytes are no zip."""
        tail, self._tail = self._tail, b""
        if len(tail) != END_LEN or not tail.startswith(END) or tail[20:] != b"\0\0":
            self._pass(tail)
            return None
        end = tail[:20] + struct.pack("<H", len(TAG) + 64)
        self._sha.update(end)
        digest = self._sha.hexdigest()
        self.raw.write(end + TAG + digest.encode())
        self.size += END_LEN + len(TAG) + 64
        return digest


@dataclass(frozen=True)
class Check:
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


class _Crcs:
    """The records' CRC32s, computed from the blocks of one front-to-back read (``feed``)."""

    def __init__(self, fd: int, records: list[_Record]) -> None:
        self.fd, self.records = fd, records
        self.i = 0  # the record being read
        self.span: tuple[int, int] | None = None  # where its bytes are, once its header is read
        self.crc = 0

    def feed(self, block: memoryview, pos: int) -> str | None:
        """The bytes [pos, pos + len(block)); a problem (str) as soon as one is found."""
        end = pos + len(block)
        while self.i < len(self.records) and self.records[self.i].offset < end:
            rec = self.records[self.i]
            if self.span is None:
                span = _data_span(self.fd, block, pos, rec)
                if isinstance(span, str):
                    return span
                self.span, self.crc = span, 0
            a, b = max(self.span[0], pos), min(self.span[1], end)
            if a < b:
                self.crc = zlib.crc32(block[a - pos : b - pos], self.crc)
            if self.span[1] > end:
                return None
            if self.crc != rec.crc:
                return f"CRC32 mismatch in record {rec.name}"
            self.i, self.span = self.i + 1, None
        return None

    def done(self) -> bool:
        return self.i == len(self.records)


def _stream(fd: int, stop: int, records: list[_Record], sha: Any) -> str | None:
    """One read of bytes [0, stop): each record's CRC32 computed and compared in this thread,
    ``sha`` (None: no digest to check) updated with every block on another (both release the
    GIL: a second core does the digest). A problem (str), or None."""
    crcs = _Crcs(fd, records)
    size = min(BLOCK, stop)
    ring = [memoryview(bytearray(size)) for _ in range(RING if stop > BLOCK else 1)]
    hashing: list[Future[None] | None] = [None] * RING  # the digest's use of each buffer
    with ThreadPoolExecutor(1, thread_name_prefix="digest") as digest:
        pos, k = 0, 0
        while pos < stop:
            slot = k % len(ring)
            if hashing[slot] is not None:
                hashing[slot].result()  # type: ignore[union-attr]  # the buffer is free again
            n = os.preadv(fd, [ring[slot][: min(BLOCK, stop - pos)]], pos)
            if not n:
                return "shorter than its central directory says"
            block = ring[slot][:n]
            if sha is not None and stop > BLOCK:
                hashing[slot] = digest.submit(sha.update, block)
            elif sha is not None:  # one block: no thread to wait for
                sha.update(block)
            problem = crcs.feed(block, pos)
            if problem is not None:
                return problem
            pos, k = pos + n, k + 1
    return None if crcs.done() else "shorter than its central directory says"


def verify(path: Path | str) -> Check:
    """Read ``path`` once and check its end record, every record's CRC32 and the digest
    recorded when it was written (see the module docstring). Never raises for a bad file."""
    path, began = Path(path), time.monotonic()
    try:
        with open(path, "rb") as fh:
            fd = fh.fileno()
            size = os.fstat(fd).st_size
            end = _end(fd, size) if size else "empty (0 bytes)"
            if isinstance(end, str):
                return Check(path, end, bytes=size)
            records = _records(fh, end.at)
            if isinstance(records, str):
                return Check(path, records, end.digest, bytes=size)
            sha = hashlib.sha256() if end.digest else None
            problem = _stream(fd, end.at + END_LEN, records, sha)
    except FileNotFoundError:
        return Check(path, "missing")
    except OSError as err:
        return Check(path, f"unreadable: {err}")
    if problem is None and sha is not None and end.digest and sha.hexdigest() != end.digest:
        problem = f"sha256 {sha.hexdigest()[:12]}... is not the {end.digest[:12]}... recorded"
    return Check(path, problem, end.digest, len(records), size, time.monotonic() - began)


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
