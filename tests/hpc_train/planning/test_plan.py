"""The planner (hpc_train.planning.plan): Young/Daly intervals and Daly's expected wall time against values
worked out by hand, the price table, and the `hpc-train plan` command line."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from hpc_core import instances
from hpc_train.planning import plan


def test_young_by_hand() -> None:
    # C = 300 s, M = 1 day = 86400 s: sqrt(2 x 300 x 86400) = sqrt(51,840,000) = 7200 s
    assert plan.young_interval(300, 86400) == pytest.approx(7200.0)


def test_daly_by_hand_small_save_cost() -> None:
    # C = 300 s, M = 86400 s: C/2M = 300/172800 = 1/576, sqrt(C/2M) = 1/24, sqrt(2CM) = 7200.
    # tau = 7200 (1 + (1/3)(1/24) + (1/9)(1/576)) - 300
    #     = 7200 + 7200/72 + 7200/5184 - 300 = 7200 + 100 + 1.388889 - 300 = 7001.388889 s
    assert plan.daly_interval(300, 86400) == pytest.approx(7001.388889, abs=1e-6)


def test_daly_by_hand_save_cost_half_the_mtbf() -> None:
    # C = 1800 s, M = 3600 s: C/2M = 1/4, sqrt = 1/2, sqrt(2CM) = sqrt(2 x 1800 x 3600) = 3600.
    # tau = 3600 (1 + 1/6 + 1/36) - 1800 = 3600 + 600 + 100 - 1800 = 2500 s
    assert plan.daly_interval(1800, 3600) == pytest.approx(2500.0)


def test_daly_when_the_save_costs_two_mtbfs_or_more() -> None:
    # C >= 2M: Daly's answer is tau = M
    assert plan.daly_interval(200, 100) == 100
    assert plan.daly_interval(300, 100) == 100
    # just below 2M the formula applies: x = 199.99/200 = 0.99995, sqrt(x) = 0.999975,
    # sqrt(2CM) = sqrt(39998) = 199.995; tau = 199.995 (1 + 0.333325 + 0.111106) - 199.99
    # = 288.879 - 199.99 = 88.889 (< M: the two branches do not meet at C = 2M)
    assert plan.daly_interval(199.99, 100) == pytest.approx(88.889, abs=1e-3)


def test_daly_is_close_to_young_minus_c_for_cheap_saves() -> None:
    young = plan.young_interval(1, 1e7)
    assert plan.daly_interval(1, 1e7) == pytest.approx(young - 1, rel=1e-3)


def test_expected_wall_by_hand() -> None:
    m = 3600.0
    tau = m * math.log(2)  # e^{tau/M} - 1 = 1
    # C = R = 0, T_s = tau: T_w = M e^0 (2 - 1) tau / tau = M
    assert plan.expected_wall_s(tau, tau, 0, 0, m) == pytest.approx(3600.0)
    # R = M ln 2: e^{R/M} = 2, so twice that
    assert plan.expected_wall_s(tau, tau, 0, m * math.log(2), m) == pytest.approx(7200.0)
    # no failures (M -> infinity): only the saves cost, T_s (tau + C) / tau = 1000 x 110/100
    assert plan.expected_wall_s(1000, 100, 10, 600, 1e15) == pytest.approx(1100.0)


def test_expected_wall_worked_example() -> None:
    # 10 days of work (T_s = 864000 s), M = 1 day, C = 300 s, R = 600 s, tau = 7001.388889 s:
    # e^{R/M} = e^{0.0069444} = 1.0069686; (tau + C)/M = 7301.388889/86400 = 0.0845068,
    # e^{0.0845068} - 1 = 0.0881802; T_s / tau = 123.40456;
    # T_w = 86400 x 1.0069686 x 0.0881802 x 123.40456 = 946,751 s (hand rounding); ETTR 0.9126
    tau = plan.daly_interval(300, 86400)
    wall = plan.expected_wall_s(864000, tau, 300, 600, 86400)
    assert wall == pytest.approx(946_751, rel=1e-4)
    assert 864000 / wall == pytest.approx(0.9126, abs=1e-4)


@pytest.mark.parametrize(("save_s", "mtbf_s"), [(300, 86400), (30, 3600), (600, 7200)])
def test_daly_interval_minimises_the_expected_wall(save_s: float, mtbf_s: float) -> None:
    best = min(
        plan.expected_wall_s(1e6, t, save_s, 60, mtbf_s) for t in range(10, int(2 * mtbf_s), 5)
    )
    daly = plan.expected_wall_s(1e6, plan.daly_interval(save_s, mtbf_s), save_s, 60, mtbf_s)
    assert daly == pytest.approx(best, rel=1e-3)
    # and a naive interval (10x too often) is measurably worse
    too_often = plan.daly_interval(save_s, mtbf_s) / 10
    assert plan.expected_wall_s(1e6, too_often, save_s, 60, mtbf_s) > 1.05 * daly


def test_job_mtbf() -> None:
    assert plan.job_mtbf_s(2000, 8) == pytest.approx(250 * 3600)  # 2000 h / 8 nodes
    # spot: 1/2000 + 0.0005 = 0.001 per node-hour -> 1000 h per node, 2 nodes -> 500 h
    assert plan.job_mtbf_s(2000, 2, spot_rate_per_h=0.0005) == pytest.approx(500 * 3600)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: plan.job_mtbf_s(2000, 0), "nodes must be >= 1"),
        (lambda: plan.job_mtbf_s(2000, 4, spot_rate_per_h=-0.1), "--spot-rate must be >= 0"),
        (lambda: plan.job_mtbf_s(0, 4), "--mtbf-hours must be > 0"),
        (lambda: plan.daly_interval(0, 100), "--save-seconds must be > 0"),
        (lambda: plan.young_interval(10, -1), "--mtbf-seconds must be > 0"),
    ],
)
def test_bad_input_raises_plan_error(call, message: str) -> None:
    with pytest.raises(plan.PlanError, match=message):
        call()


def test_rows_more_nodes_shorter_interval_lower_ettr() -> None:
    price = plan.Price(on_demand=10.0, spot=3.0)
    rows = plan.plan_rows([1, 8, 64], [0.9], 125000, 22.0, 300.0, 2000.0, 0.01, price)
    od = [r.on_demand for r in rows]
    assert [c.mtbf_h for c in od] == pytest.approx([2000, 250, 31.25])
    assert od[0].interval_updates > od[1].interval_updates > od[2].interval_updates
    assert od[0].ettr > od[1].ettr > od[2].ettr
    for r in rows:
        c = r.on_demand
        assert c.interval_min == pytest.approx(c.interval_updates * 0.9 / 60)
        assert c.cost_usd == pytest.approx(c.wall_h * r.nodes * 10.0)
        # wall = work / ETTR
        assert c.wall_h == pytest.approx(125000 * 0.9 / 3600 / c.ettr)
        # spot adds 0.01 interruptions per node-hour: a shorter job MTBF, more lost time
        assert r.spot.mtbf_h < c.mtbf_h and r.spot.ettr < c.ettr
        assert r.spot.cost_usd == pytest.approx(r.spot.wall_h * r.nodes * 3.0)
    # 1 node: 2000 h MTBF, Daly interval with C = 22 s: sqrt(2 x 22 x 7.2e6) = 17,799 s
    # (1 + 1/3 sqrt(22/1.44e7) + ...) - 22 = 17,784 s / 0.9 = 19,760 updates (rounded)
    assert od[0].interval_updates == pytest.approx(19760, abs=10)


def test_rows_per_node_update_seconds_and_mismatch() -> None:
    price = plan.Price(1.0, 1.0)
    rows = plan.plan_rows([1, 2], [2.0, 1.0], 1000, 10.0, 60.0, 1000.0, 0.0, price)
    assert [r.update_s for r in rows] == [2.0, 1.0]
    with pytest.raises(plan.PlanError, match="one per --nodes"):
        plan.plan_rows([1, 2, 4], [2.0, 1.0], 1000, 10.0, 60.0, 1000.0, 0.0, price)


def test_price_table_covers_every_instance_type() -> None:
    table = plan.load_prices()
    assert table.as_of and table.region and "aws.amazon.com" in table.source
    assert set(instances.INSTANCE_TYPES) <= set(table.prices)
    for price in table.prices.values():
        assert 0 < price.spot < price.on_demand
    assert "LIST PRICES AS OF" in plan.PRICES.read_text()


# --- the command line -------------------------------------------------------------------------

GOOD = ["--nodes", "1,8,64", "--mtbf-hours", "2000", "--update-seconds", "0.9"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--nodes", "0", "--mtbf-hours", "2000", "--update-seconds", "1"], "--nodes"),
        (["--nodes", "1,x", "--mtbf-hours", "2000", "--update-seconds", "1"], "--nodes"),
        ([*GOOD, "--spot-rate", "-0.5"], "--spot-rate must be >= 0"),
        (["--nodes", "2", "--mtbf-hours", "-1", "--update-seconds", "1"], "--mtbf-hours"),
        (["--nodes", "2", "--mtbf-hours", "0", "--update-seconds", "1"], "--mtbf-hours"),
        ([*GOOD, "--instance-type", "m5.large"], "m5.large"),
        ([*GOOD, "--save-seconds", "-3"], "--save-seconds must be > 0"),
        ([*GOOD, "--updates", "0"], "--updates must be >= 1"),
        (["--nodes", "1,2", "--mtbf-hours", "9", "--update-seconds", "1,2,3"], "one per --nodes"),
        (["--nodes", "1", "--mtbf-hours", "9", "--update-seconds", "0"], "--update-seconds"),
        (["--nodes", "1", "--update-seconds", "1"], "--mtbf-hours"),  # missing
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], needle: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        plan.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpc-train plan: error:"), err
    assert needle in err


def test_table_one_row_per_node_count(capsys) -> None:
    assert plan.main(["--instance-type", "p4d.24xlarge", *GOOD]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.lstrip().startswith("nodes"))
    rows = out[header + 1 : header + 4]
    assert [line.split()[0] for line in rows] == ["1", "8", "64"]
    assert any("may be stale" in line for line in out)
    assert any("FSx settings in p4d.yaml" in line for line in out)


def test_json_run_through_the_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.planning.plan", "--instance-type", "p4d.24xlarge", *GOOD,
         "--updates", "125000", "--spot-rate", "0.002", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["updates"] == 125000 and out["prices"]["as_of"]
    assert [r["nodes"] for r in out["rows"]] == [1, 8, 64]
    # estimated save: roberta-base (GPT-2 dictionary) 1.65 GB x 2 files at 150 MB/s = 22.0 s
    assert out["save_s"] == pytest.approx(2 * out["checkpoint_bytes"] / 150e6)
    assert out["save_s"] == pytest.approx(22.0, abs=0.1)
    for row in out["rows"]:
        assert 0 < row["spot"]["ettr"] < row["on_demand"]["ettr"] < 1
    assert {w["window"]["seconds"] for w in out["notice_save"]} == {90.0, 115.0}


def test_save_seconds_given_and_prices_overridden(capsys) -> None:
    argv = [*GOOD, "--save-seconds", "40", "--on-demand-price", "2", "--spot-price", "1", "--json"]
    assert plan.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["save_s"] == 40 and out["save_from"] == "--save-seconds"
    row = out["rows"][0]
    assert row["on_demand"]["cost_usd"] == pytest.approx(row["on_demand"]["wall_h"] * 2)


def test_help_shows_examples_and_defaults(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        plan.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "--nodes 1,8,64" in text
    assert "(default: 300.0)" in text and "(default: p3dn.24xlarge)" in text
