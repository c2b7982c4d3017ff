"""Bus-bandwidth arithmetic, the threshold table and the verdict on a parsed table. Pure.

The verdict judges the *large-message* bus bandwidth: the peak busbw (out-of-place or in-place)
over the sizes of at least 1/8 of the largest size in the sweep (the top four sizes of a x2
sweep), i.e. the plateau that published figures quote. nccl-tests' "Avg bus bandwidth" is not
used: it averages every size, so it depends on ``-b``/``-e``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hpc_core.instances import INSTANCE_TYPES
from nccl_checks import EXIT_CANNOT_RUN, EXIT_HEALTHY, EXIT_UNHEALTHY
from nccl_checks.parse import Measurement, Table

CPU = "cpu"  # gloo over loopback on the local emulated cluster: one rank per node, no GPU
FLOOR_FRACTION = 0.8  # a GPU floor is 80 % of the typical figure: below it, something is wrong
LARGE_FRACTION = 8  # "large" sizes: >= largest size / 8
MiB = 1 << 20
GiB = 1 << 30

NOTES = "team notes nccl-and-health.md, 'Expected numbers'"


@dataclass(frozen=True)
class Threshold:
    """Minimum large-message busbw for one instance type over a range of node counts."""

    instance_type: str
    min_nodes: int
    max_nodes: int | None  # None: and above
    floor_gbps: float
    typical: str  # what a healthy run shows, in words
    min_size: int  # the sweep must reach this size (bytes) to be judged
    source: str

    def covers(self, instance_type: str, nodes: int) -> bool:
        return (
            self.instance_type == instance_type
            and nodes >= self.min_nodes
            and (self.max_nodes is None or nodes <= self.max_nodes)
        )


def _gpu(
    itype: str, nodes: tuple[int, int | None], typical_gbps: float, min_size: int, source: str
) -> Threshold:
    floor = round(FLOOR_FRACTION * typical_gbps, 1)
    return Threshold(
        itype,
        nodes[0],
        nodes[1],
        floor,
        f"~{typical_gbps:g} GB/s, {source}",
        min_size,
        f"{NOTES}: {source}",
    )


# The one table of numbers. GPU rows: floor = FLOOR_FRACTION x the typical busbw of the source.
# fmt: off
THRESHOLDS: tuple[Threshold, ...] = (
    #     instance type    nodes      typical  judged from  source of the typical figure
    _gpu("p3dn.24xlarge", (2, 2),     10.0,    256 * MiB,   "2 nodes, 100 Gbps EFA, no GPUDirect"),
    _gpu("p3dn.24xlarge", (3, None),  6.0,     256 * MiB,   "8-32 nodes: 6-8, low end"),
    _gpu("p4d.24xlarge",  (2, 2),     57.0,    1 * GiB,     "2 nodes, older NCCL/aws-ofi-nccl"),
    _gpu("p4de.24xlarge", (2, 2),     78.0,    1 * GiB,     "2 nodes, peak at 2 GiB"),
    _gpu("p5.48xlarge",   (2, 2),     487.0,   1 * GiB,     "2 nodes, peak"),
    Threshold(CPU, 2, None, floor_gbps=0.02, min_size=1 * MiB,
              typical="0.5-1.2 GB/s, 2 emulated nodes on 2 shared cores",
              source="SANITY FLOOR, not a performance figure: gloo over loopback TCP on the local "
                     "emulated cluster (measured, docs/health-checks.md); 20 MB/s only catches a "
                     "stalled or broken path"),
)
# fmt: on


def threshold_for(instance_type: str, nodes: int) -> Threshold | None:
    return next((t for t in THRESHOLDS if t.covers(instance_type, nodes)), None)


def ranks_per_node(instance_type: str) -> int:
    """One rank per GPU on a GPU instance; one per node for the CPU (gloo) check."""
    if instance_type == CPU:
        return 1
    try:
        return INSTANCE_TYPES[instance_type].gpus
    except KeyError:
        known = ", ".join([*sorted(INSTANCE_TYPES), CPU])
        raise ValueError(f"unknown instance type {instance_type!r} (known: {known})") from None


def bus_factor(nranks: int) -> float:
    """all_reduce moves 2(n-1)/n of the buffer per rank: busbw = algbw x 2(n-1)/n."""
    if nranks < 1:
        raise ValueError(f"rank count must be >= 1, got {nranks}")
    return 2.0 * (nranks - 1) / nranks


def algbw(size_bytes: int, time_us: float) -> float:
    """GB/s (1e9 bytes) as nccl-tests prints it: size / time."""
    if time_us <= 0:
        raise ValueError(f"time must be > 0 us, got {time_us}")
    return size_bytes / (time_us * 1e3)


def busbw(size_bytes: int, time_us: float, nranks: int) -> float:
    return algbw(size_bytes, time_us) * bus_factor(nranks)


def busbw_matches(m: Measurement, size: int, nranks: int) -> tuple[bool, float | None]:
    """Recompute busbw from size and time; True if it agrees with the printed value.

    Printed values carry two decimals (and times sometimes fewer), hence 0.011 GB/s + 1 %.
    """
    if m.time_us is None or m.busbw is None or m.time_us <= 0:
        return True, None
    expected = busbw(size, m.time_us, nranks)
    return abs(expected - m.busbw) <= 0.011 + 0.01 * max(expected, m.busbw), expected


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class AllReduceVerdict:
    healthy: bool  # no check failed
    reason: str  # one line
    instance_type: str
    nodes: int
    ranks: int
    large_busbw: float | None
    large_size: int | None
    threshold: Threshold | None
    checks: tuple[Check, ...]
    judged: bool = True  # False: no bandwidth threshold for this shape, the rest passed or not

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def exit_code(self) -> int:
        """1 when a check failed; else 3 when the bandwidth was not judged; else 0."""
        if not self.healthy:
            return EXIT_UNHEALTHY
        return EXIT_HEALTHY if self.judged else EXIT_CANNOT_RUN


def _human(size: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def large_message_busbw(table: Table) -> tuple[float | None, int | None]:
    """Peak busbw over the sizes >= largest/LARGE_FRACTION, and the size where it was seen."""
    cutoff = table.max_size / LARGE_FRACTION
    best: tuple[float | None, int | None] = (None, None)
    for row in table.rows:
        if row.size < cutoff:
            continue
        for m in row.measurements():
            if m.busbw is not None and (best[0] is None or m.busbw > best[0]):
                best = (m.busbw, row.size)
    return best


def _check_layout(table: Table, expected_ranks: int) -> Check:
    collective = table.collective or "all_reduce_perf"
    if "all_reduce" not in collective:
        return Check("collective", False, f"output is from {collective}, not all_reduce_perf")
    if table.nranks is not None and table.nranks != expected_ranks:
        return Check(
            "layout",
            False,
            f"the run had {table.nranks} ranks but {expected_ranks} were expected",
        )
    return Check("layout", True, f"{expected_ranks} ranks")


def _check_correctness(table: Table) -> Check:
    first = None
    if table.wrong_kind == "count":  # older builds print a max deviation: judged by the footer
        first = next(
            (
                f"{m.wrong:g} wrong elements at {_human(row.size)} ({mode})"
                for row in table.rows
                for mode, m in zip(("out-of-place", "in-place"), row.measurements(), strict=True)
                if m.wrong
            ),
            None,
        )
    if table.out_of_bounds or first:
        oob = f"{table.out_of_bounds} out-of-bounds values"
        return Check("correctness", False, f"{oob}; first: {first}" if first else oob)
    return Check("correctness", True, "0 wrong, 0 out-of-bounds values")


def _check_cross(table: Table, nranks: int) -> Check:
    compared = 0
    for row in table.rows:
        for mode, m in zip(("out-of-place", "in-place"), row.measurements(), strict=True):
            ok, expected = busbw_matches(m, row.size, nranks)
            if expected is None:
                continue
            compared += 1
            if not ok:
                return Check(
                    "busbw-recompute",
                    False,
                    f"busbw at {_human(row.size)} ({mode}) is {m.busbw:.2f} GB/s but size/time for "
                    f"{nranks} ranks gives {expected:.2f}: wrong rank count or not all_reduce",
                )
    return Check("busbw-recompute", True, f"{compared} values agree with size/time for {nranks}")


def _check_bandwidth(
    table: Table, instance_type: str, nodes: int, threshold: Threshold | None
) -> tuple[Check, float | None, int | None]:
    peak, at = large_message_busbw(table)
    where = f"{instance_type} x {nodes} node{'s' if nodes != 1 else ''}"
    if threshold is None:
        detail = f"bandwidth not judged: no threshold for {where} (--min-busbw GBPS sets one)"
        return Check("bandwidth", True, detail), peak, at
    if table.max_size < threshold.min_size:
        return (
            Check(
                "bandwidth",
                False,
                f"sweep stops at {_human(table.max_size)}; judging {where} needs sizes up to "
                f"{_human(threshold.min_size)} (-e)",
            ),
            peak,
            at,
        )
    if peak is None or at is None:
        return Check("bandwidth", False, "no busbw value at the large sizes (all N/A)"), None, None
    ok = peak >= threshold.floor_gbps
    rel = ">=" if ok else "<"
    detail = (
        f"busbw {peak:.2f} GB/s at {_human(at)} {rel} {threshold.floor_gbps:g} GB/s floor "
        f"for {where} (typical {threshold.typical})"
    )
    return Check("bandwidth", ok, detail), peak, at


def judge(
    table: Table,
    instance_type: str,
    nodes: int,
    gpus_per_node: int | None = None,
    min_busbw: float | None = None,
) -> AllReduceVerdict:
    """The verdict on one all_reduce_perf table for a run over ``nodes`` nodes of ``instance_type``.

    ``min_busbw`` replaces the table's floor (GB/s) for this call.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    per_node = gpus_per_node if gpus_per_node is not None else ranks_per_node(instance_type)
    expected_ranks = nodes * per_node
    threshold = threshold_for(instance_type, nodes)
    if min_busbw is not None:
        base = threshold or Threshold(instance_type, nodes, nodes, 0.0, "n/a", 0, "")
        threshold = Threshold(
            instance_type,
            base.min_nodes,
            base.max_nodes,
            min_busbw,
            base.typical,
            base.min_size,
            "--min-busbw given on the command line",
        )
    nranks = table.nranks or expected_ranks
    bandwidth, peak, at = _check_bandwidth(table, instance_type, nodes, threshold)
    checks = (
        _check_layout(table, expected_ranks),
        _check_correctness(table),
        Check(
            "nccl-tests-min-bw",
            not table.avg_busbw_failed,
            "average below NCCL_TESTS_MIN_BW (nccl-tests said FAILED)"
            if table.avg_busbw_failed
            else "not set or passed",
        ),
        _check_cross(table, nranks) if nranks > 1 else Check("busbw-recompute", True, "1 rank"),
        bandwidth,
    )
    failed = [c for c in checks if not c.ok]
    reason = failed[0].detail if failed else bandwidth.detail
    return AllReduceVerdict(
        healthy=not failed,
        reason=reason,
        instance_type=instance_type,
        nodes=nodes,
        ranks=expected_ranks,
        large_busbw=peak,
        large_size=at,
        threshold=threshold,
        checks=checks,
        judged=threshold is not None,
    )
