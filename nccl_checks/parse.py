"""Read nccl-tests ``*_perf`` output (text or ``-J`` JSON) into a table. Pure: text in, data out.

Text formats understood (see tests/nccl_checks/fixtures/ for one file of each):

* current: ``size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong``,
  optionally with trailing timestamp or per-iteration columns;
* older builds: no ``root`` column and ``error`` (a max deviation, not a count) instead of
  ``#wrong``;
* ``N/A`` in any value column (``#wrong`` is ``N/A`` when run with ``-c 0``);
* line prefixes added by launchers: ``srun -l`` (``0: ``) and mpirun (``[1,0]<stdout>:``);
* the JSON file written with ``-J FILE`` (format version 2).

Truncated output (a run killed mid-sweep, a file cut short) is rejected with a ParseError that says
so, rather than judged on the sizes that happened to finish.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

WrongKind = Literal["count", "max_error"]

# `srun -l` pads the task id (`  0: `); Open MPI's --tag-output writes `[job,rank]<stdout>:`.
_PREFIX = re.compile(r"^(?:\s*\d+:\s|\[\d+,\d+\]<std(?:out|err)>:)")
_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)")
_FOOTER_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_FOOTER_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(FAILED|OK)?")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_VERSION = re.compile(r"^#\s*nccl-tests version\s+(\S+)")
# A line a failing run leaves behind (NCCL's own failure report, a launcher error).
_FAILURE_HINT = re.compile(r"(failure|error|abort|killed|terminated|cancelled)", re.IGNORECASE)

_MODE_COLUMNS = ("time", "algbw", "busbw")
_KEY_COLUMNS = ("size", "count", "type", "redop", "root")


class ParseError(ValueError):
    """The input is not complete nccl-tests output; the message says what is wrong."""


@dataclass(frozen=True)
class Measurement:
    """One mode (out-of-place or in-place) of one row; None where the output says N/A."""

    time_us: float | None
    algbw: float | None
    busbw: float | None
    wrong: float | None  # #wrong count, or (older builds) the max deviation — see Table.wrong_kind


@dataclass(frozen=True)
class BusRow:
    size: int  # bytes
    count: int  # elements
    dtype: str
    redop: str
    root: int | None
    out_of_place: Measurement
    in_place: Measurement

    def measurements(self) -> tuple[Measurement, Measurement]:
        return (self.out_of_place, self.in_place)


@dataclass(frozen=True)
class Table:
    rows: tuple[BusRow, ...]
    wrong_kind: WrongKind
    out_of_bounds: int
    avg_busbw: float | None
    avg_busbw_failed: bool = False  # NCCL_TESTS_MIN_BW was set and the average fell below it
    hosts: tuple[str, ...] = ()  # host of each rank, from the "# Using devices" list
    collective: str | None = None
    version: str | None = None
    source_format: Literal["text", "json"] = "text"

    @property
    def nranks(self) -> int | None:
        """Ranks listed under "# Using devices" (None when the list is absent)."""
        return len(self.hosts) or None

    @property
    def max_size(self) -> int:
        return max(row.size for row in self.rows)


def strip_prefix(line: str) -> str:
    """Remove an ``srun -l`` or mpirun ``--tag-output`` prefix from one line."""
    return _PREFIX.sub("", line, count=1)


def _number(token: str) -> float | None:
    if token.upper() == "N/A":
        return None
    try:
        return float(token)
    except ValueError:
        raise ParseError(f"not a number: {token!r}") from None


def _header_columns(line: str) -> list[str] | None:
    """Column names if ``line`` is the table header (``#  size  count  type …``), else None."""
    tokens = line.lstrip("#").split()
    if len(tokens) >= 6 and tokens[0] == "size" and tokens[1] == "count":
        return tokens
    return None


@dataclass
class _Layout:
    keys: dict[str, int]  # key column -> token index
    modes: list[dict[str, int]]  # per mode: time/algbw/busbw/wrong -> token index
    wrong_kind: WrongKind
    width: int  # tokens a complete row has (before optional trailing columns)


def _layout(columns: list[str]) -> _Layout:
    keys = {name: i for i, name in enumerate(columns) if name in _KEY_COLUMNS}
    missing = [name for name in ("size", "count", "type", "redop") if name not in keys]
    if missing:
        raise ParseError(f"table header lacks column(s) {', '.join(missing)}: {' '.join(columns)}")
    modes: list[dict[str, int]] = []
    wrong_kind: WrongKind = "count"
    for i, name in enumerate(columns):
        if name in ("time", "cputime"):
            modes.append({"time": i})
        elif modes and name in ("algbw", "busbw"):
            modes[-1][name] = i
        elif modes and name in ("#wrong", "error"):
            modes[-1]["wrong"] = i
            wrong_kind = "count" if name == "#wrong" else "max_error"
    modes = [m for m in modes if {"time", "algbw", "busbw"} <= m.keys()]
    if len(modes) != 2:
        raise ParseError(
            "table header does not have the out-of-place and in-place column groups "
            f"(time algbw busbw #wrong, twice): {' '.join(columns)}"
        )
    width = max(max(m.values()) for m in modes) + 1
    return _Layout(keys, modes, wrong_kind, width)


def _measurement(tokens: list[str], cols: dict[str, int]) -> Measurement:
    wrong = _number(tokens[cols["wrong"]]) if "wrong" in cols else None
    return Measurement(
        time_us=_number(tokens[cols["time"]]),
        algbw=_number(tokens[cols["algbw"]]),
        busbw=_number(tokens[cols["busbw"]]),
        wrong=wrong,
    )


def _row(tokens: list[str], layout: _Layout) -> BusRow:
    k = layout.keys
    root = None
    if "root" in k:
        root_value = _number(tokens[k["root"]])
        root = None if root_value is None else int(root_value)
    return BusRow(
        size=int(tokens[k["size"]]),
        count=int(tokens[k["count"]]),
        dtype=tokens[k["type"]],
        redop=tokens[k["redop"]],
        root=root,
        out_of_place=_measurement(tokens, layout.modes[0]),
        in_place=_measurement(tokens, layout.modes[1]),
    )


def _failure_hint(lines: list[str]) -> str:
    for line in lines:
        if _FAILURE_HINT.search(line):
            return f"; first error line: {line.strip()[:160]!r}"
    return ""


@dataclass
class _Comments:
    """What the ``#`` lines of one run say: the table's layout, each rank's host, the footer, the
    collective and the nccl-tests version."""

    layout: _Layout | None = None
    hosts: dict[int, str] = field(default_factory=dict)
    oob: int | None = None
    avg: float | None = None
    avg_failed: bool = False
    collective: str | None = None
    version: str | None = None

    def read(self, stripped: str, number: int) -> None:
        if (columns := _header_columns(stripped)) is not None:
            if self.layout is not None:
                raise ParseError(f"line {number}: a second result table (one run per file)")
            self.layout = _layout(columns)
        elif m := _RANK_LINE.match(stripped):
            self.hosts[int(m.group(1))] = m.group(2)
        elif m := _FOOTER_OOB.match(stripped):
            self.oob = int(m.group(1))
        elif m := _FOOTER_AVG.match(stripped):
            self.avg = _number(m.group(1))
            self.avg_failed = m.group(2) == "FAILED"
        elif m := _STARTING.match(stripped):
            self.collective = m.group(1)
        elif m := _VERSION.match(stripped):
            self.version = m.group(1)


def parse_text(text: str) -> Table:
    """Parse the stdout of an nccl-tests ``*_perf`` binary. Raises ParseError."""
    lines = [strip_prefix(line.rstrip("\r\n")) for line in text.splitlines()]
    said = _Comments()
    rows: list[BusRow] = []
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            said.read(stripped, number)
            continue
        tokens = stripped.split()
        layout = said.layout
        if layout is None or said.oob is not None or not tokens[0].isdigit():
            continue  # NCCL INFO/WARN lines, launcher chatter, other ranks' output
        if len(tokens) < layout.width:
            raise ParseError(
                f"truncated: line {number} has {len(tokens)} of {layout.width} columns "
                f"(the run stopped mid-row at size {tokens[0]}){_failure_hint(lines[number:])}"
            )
        try:
            rows.append(_row(tokens, layout))
        except ParseError as err:
            raise ParseError(f"line {number}: {err}") from None
    layout, oob = _complete(said, rows, lines)
    return Table(
        rows=tuple(rows),
        wrong_kind=layout.wrong_kind,
        out_of_bounds=oob,
        avg_busbw=said.avg,
        avg_busbw_failed=said.avg_failed,
        hosts=tuple(said.hosts[r] for r in sorted(said.hosts)),
        collective=said.collective,
        version=said.version,
    )


def _complete(said: _Comments, rows: list[BusRow], lines: list[str]) -> tuple[_Layout, int]:
    """The layout and out-of-bounds count of a complete run; ParseError for a run with no table,
    no rows or no footer."""
    if said.layout is None:
        raise ParseError(
            "not nccl-tests output: no table header (`#  size  count  type  redop …`)"
            + _failure_hint(lines)
        )
    if not rows:
        raise ParseError("no result rows under the table header" + _failure_hint(lines))
    if said.oob is None:
        raise ParseError(
            f"truncated: no '# Out of bounds values' footer after the last row "
            f"(size {rows[-1].size} B) — the run was killed or the file cut short"
            + _failure_hint(lines)
        )
    return said.layout, said.oob


def _json_measurement(obj: Any) -> Measurement:
    if obj is None:
        return Measurement(None, None, None, None)

    def value(key: str) -> float | None:
        v = obj.get(key)
        return None if v is None or v == "nan" else float(v)

    return Measurement(
        time_us=value("time") if "time" in obj else value("cpu_time"),
        algbw=value("alg_bw"),
        busbw=value("bus_bw"),
        wrong=value("nwrong"),
    )


def _program_name(args: Any) -> str | None:
    if isinstance(args, list) and args:
        return str(args[0]).rsplit("/", 1)[-1]
    return None


def parse_json(text: str) -> Table:
    """Parse the file written by ``all_reduce_perf -J FILE``. Raises ParseError."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ParseError(f"truncated or invalid nccl-tests JSON: {err}") from None
    if not isinstance(doc, dict) or "results" not in doc:
        raise ParseError("not nccl-tests JSON: no 'results' list")
    if "out_of_bounds" not in doc:
        raise ParseError("truncated nccl-tests JSON: no 'out_of_bounds' summary after the results")
    try:
        rows = tuple(
            BusRow(
                size=int(r["size"]),
                count=int(r["count"]),
                dtype=str(r["type"]),
                redop=str(r["redop"]),
                root=int(str(r["root"]).strip()) if r.get("root") is not None else None,
                out_of_place=_json_measurement(r.get("out_of_place")),
                in_place=_json_measurement(r.get("in_place")),
            )
            for r in doc["results"]
        )
        config = doc.get("config", {})
        per_process = int(config.get("nthreads", 1)) * int(config.get("ngpus", 1))
        hosts = tuple(
            str(d["hostname"]) for d in config.get("devices", []) for _ in range(per_process)
        )
        avg = doc.get("average_bus_bandwidth", {})
        table = Table(
            rows=rows,
            wrong_kind="count",
            out_of_bounds=int(doc["out_of_bounds"]["count"]),
            avg_busbw=float(avg["bandwidth"]) if "bandwidth" in avg else None,
            avg_busbw_failed=avg.get("okay") is False or avg.get("okay") == "false",
            hosts=hosts,
            collective=_program_name(doc.get("args")),
            source_format="json",
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ParseError(f"nccl-tests JSON with an unexpected shape: {err!r}") from None
    if not rows:
        raise ParseError("nccl-tests JSON has no results")
    return table


def parse(text: str) -> Table:
    """Parse nccl-tests output in any supported format (JSON if it starts with ``{``)."""
    if not text.strip():
        raise ParseError("empty input")
    if text.lstrip().startswith("{"):
        return parse_json(text)
    return parse_text(text)
