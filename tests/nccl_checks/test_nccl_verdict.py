"""nccl_checks.verdict: busbw arithmetic, the threshold table, and verdicts on parsed tables."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nccl_checks.parse import Measurement, Table, parse
from nccl_checks.table import footer_lines, row_line
from nccl_checks.verdict import (
    CPU,
    FLOOR_FRACTION,
    THRESHOLDS,
    GiB,
    MiB,
    algbw,
    bus_factor,
    busbw,
    busbw_matches,
    judge,
    large_message_busbw,
    ranks_per_node,
    threshold_for,
)

FIXTURES = Path(__file__).parent / "fixtures"
P3DN = "p3dn.24xlarge"


def fixture(name: str) -> Table:
    return parse((FIXTURES / name).read_text())


def synthetic(nranks: int, peak_busbw: float, max_size: int) -> Table:
    """A table written through nccl_checks.table, timed for ``peak_busbw`` with ``nranks``."""
    lines = []
    size = 1 << 20
    while size <= max_size:
        time_us = 50 + size / (peak_busbw / bus_factor(nranks) * 1e3)
        a = algbw(size, time_us)
        m = Measurement(time_us, a, a * bus_factor(nranks), 0.0)
        lines.append(row_line(size, size // 4, m, m))
        size *= 2
    header = "#  size  count  type  redop  root  time algbw busbw #wrong  time algbw busbw #wrong"
    return parse("\n".join([header, *lines, *footer_lines(0, 1.0, "all_reduce_perf")]))


@pytest.mark.parametrize(("n", "factor"), [(1, 0.0), (2, 1.0), (8, 1.75), (16, 1.875)])
def test_bus_factor(n: int, factor: float) -> None:
    assert bus_factor(n) == pytest.approx(factor)


def test_bandwidth_arithmetic() -> None:
    assert algbw(1_000_000_000, 100_000) == pytest.approx(10.0)  # 1 GB in 0.1 s
    assert busbw(1_000_000_000, 100_000, 16) == pytest.approx(18.75)
    with pytest.raises(ValueError):
        algbw(8, 0)
    with pytest.raises(ValueError):
        bus_factor(0)


def test_busbw_recompute_tolerates_print_rounding_only() -> None:
    size, t = 1 << 30, 209_715.2  # 1 GiB at ~5.12 GB/s algbw
    exact = busbw(size, t, 16)
    assert busbw_matches(Measurement(t, None, round(exact, 2), 0), size, 16)[0]
    assert not busbw_matches(Measurement(t, None, exact * 1.05, 0), size, 16)[0]
    assert not busbw_matches(Measurement(t, None, round(exact, 2), 0), size, 8)[0]
    assert busbw_matches(Measurement(None, None, 1.0, 0), size, 16) == (True, None)


@pytest.mark.parametrize(
    ("itype", "nodes", "floor"),
    [
        (P3DN, 2, 8.0),
        (P3DN, 3, 4.8),
        (P3DN, 32, 4.8),
        ("p4de.24xlarge", 2, 62.4),
        ("p4d.24xlarge", 2, 45.6),
        ("p5.48xlarge", 2, 389.6),
        (CPU, 2, 0.02),
        (CPU, 4, 0.02),
    ],
)
def test_threshold_lookup(itype: str, nodes: int, floor: float) -> None:
    found = threshold_for(itype, nodes)
    assert found is not None and found.floor_gbps == pytest.approx(floor)
    assert found.source  # every number says where it comes from


@pytest.mark.parametrize(("itype", "nodes"), [(P3DN, 1), ("p4de.24xlarge", 4), (CPU, 1), ("x", 2)])
def test_no_threshold(itype: str, nodes: int) -> None:
    assert threshold_for(itype, nodes) is None


def test_threshold_table_is_consistent() -> None:
    for t in THRESHOLDS:
        others = [o for o in THRESHOLDS if o is not t and o.instance_type == t.instance_type]
        for nodes in range(t.min_nodes, (t.max_nodes or 64) + 1):
            assert not any(o.covers(t.instance_type, nodes) for o in others), (t, nodes)
        if t.instance_type != CPU:
            typical = float(t.typical.split()[0].lstrip("~"))
            assert t.floor_gbps == pytest.approx(FLOOR_FRACTION * typical, abs=0.05)
    assert "SANITY FLOOR" in next(t for t in THRESHOLDS if t.instance_type == CPU).source


def test_ranks_per_node() -> None:
    assert ranks_per_node(P3DN) == 8 and ranks_per_node(CPU) == 1
    with pytest.raises(ValueError, match="unknown instance type"):
        ranks_per_node("m5.large")


def test_healthy_p3dn_pair() -> None:
    v = judge(fixture("current_root_p3dn_2nodes.txt"), P3DN, 2)
    assert v.healthy and v.ranks == 16
    assert v.large_busbw == pytest.approx(9.6, abs=0.01) and v.large_size >= 256 * MiB
    assert "9.60 GB/s" in v.reason and ">= 8 GB/s" in v.reason
    assert [c.name for c in v.checks if not c.ok] == []


def test_slow_pair_is_unhealthy_on_bandwidth() -> None:
    v = judge(fixture("older_noroot_error_p3dn_2nodes_slow.txt"), P3DN, 2)
    assert not v.healthy
    assert v.reason.startswith("busbw 3.10 GB/s") and "< 8 GB/s floor" in v.reason


def test_wrong_elements_are_unhealthy() -> None:
    v = judge(fixture("srun_label_wrong_p3dn_2nodes.txt"), P3DN, 2)
    assert not v.healthy
    assert "3 out-of-bounds" in v.reason and "64 MiB (out-of-place)" in v.reason
    assert next(c for c in v.checks if c.name == "bandwidth").ok  # bandwidth alone was fine


def test_layout_mismatch() -> None:
    v = judge(fixture("current_root_p3dn_2nodes.txt"), P3DN, 4)
    assert not v.healthy and "16 ranks but 32 were expected" in v.reason


@pytest.mark.parametrize("nodes", [1, 4])
def test_recompute_catches_a_wrong_rank_count(nodes: int) -> None:
    table = fixture("table_only_16ranks.txt")  # no device list: ranks come from --nodes
    assert judge(table, P3DN, 2).healthy
    v = judge(table, P3DN, nodes)
    assert not v.healthy and "size/time for" in v.reason and f"{nodes * 8} ranks" in v.reason


def test_sweep_must_reach_the_judged_size() -> None:
    v = judge(synthetic(16, 80.0, 512 * MiB), "p4de.24xlarge", 2)
    assert not v.healthy and "stops at 512 MiB" in v.reason and "1 GiB" in v.reason
    assert judge(synthetic(16, 80.0, 2 * GiB), "p4de.24xlarge", 2).healthy


def test_not_judged_without_a_threshold() -> None:
    v = judge(synthetic(24, 50.0, 1 * GiB), "p4d.24xlarge", 3)
    assert v.healthy and v.threshold is None and "not judged" in v.reason
    assert not v.judged and v.exit_code == 3  # could not judge: exit 3, never "healthy" (0)
    judged = judge(synthetic(24, 50.0, 1 * GiB), "p4d.24xlarge", 3, min_busbw=40.0)
    assert judged.judged and judged.exit_code == 0
    broken = judge(synthetic(24, 50.0, 1 * GiB), "p4d.24xlarge", 4)  # 24 ranks, 32 expected
    assert not broken.healthy and broken.exit_code == 1  # a failed check still says unhealthy


def test_min_busbw_override() -> None:
    table = fixture("current_root_p3dn_2nodes.txt")
    v = judge(table, P3DN, 2, min_busbw=20.0)
    assert not v.healthy and "< 20 GB/s" in v.reason
    assert v.threshold is not None and "--min-busbw" in v.threshold.source


def test_nccl_tests_min_bw_failed_footer() -> None:
    table = dataclasses.replace(fixture("current_root_p3dn_2nodes.txt"), avg_busbw_failed=True)
    v = judge(table, P3DN, 2)
    assert not v.healthy and "NCCL_TESTS_MIN_BW" in v.reason


def test_other_collectives_are_refused() -> None:
    table = dataclasses.replace(fixture("current_root_p3dn_2nodes.txt"), collective="all_gather")
    assert "not all_reduce_perf" in judge(table, P3DN, 2).reason


def test_large_message_busbw_uses_the_top_sizes_only() -> None:
    table = synthetic(16, 9.0, 1 * GiB)
    fast_small = Measurement(1.0, 500.0, 937.5, 0.0)  # an outlier at a small size
    rows = (dataclasses.replace(table.rows[0], in_place=fast_small), *table.rows[1:])
    peak, at = large_message_busbw(dataclasses.replace(table, rows=rows))
    assert at is not None and at >= (1 * GiB) // 8 and peak == pytest.approx(9.0, rel=0.02)
