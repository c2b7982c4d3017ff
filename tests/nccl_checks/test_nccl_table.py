"""nccl_checks.table: the nccl-tests text writer (used by the sweep) and size parsing."""

from __future__ import annotations

import pytest

from nccl_checks.parse import Measurement, parse
from nccl_checks.table import float_str, footer_lines, header_lines, parse_size, row_line, sizes


@pytest.mark.parametrize(
    ("value", "width", "text"),
    [
        (34.0123, 7, "  34.01"),  # < 10^4: two decimals
        (11657.14, 7, "11657.1"),  # 10^4..10^5: one
        (239942.0, 7, " 239942"),  # up to 10^7: none
        (12_345_678.0, 7, "1.2e+07"),
        (9.6012, 6, "  9.60"),
        (None, 6, "   N/A"),
    ],
)
def test_float_str_matches_nccl_tests(value: float | None, width: int, text: str) -> None:
    assert float_str(value, width) == text


@pytest.mark.parametrize(
    ("text", "size"),
    [("8", 8), ("64K", 65536), ("16M", 16 << 20), ("2G", 2 << 30), ("1GiB", 1 << 30)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "16X", "-8", "1.5M"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(bad)


def test_sizes() -> None:
    assert sizes(8, 64) == [8, 16, 32, 64]
    assert sizes(8, 100, 4) == [8, 32]
    assert len(sizes(8, 16 << 20)) == 22
    with pytest.raises(ValueError):
        sizes(2, 8)
    with pytest.raises(ValueError):
        sizes(8, 4)


def test_written_table_parses_back() -> None:
    ranks = [("n1", 101, -1, "[cpu] gloo"), ("n2", 202, -1, "[cpu] gloo")]
    na = Measurement(None, None, None, None)
    rows = [
        row_line(8, 2, na, Measurement(80.5, 0.0001, 0.0001, 0.0)),
        row_line(1 << 20, 1 << 18, na, Measurement(1234.5, 0.85, 0.85, 2.0)),
    ]
    text = "\n".join(
        [
            *header_lines("all_reduce_perf (sweep)", ranks, 8, 1 << 20, 2, 1, 5),
            *rows,
            *footer_lines(2, 0.42, "all_reduce_perf (sweep)"),
        ]
    )
    table = parse(text)
    assert table.hosts == ("n1", "n2") and table.collective == "all_reduce_perf"
    assert [r.size for r in table.rows] == [8, 1 << 20]
    assert table.rows[1].in_place == Measurement(1234.5, 0.85, 0.85, 2.0)
    assert table.rows[1].out_of_place == na
    assert table.out_of_bounds == 2 and table.avg_busbw == pytest.approx(0.42)
