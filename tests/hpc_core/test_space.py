"""hpc_core.space: a file system's free bytes and inodes, and what is short. On real small file
systems (a tmpfs of its own per test, ``small_fs``: it stands for the save dir's FSx), filled
with a real ballast file."""

from __future__ import annotations

import errno

import pytest

from hpc_core import space


def test_the_room_of_a_small_file_system_and_of_a_dir_not_made_yet(small_fs):
    fs = small_fs("4m")
    room = space.of(fs.root)
    assert 3_900_000 < room.free_bytes <= 4 * 2**20 and room.total_bytes == 4 * 2**20
    fs.fill(leave=1 << 20)
    later = space.of(fs.root / "run" / "not-made-yet")
    assert later.path == fs.root  # measured where it will be made
    assert abs(later.free_bytes - (1 << 20)) < 8192


def test_short_names_the_place_the_figures_and_what_is_set_aside(small_fs, tmp_path):
    fs = small_fs("2m")
    aside = fs.root / "checkpoint_last.pt.bad-20261128T120000-7"
    aside.write_bytes(b"x" * 500_000)
    room = space.of(fs.root)
    assert space.short(room, 1_000_000, [aside]) is None  # fits
    said = space.short(room, 3_000_000, [aside])
    assert said.startswith(f"{fs.root}: ") and "3.0 MB needed" in said
    assert f"{space.size(room.free_bytes)} free" in said
    assert "checkpoint_last.pt.bad-20261128T120000-7 (500 kB)" in said


def test_too_few_inodes_is_short_too(small_fs):
    fs = small_fs("2m", inodes=40)
    room = space.of(fs.root)
    assert room.free_inodes is not None and room.free_inodes < 40
    assert "inodes free, 10,000 wanted" in space.short(room, 0)
    assert space.short(room, 0, inodes=2) is None


def test_no_space_is_an_enospc_oserror_naming_the_path():
    err = space.NoSpace("checkpoint_1_5.pt", space.Path("/lustre/run/checkpoint_1_5.pt"), "x: y")
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert (
        str(err)
        == "[Errno 28] no space for checkpoint_1_5.pt: x: y: '/lustre/run/checkpoint_1_5.pt'"
    )


@pytest.mark.parametrize(
    ("n", "text"),
    [(4_470_000_000, "4.47 GB"), (812_345_678, "812.3 MB"), (3100, "3 kB"), (7, "7 B")],
)
def test_sizes_for_people(n, text):
    assert space.size(n) == text
