"""hpc_core.integrity: the digest sealed into a torch.save archive right after it is written, and
the one read that checks it and every record's CRC32. Real torch.save archives (small ones,
written here); the flipped bits are real bits flipped in the file. The same on a real fairseq
checkpoint: tests/hpc_train/worker/test_verified_checkpoints.py."""

from __future__ import annotations

import hashlib
import struct
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

from hpc_core import integrity


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"model": {"w": torch.randn(32, 32, generator=g), "b": torch.randn(32, generator=g)},
            "optimizer_history": [{"num_updates": 7}]}  # fmt: skip


def write(path: Path, obj: object) -> str | None:
    torch.save(obj, path)
    return integrity.seal(path)


def skeleton(path: Path) -> str:
    """The digest, computed here the plain way: every byte of the file before the comment,
    each record's bytes replaced by their CRC32 and length (little-endian, 4 and 8 bytes)."""
    data = path.read_bytes()
    comment = zipfile.ZipFile(path).comment
    sha, at = hashlib.sha256(), 0
    for info in sorted(zipfile.ZipFile(path).infolist(), key=lambda i: i.header_offset):
        name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
        start = info.header_offset + 30 + name_len + extra_len
        sha.update(data[at:start])
        sha.update(struct.pack("<IQ", zlib.crc32(data[start : start + info.compress_size]),
                               info.compress_size))  # fmt: skip
        at = start + info.compress_size
    sha.update(data[at : len(data) - len(comment)])
    return sha.hexdigest()


def flipped(path: Path, bit: int, to: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    to.write_bytes(bytes(data))
    return to


def test_the_digest_is_sealed_into_the_zip_comment_and_torch_and_zipfile_read_it(tmp_path):
    path = tmp_path / "c.pt"
    digest = write(path, state())
    comment = zipfile.ZipFile(path).comment
    assert comment == b"hpc-train sha256:" + digest.encode()
    assert skeleton(path) == digest  # computed the plain way
    assert zipfile.ZipFile(path).testzip() is None
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["model"]["w"], state()["model"]["w"])
    assert integrity.recorded(path) == digest
    check = integrity.verify(path)
    assert check.ok and check.sha256 == digest and check.bytes == path.stat().st_size
    assert check.records == len(zipfile.ZipFile(path).infolist())
    assert integrity.seal(path) is None  # sealed once: left as it is


def test_bytes_that_are_no_zip_are_left_as_they_are(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"not a zip archive" * 10)
    assert integrity.seal(path) is None
    assert path.read_bytes() == b"not a zip archive" * 10


def test_a_write_that_does_not_read_back_whole_is_refused_before_its_rename(tmp_path):
    """A bit flipped in a record between torch's write and the seal (a bad write): the seal
    reads the records back, refuses it, and leaves the file as torch wrote it."""
    path = tmp_path / "c.pt"
    torch.save(state(), path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(integrity.CorruptCheckpoint, match="CRC32 mismatch in record"):
        integrity.seal(path)
    assert path.read_bytes() == bytes(data)


def test_a_file_torch_wrote_alone_verifies_by_its_crcs_and_says_so(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save(state(), path)
    check = integrity.verify(path)
    assert check.ok and check.sha256 is None
    assert "no digest recorded" in check.describe()
    bad = flipped(path, 8 * (path.stat().st_size // 2), tmp_path / "bad.pt")
    assert torch.load(bad, weights_only=True)  # torch loads it: nothing checks the CRCs ...
    assert "CRC32 mismatch in record" in integrity.verify(bad).problem  # ... but this


def test_a_bit_flipped_in_every_byte_of_a_small_checkpoint_is_caught(tmp_path):
    """One bit of each of the file's bytes in turn (the bit moving through 0..7): payload,
    local headers and their padding, the central directory, the end record, the comment."""
    path = tmp_path / "c.pt"
    write(path, {"w": torch.arange(4.0)})
    size = path.stat().st_size
    bits = [8 * i + i % 8 for i in range(size)]
    missed = [b for b in bits if integrity.verify(flipped(path, b, tmp_path / "f")).ok]
    assert size > 1000 and missed == []


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.01])
def test_a_truncated_file_fails_the_cheap_check_and_the_full_one(tmp_path, keep):
    path = tmp_path / "c.pt"
    write(path, state())
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    assert "truncated" in integrity.end_problem(path)
    assert "truncated" in integrity.verify(path).problem


def test_a_damaged_comment_or_end_record_is_caught_cheaply(tmp_path):
    path = tmp_path / "c.pt"
    write(path, state())
    size = path.stat().st_size
    comment_at = size - 81  # "hpc-train sha256:" + 64 hex digits
    assert "digest record" in integrity.end_problem(flipped(path, 8 * comment_at, tmp_path / "a"))
    length_at = size - 81 - 2  # the end record's comment length
    assert integrity.end_problem(flipped(path, 8 * length_at, tmp_path / "b")) is not None
    assert integrity.end_problem(path) is None


def test_missing_empty_and_unreadable(tmp_path):
    assert integrity.verify(tmp_path / "nothing.pt").problem == "missing"
    (tmp_path / "empty.pt").write_bytes(b"")
    assert integrity.verify(tmp_path / "empty.pt").problem == "empty (0 bytes)"
    assert integrity.end_problem(tmp_path / "nothing.pt") == "missing"
    assert integrity.recorded(tmp_path / "nothing.pt") is None


def test_a_file_of_many_blocks_is_read_once_with_the_digest_beside_the_crcs(tmp_path, monkeypatch):
    """Blocks smaller than the records (as a multi-GB file's records are to 8 MiB blocks): the
    CRC of a record that spans blocks, headers that straddle a block's end; a flip in the last
    block is still caught."""
    monkeypatch.setattr(integrity, "BLOCK", 4096)
    path = tmp_path / "c.pt"
    write(path, {f"t{i}": torch.full((3000 + 37 * i,), float(i)) for i in range(12)})
    assert path.stat().st_size > 20 * 4096
    reads: list[int] = []
    real = integrity.os.preadv

    def counted(fd, buffers, offset):
        n = real(fd, buffers, offset)
        reads.append(n)
        return n

    monkeypatch.setattr(integrity.os, "preadv", counted)
    assert integrity.verify(path).ok
    assert sum(reads) == path.stat().st_size - 81  # every byte before the comment, once
    monkeypatch.setattr(integrity.os, "preadv", real)
    for bit in (8 * 100, 8 * (path.stat().st_size // 2) + 3, 8 * (path.stat().st_size - 200)):
        assert not integrity.verify(flipped(path, bit, tmp_path / "f")).ok
