"""nccl_checks.parse against one fixture per output variant (see fixtures/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nccl_checks.parse import ParseError, parse, strip_prefix

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_current_format_with_root_column() -> None:
    table = parse(load("current_root_p3dn_2nodes.txt"))
    assert len(table.rows) == 29
    assert table.rows[0].size == 8 and table.rows[-1].size == 2 << 30
    assert table.rows[-1].count == (2 << 30) // 4
    assert table.rows[0].root == -1 and table.rows[0].dtype == "float"
    assert table.wrong_kind == "count"
    assert (
        table.nranks == 16 and table.hosts[0] == "ip-10-0-1-11" and table.hosts[8] == "ip-10-0-1-12"
    )
    assert table.collective == "all_reduce_perf" and table.version == "2.14.1"
    assert table.out_of_bounds == 0
    last = table.rows[-1]
    assert last.out_of_place.busbw == pytest.approx(9.6, abs=0.01)
    assert last.in_place.time_us is not None and last.in_place.time_us > 200_000
    # NCCL INFO lines between the device list and the table are not rows
    assert all(row.size >= 8 for row in table.rows)


def test_older_format_without_root_and_with_error_column() -> None:
    table = parse(load("older_noroot_error_p3dn_2nodes_slow.txt"))
    assert table.wrong_kind == "max_error"
    assert all(row.root is None for row in table.rows)
    assert table.rows[-1].out_of_place.wrong == pytest.approx(2e-07)
    assert table.nranks == 16  # "#  Rank  0 Pid …" lines without "Group"
    assert table.collective is None and table.version is None


def test_na_values_become_none() -> None:
    table = parse(load("na_values_p3dn_4nodes.txt"))
    assert all(m.wrong is None for row in table.rows for m in row.measurements())
    assert all(m.busbw is not None for row in table.rows for m in row.measurements())
    assert table.nranks == 32


def test_srun_label_prefix_and_other_ranks_lines() -> None:
    table = parse(load("srun_label_wrong_p3dn_2nodes.txt"))
    assert len(table.rows) == 28 and table.nranks == 16
    wrong = [(row.size, row.out_of_place.wrong) for row in table.rows if row.out_of_place.wrong]
    assert wrong == [(64 << 20, 3.0)]
    assert table.out_of_bounds == 3


def test_mpirun_tag_output_prefix() -> None:
    table = parse(load("mpirun_prefix_p3dn_2nodes.txt"))
    assert len(table.rows) == 27 and table.rows[-1].size == 512 << 20
    assert table.nranks == 16 and table.out_of_bounds == 0


@pytest.mark.parametrize(
    ("line", "stripped"),
    [
        (" 0: #  Rank  0", "#  Rank  0"),
        ("12:            8", "           8"),
        ("[1,0]<stdout>:           8", "           8"),
        ("[1,13]<stderr>:x", "x"),
        ("           8             2", "           8             2"),  # a row keeps its indent
    ],
)
def test_strip_prefix(line: str, stripped: str) -> None:
    assert strip_prefix(line) == stripped


def test_json_output() -> None:
    table = parse(load("nccl_tests_p4de_2nodes.json"))
    assert table.source_format == "json"
    assert len(table.rows) == 12 and table.rows[-1].size == 2 << 30
    assert table.rows[0].root == -1
    assert table.nranks == 16 and table.hosts[15] == "ip-10-0-2-12"
    assert table.collective == "all_reduce_perf"
    assert table.rows[-1].in_place.busbw == pytest.approx(76.9, abs=0.1)
    assert table.out_of_bounds == 0 and not table.avg_busbw_failed


def test_truncated_text_is_rejected_with_the_failure_line() -> None:
    with pytest.raises(ParseError) as err:
        parse(load("truncated_p3dn_2nodes.txt"))
    msg = str(err.value)
    assert msg.startswith("truncated")
    assert "16777216" in msg  # the last size that finished
    assert "Test NCCL failure" in msg


def test_row_cut_mid_line_is_truncated() -> None:
    text = load("current_root_p3dn_2nodes.txt")
    cut = text[: text.index("  1073741824") + 40]  # the 1 GiB row, cut inside its columns
    with pytest.raises(ParseError, match=r"truncated: line \d+ has \d+ of 13 columns"):
        parse(cut)


def test_truncated_json_is_rejected() -> None:
    text = load("nccl_tests_p4de_2nodes.json")
    with pytest.raises(ParseError, match="truncated or invalid nccl-tests JSON"):
        parse(text[: len(text) // 2])
    doc = json.loads(text)
    del doc["out_of_bounds"], doc["average_bus_bandwidth"]
    with pytest.raises(ParseError, match="no 'out_of_bounds'"):
        parse(json.dumps(doc))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty input"),
        ("hello\nworld\n", "no table header"),
        ("#  size count type redop root time algbw busbw #wrong\n", "column groups"),
    ],
)
def test_not_nccl_tests_output(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse(text)


def test_header_without_rows() -> None:
    header = load("table_only_16ranks.txt").splitlines()[:2]
    with pytest.raises(ParseError, match="no result rows"):
        parse("\n".join(header) + "\n# Out of bounds values : 0 OK\n")


def test_two_tables_in_one_file_are_refused() -> None:
    text = load("table_only_16ranks.txt")
    with pytest.raises(ParseError, match="second result table"):
        parse(text + text)


def test_trailing_timestamp_column_is_ignored() -> None:
    lines = load("table_only_16ranks.txt").splitlines()
    stamped = [
        line + "  2025-06-02 10:11:12" if line[:1] == " " else line for line in lines
    ]  # nccl-tests -Z appends a timestamp to each row
    table = parse("\n".join(stamped))
    assert table.rows == parse("\n".join(lines)).rows
