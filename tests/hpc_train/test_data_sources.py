"""Sources: scanning (hash, lines, UTF-8), ratio splits, the zip read in place, one-line refusals."""

from __future__ import annotations

import hashlib
import itertools
import zipfile
from pathlib import Path

import pytest

from hpc_train.data import sources
from hpc_train.data.base import DataError
from hpc_train.data.sources import TextFile


def scan_text(data: bytes, block: int = 3) -> sources.Scan:
    return sources.scan_blocks(data[i : i + block] for i in range(0, len(data), block))


@pytest.mark.parametrize(
    ("data", "lines"),
    [
        (b"", 0),
        (b"a", 1),
        (b"a\n", 1),
        (b"a\nb", 2),
        (b"\n\n", 2),
        (b"a\r\nb\r\n", 2),
        (b"a\rb\rc", 3),  # a lone CR ends a line in Python's text mode (fairseq's reader)
        (b"a\r", 1),
        (b"a\r\n\r\n", 2),
        ("x\u2028y\x0cz\x1c\n".encode(), 1),  # these do not end a line in a file
    ],
)
def test_scan_counts_the_lines_pythons_text_mode_reads(tmp_path, data, lines):
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    with path.open(encoding="utf-8") as fh:
        assert len(list(fh)) == lines  # the reader the pipeline and fairseq's script use
    scanned = scan_text(data)  # blocks of 3 bytes: CR LF and characters cut between blocks
    assert scanned.lines == lines
    assert scanned.size == len(data)
    assert scanned.sha256 == hashlib.sha256(data).hexdigest()


def test_scan_tells_text_from_blank_and_binary():
    assert scan_text("  é \n\n".encode()).has_text
    assert not scan_text(b" \n\t\n\n").has_text
    with pytest.raises(ValueError, match="NUL byte at offset 4"):
        scan_text(b"abc\n\x00def")
    with pytest.raises(ValueError, match="not UTF-8"):
        scan_text(b"caf\xe9 au lait\n")
    with pytest.raises(ValueError, match="cut character"):
        scan_text("é".encode()[:1])
    assert sources.scan_blocks(["é".encode()[:1]], final=False).size == 1  # a sniffed prefix


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.9,0.05,0.05", None),
        ("0.98,0.02,0", None),
        ("0.9,0.1", "three"),
        ("a,b,c", "three numbers"),
        ("0.5,0.2,0.2", "sum to 1"),
        ("1,0,0", "valid need a share"),
        ("-0.1,0.6,0.5", ">= 0"),
    ],
)
def test_parse_ratios(text, message):
    if message is None:
        assert sum(sources.parse_ratios(text)) == pytest.approx(1)
    else:
        with pytest.raises(ValueError, match=message):
            sources.parse_ratios(text)


def test_split_points_cover_every_line_once():
    assert sources.split_points(100, (0.9, 0.05, 0.05)) == [(0, 90), (90, 95), (95, 100)]
    assert sources.split_points(7, (0.5, 0.5, 0)) == [(0, 4), (4, 7), (7, 7)]
    for total in range(0, 50):
        points = sources.split_points(total, (0.8, 0.15, 0.05))
        assert points[0][0] == 0 and points[-1][1] == total
        assert all(a[1] == b[0] for a, b in itertools.pairwise(points))


def test_assign_maps_a_line_range_onto_files():
    assert sources.assign([3, 0, 4, 5], 2, 9) == [(0, 2, 3), (2, 0, 4), (3, 0, 2)]
    assert sources.assign([3, 4], 3, 7) == [(1, 0, 4)]
    assert sources.assign([3, 4], 7, 7) == []


def write_wikitext(root: Path, texts: dict[str, str]) -> Path:
    raw = root / "wikitext-103-raw"
    raw.mkdir(parents=True)
    for split, text in texts.items():
        (raw / f"wiki.{split}.raw").write_text(text, encoding="utf-8")
    return raw


def zip_dir(raw: Path, dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{raw.name}/", "")
        for path in sorted(raw.iterdir()):
            zf.write(path, f"{raw.name}/{path.name}")
    return dest


TEXTS = {"train": " = A = \n \n one two \n", "valid": " v \n", "test": " t\r\n"}


def test_the_zip_is_read_in_place_like_its_directory(tmp_path):
    raw = write_wikitext(tmp_path, TEXTS)
    archive = zip_dir(raw, tmp_path / "wikitext-103-raw-v1.zip")
    from_dir = sources.find(raw, None, None).splits()
    from_zip = sources.find(archive, None, None).splits()
    for split in TEXTS:
        assert list(from_zip[split].read()) == list(from_dir[split].read())
        assert from_zip[split].identity()[0]["sha256"] == from_dir[split].identity()[0]["sha256"]
        assert from_zip[split].identity()[0]["member"] == f"wikitext-103-raw/wiki.{split}.raw"
    assert list(from_dir["test"].read()) == [" t\n"]
    assert not any(p.name.endswith(".raw") for p in tmp_path.iterdir())  # nothing extracted


def test_zip_checksum_published_or_given(tmp_path, monkeypatch):
    archive = zip_dir(write_wikitext(tmp_path, TEXTS), tmp_path / "wikitext-103-raw-v1.zip")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert sources.find(archive, None, digest.upper()).zip_sha256 == digest
    with pytest.raises(DataError, match="does not match the expected 91c00ae287f0"):
        sources.find(archive, None, sources.PUBLISHED)  # a made-up zip is not the released one
    monkeypatch.setitem(sources.PUBLISHED_SHA256, archive.name, digest)
    assert sources.find(archive, None, sources.PUBLISHED).describe()["sha256"] == digest
    with pytest.raises(DataError, match="not a sha256"):
        sources.find(archive, None, "abc")
    other = archive.rename(tmp_path / "mine.zip")
    with pytest.raises(DataError, match=r"no published sha256 for mine\.zip"):
        sources.find(other, None, sources.PUBLISHED)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "nothing", "no such file or directory"),
        (lambda d: (d / "f.raw").write_text("x") and d / "f.raw", "not a zip file"),
        (lambda d: d, "no wiki.train.raw and no .txt files"),
        (lambda d: write_wikitext(d, {"train": "x\n", "valid": "y\n"}), "no wiki.test.raw"),
        (
            lambda d: zip_dir(write_wikitext(d, {"train": "x\n", "test": "z\n"}), d / "w.zip"),
            "no wiki.valid.raw inside",
        ),
    ],
)
def test_layout_refusals_are_one_line(tmp_path, make, message):
    with pytest.raises(DataError, match=message) as err:
        sources.find(make(tmp_path), None, None)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ("", "empty or only blank lines"),
        (" \n \n", "empty or only blank lines"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "NUL byte"),
        (b"latin-1 caf\xe9\n", "not UTF-8"),
    ],
)
def test_content_refusals_name_the_file(tmp_path, train, message):
    raw = write_wikitext(tmp_path, {**TEXTS, "train": ""})
    path = raw / "wiki.train.raw"
    path.write_bytes(train if isinstance(train, bytes) else train.encode())
    with pytest.raises(DataError, match=message) as err:
        sources.find(raw, None, None).splits()
    assert str(err.value).startswith(str(path))


def test_a_txt_directory_is_cut_by_lines_in_sorted_file_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("".join(f"a{i}\n" for i in range(6)))
    (tmp_path / "b" / "c.txt").write_text("".join(f"c{i}\n" for i in range(4)))
    (tmp_path / "notes.md").write_text("ignored\n")
    source = sources.find(tmp_path, (0.5, 0.3, 0.2), None)
    splits = source.splits()
    assert list(splits["train"].read()) == [f"a{i}\n" for i in range(5)]
    assert list(splits["valid"].read()) == ["a5\n", "c0\n", "c1\n"]
    assert list(splits["test"].read()) == ["c2\n", "c3\n"]
    assert splits["valid"].identity()[1]["lines"] == [0, 2]
    assert source.describe()["ratios"] == [0.5, 0.3, 0.2]
    no_test = sources.find(tmp_path, (0.5, 0.5, 0.0), None).splits()
    assert sorted(no_test) == ["train", "valid"]
    with pytest.raises(DataError, match="the valid split is empty"):
        sources.find(tmp_path, (0.99, 0.005, 0.005), None).splits()


def test_option_mismatches_are_refused(tmp_path):
    raw = write_wikitext(tmp_path, TEXTS)
    with pytest.raises(DataError, match=r"--ratios applies to a directory of \.txt"):
        sources.find(raw, (0.9, 0.05, 0.05), None)
    with pytest.raises(DataError, match="--sha256 checks a zip"):
        sources.find(raw, None, sources.PUBLISHED)


def test_sniff_checks_the_start_of_every_file(tmp_path):
    raw = write_wikitext(tmp_path, TEXTS)
    sources.find(raw, None, None).sniff()
    (raw / "wiki.valid.raw").write_bytes(b"\xff\xfe binary")
    with pytest.raises(DataError, match=r"wiki\.valid\.raw: not UTF-8"):
        sources.find(raw, None, None).sniff()
    assert TextFile(raw / "wiki.train.raw").size() == len(TEXTS["train"])
