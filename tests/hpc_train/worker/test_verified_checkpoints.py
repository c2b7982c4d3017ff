"""Verified checkpoints on real fairseq checkpoints (the `trained_save_dir` run: the toolkit's
worker, fairseq 0.12, tiny RoBERTa on CPU): the digest recorded as they were written, a flipped
bit anywhere caught before training, a truncated file, a hard-linked bad inode, fairseq's own load
verified beside it. The faults are real: bits flipped in the real file, a file cut short."""

from __future__ import annotations

import os
import re
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from hpc_core import integrity, ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train.worker import checkpoints


@pytest.fixture
def save_dir(trained_save_dir, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained_save_dir, copy)
    return copy


def flip(path: Path, bit: int) -> None:
    with path.open("r+b") as fh:
        fh.seek(bit // 8)
        byte = fh.read(1)[0]
        fh.seek(bit // 8)
        fh.write(bytes([byte ^ (1 << (bit % 8))]))


def regions(path: Path) -> list[tuple[str, int, int]]:
    """(what, first byte, end) of each part of a torch zip archive, in file order: each record's
    local header (its name and torch's alignment padding included), each record's bytes, the
    central directory, the end records and the comment."""
    return [(what, start, end) for what, start, end, _ in named_regions(path)]


def tensor_bytes(path: Path) -> list[tuple[int, int]]:
    """(first byte, end) of each record holding a tensor's storage (``<archive>/data/<n>``), not
    the pickle or torch's other small records: a bit flipped there still unpickles."""
    return [
        (start, end)
        for what, start, end, name in named_regions(path)
        if what == "payload" and re.fullmatch(r"[^/]+/data/\d+", name)
    ]


def named_regions(path: Path) -> list[tuple[str, int, int, str]]:
    found = []
    data = path.read_bytes()
    infos = sorted(zipfile.ZipFile(path).infolist(), key=lambda i: i.header_offset)
    for info in infos:
        name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
        start = info.header_offset + 30 + name_len + extra_len
        found.append(("header", info.header_offset, start, info.filename))
        found.append(("payload", start, start + info.compress_size, info.filename))
    directory = found[-1][2]
    end = data.rfind(b"PK\x05\x06")
    found += [("directory", directory, end, ""), ("end", end, len(data), "")]
    return found


def sample(path: Path, spread: int = 300) -> list[tuple[str, int]]:
    """(region, bit): ``spread`` bits evenly over the whole file, plus one in every header, in
    the directory and in every byte of the end record and the comment."""
    parts = regions(path)
    size = path.stat().st_size
    bits = {(8 * size * k) // spread + k % 8 for k in range(spread)}
    for what, start, end in parts:
        if what == "header":
            bits.add(8 * (start + (end - start) // 2) + 1)
        elif what == "directory":
            bits |= {8 * start, 8 * ((start + end) // 2) + 5}
        elif what == "end":
            bits |= {8 * i + i % 8 for i in range(start, end)}
    where = {b: next(w for w, s, e in parts if s <= b // 8 < e) for b in bits}
    return sorted((where[b], b) for b in bits)


def test_a_real_checkpoint_carries_its_digest_and_verifies(trained_save_dir):
    for path in RunDir(trained_save_dir).checkpoint_files():
        check = integrity.verify(path)
        assert check.ok, check.problem
        assert check.sha256 is not None and check.sha256 == integrity.recorded(path)
        assert check.records > 10  # the pickle and one record per storage


def test_a_flipped_bit_anywhere_is_caught_100_percent_of_a_spread_sample(save_dir, tmp_path):
    """~400 bit positions over checkpoint_last.pt: evenly spread (most land in tensor data),
    one in every record's local header, the central directory, every byte of the end record and
    the digest's comment. Each flipped in a fresh copy: every one fails verification, and the
    rank's verified load refuses it before a step (set aside, CorruptCheckpoint)."""
    last = save_dir / checkpoints.LAST
    positions = sample(last)
    assert {w for w, _ in positions} == {"header", "payload", "directory", "end"}
    assert len(positions) > 300
    tensors = tensor_bytes(last)
    missed, loaded_by_torch = [], 0
    for what, bit in positions:
        bad = tmp_path / "bad.pt"
        shutil.copyfile(last, bad)
        flip(bad, bit)
        if integrity.verify(bad).ok:
            missed.append((what, bit))
        in_tensor = any(s <= bit // 8 < e for s, e in tensors)
        if in_tensor and loaded_by_torch < 3:  # what torch alone makes of a tensor's bit
            checkpoints.load(bad)
            loaded_by_torch += 1
    assert missed == []
    assert loaded_by_torch == 3  # torch loads a flipped tensor without a word


def test_the_rank_refuses_a_flipped_checkpoint_before_training_and_sets_it_aside(save_dir):
    last = save_dir / checkpoints.LAST
    payload = next(s for w, s, e in regions(last) if w == "payload" and e - s > 1000)
    flip(last, 8 * (payload + 500) + 3)
    with pytest.raises(integrity.CorruptCheckpoint, match="CRC32 mismatch") as caught:
        checkpoints.load_verified(last, lambda: checkpoints.load(last))
    aside = caught.value.aside
    assert not last.exists() and aside.moved_to.exists() and aside.file == checkpoints.LAST
    assert RunDir(save_dir).set_aside_files() == [aside.moved_to]
    resume = checkpoints.choose_resume(save_dir)  # the next start
    assert resume.continue_from.name == "checkpoint_1_10.pt" and resume.at_update == 10


def test_a_hard_linked_name_of_a_bad_file_is_bad_too(save_dir):
    """fairseq's extra names are hard links (one inode): checkpoint_last.pt as a link of the
    newest interval checkpoint, a bit flipped in it, refused as the rank loads it; the next start
    sets the interval checkpoint aside too (same inode) and resumes from the one before."""
    run = RunDir(save_dir)
    newest, older = run.interval_checkpoints()
    last = run.checkpoint_last
    last.unlink()
    os.link(newest, last)
    flip(last, 8 * (last.stat().st_size // 3))
    with pytest.raises(integrity.CorruptCheckpoint):
        checkpoints.load_verified(last, lambda: checkpoints.load(last))
    assert newest.exists()  # the rank set aside the name it loaded
    resume = checkpoints.choose_resume(save_dir)
    assert resume.continue_from == older and resume.at_update == 5
    (twin,) = resume.set_aside
    assert twin.file == newest.name and "same file (inode)" in twin.why
    assert len(run.set_aside_files()) == 2 and not newest.exists()


def test_a_truncated_checkpoint_is_set_aside_by_task_0(save_dir):
    last = save_dir / checkpoints.LAST
    last.write_bytes(last.read_bytes()[:-100])
    resume = checkpoints.choose_resume(save_dir)
    assert resume.at_update == 10 and "truncated" in resume.set_aside[0].why


def test_fairseqs_own_load_is_verified_and_recorded(save_dir, monkeypatch):
    """fairseq's checkpoint_utils.load_checkpoint_to_cpu (as its Trainer calls it on a resume)
    through install_verified_loads: a good file loads and the ledger says what was verified; a
    flipped one raises before its state is used, and the ledger says what was set aside."""
    from fairseq import checkpoint_utils

    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu",
                        checkpoint_utils.load_checkpoint_to_cpu)  # fmt: skip  # restored after
    run = RunDir(save_dir)
    checkpoints.install_verified_loads(run, ("41", 2), rank=0)
    last = run.checkpoint_last
    # the worker allow-lists fairseq's globals process-wide; here, for these loads only
    with torch.serialization.safe_globals(checkpoints.allowed_globals()):
        state = checkpoint_utils.load_checkpoint_to_cpu(str(last))
        assert checkpoints.num_updates(state) == 12
        flip(last, 8 * (last.stat().st_size // 2))
        with pytest.raises(integrity.CorruptCheckpoint):
            checkpoint_utils.load_checkpoint_to_cpu(str(last))
    events = ledger.read(run.ledger)
    verified = [e for e in events if e.kind == Kind.VERIFIED]
    aside = [e for e in events if e.kind == Kind.SET_ASIDE]
    assert [(e.get("file"), e.get("update")) for e in verified] == [(checkpoints.LAST, 12)]
    assert verified[0].get("sha256") and verified[0].get("verify_s") >= 0
    assert [e.get("file") for e in aside] == [checkpoints.LAST] and "CRC32" in aside[0].get("why")
    assert {(e.job, e.restart) for e in [*verified, *aside]} == {("41", 2)}


def test_a_resume_from_a_flipped_checkpoint_stops_before_an_update_then_falls_back(
    save_dir, corpus, tiny_run
):
    """The next start of the trained run, for real (the worker, fairseq): checkpoint_last.pt
    has one bit flipped in a weight. The worker fails with CorruptCheckpoint before training a
    step; the start after resumes from checkpoint_1_10.pt, verified, and trains on."""
    run = RunDir(save_dir)
    last = run.checkpoint_last
    weights = [s for w, s, e in regions(last) if w == "payload" and e - s > 4096]
    flip(last, 8 * (weights[len(weights) // 2] + 1000))
    before = run.train_log.read_text()
    failed = tiny_run(corpus, save_dir, 14, ok=False)
    assert failed.returncode != 0 and "CorruptCheckpoint" in failed.stderr
    this_start = run.train_log.read_text()[len(before) :]
    assert "set aside checkpoint_last.pt (CRC32 mismatch" in this_start
    assert "begin training" not in this_start and "train_inner" not in this_start
    assert not last.exists()  # set aside, and nothing saved in its place
    resume = checkpoints.choose_resume(save_dir)
    assert resume.continue_from.name == "checkpoint_1_10.pt"
    done = tiny_run(corpus, save_dir, 14, *resume.fairseq_args())
    assert "verified checkpoint_1_10.pt" in done.stderr + done.stdout
    assert checkpoints.num_updates(checkpoints.load(last)) == 14
    assert integrity.verify(last).ok
