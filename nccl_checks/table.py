"""Write an all_reduce table in nccl-tests' text format, and parse sizes like ``16M``. Pure.

The torch.distributed sweep prints through this, so its output goes through the same parser and
verdict as a real ``all_reduce_perf`` run. Widths follow nccl-tests (src/util.cu).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nccl_checks.parse import Measurement

_SIZE = re.compile(r"^(\d+)\s*([KMGT]?)(?:i?B)?$", re.IGNORECASE)
_SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``8``, ``64K``, ``16M``, ``2G`` (powers of 1024, as nccl-tests reads -b/-e) -> bytes."""
    m = _SIZE.match(text.strip())
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 8, 64K, 16M, 2G)")
    return int(m.group(1)) * _SCALE[m.group(2).upper()]


def sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """The sweep's message sizes: min, minxfactor, … up to max (inclusive), as nccl-tests -f."""
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ValueError(
            f"need 4 <= min ({min_bytes}) <= max ({max_bytes}) and factor >= 2 ({factor})"
        )
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def float_str(value: float | None, width: int) -> str:
    """nccl-tests' getFloatStr: as many decimals as fit in ``width``; N/A for None."""
    if value is None:
        return f"{'N/A':>{width}}"
    power, limit = 0, 1
    while value >= limit:
        power += 1
        limit *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}"


def _mode(m: Measurement) -> str:
    wrong = "N/A" if m.wrong is None else f"{m.wrong:g}"
    return (
        f"  {float_str(m.time_us, 7)}  {float_str(m.algbw, 6)}  {float_str(m.busbw, 6)}  {wrong:>6}"
    )


def row_line(size: int, count: int, out_of_place: Measurement, in_place: Measurement) -> str:
    return f"{size:12d}  {count:12d}  {'float':>8}  {'sum':>6}  {-1:6d}" + "".join(
        _mode(m) for m in (out_of_place, in_place)
    )


def header_lines(  # ranks: (host, pid, device index, device description) per rank
    program: str,
    ranks: Sequence[tuple[str, int, int, str]],
    min_bytes: int,
    max_bytes: int,
    factor: int,
    warmup: int,
    iters: int,
) -> list[str]:
    blank = ("", "", "", "", "")
    return [
        f"# Collective test starting: {program}",
        f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: {factor}(factor) "
        f"warmup iters: {warmup} iters: {iters} agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
        *(
            f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10} device {dev:2d} {name}"
            for rank, (host, pid, dev, name) in enumerate(ranks)
        ),
        "#",
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       "
        "in-place          ".format(*blank),
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  "
        "{:>6}".format(
            "size",
            "count",
            "type",
            "redop",
            "root",
            *("time", "algbw", "busbw", "#wrong") * 2,
        ),
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  "
        "{:>6}".format(
            "(B)",
            "(elements)",
            "",
            "",
            "",
            *("(us)", "(GB/s)", "(GB/s)", "") * 2,
        ),
    ]


def footer_lines(out_of_bounds: int, avg_busbw: float, program: str) -> list[str]:
    return [
        f"# {'Out of bounds values':<20} : {out_of_bounds} {'FAILED' if out_of_bounds else 'OK'}",
        f"# {'Avg bus bandwidth':<20} : {avg_busbw:g} ",
        "#",
        f"# Collective test concluded: {program}",
    ]
