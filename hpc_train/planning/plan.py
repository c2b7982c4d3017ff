"""Plan a run: the save interval that minimises expected wall time (Young 1974 / Daly 2006), the
expected ETTR (effective training time ratio), wall time and cost, per node count.

    python -m hpc_train.planning.plan --instance-type p4d.24xlarge --nodes 1,8,64 --mtbf-hours 2000 \\
        --updates 125000 --update-seconds 0.9
    python -m hpc_train.planning.plan --instance-type p5.48xlarge --nodes 16,32 --mtbf-hours 5000 \\
        --spot-rate 0.01 --updates 125000 --update-seconds 1.2,0.6 --save-seconds 40 --json

The model (Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart
dumps", FGCS 22): failures arrive at random (exponential) with the job's MTBF M = node MTBF /
nodes; every save stalls training C seconds; every failure costs R seconds (requeue, start,
load) plus the work since the last save. Young's first-order interval is sqrt(2 C M); Daly's
higher-order one is used here. Expected wall time for T_s seconds of work saved every tau:
``T_w = M e^{R/M} (e^{(tau+C)/M} - 1) T_s / tau``; ETTR = T_s / T_w.

On spot capacity the node's failure rate is its hardware rate plus the spot interruption rate
(``--spot-rate``, interruptions per node-hour); the spot columns use that rate, the on-demand
columns the hardware MTBF alone. Prices come from prices.toml beside this module: list prices as of the
date in that file, probably stale; override them with --on-demand-price / --spot-price.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpc_core import instances
from hpc_train import cli
from hpc_train.job import presets
from hpc_train.job.spec import SIGNAL_DELAY_S, JobSpec
from hpc_train.planning import costs

PRICES = Path(__file__).with_name("prices.toml")
CONFIGS = Path(__file__).resolve().parents[2] / "pcluster_configs"
DEFAULT_RESTART_S = 300.0  # requeue, a dynamic node's start, the checkpoint load: a guess


class PlanError(ValueError):
    """Bad input; one line for the user."""


# --- the formulas (pure) ------------------------------------------------------------------------


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young (1974): compute time between saves, sqrt(2 C M)."""
    _check_positive(save_seconds=save_s, mtbf_seconds=mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly (2006) higher-order optimum: for C < 2M,
    sqrt(2CM) (1 + sqrt(C/2M)/3 + (C/2M)/9) - C; else M."""
    _check_positive(save_seconds=save_s, mtbf_seconds=mtbf_s)
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


def expected_wall_s(
    work_s: float, interval_s: float, save_s: float, restart_s: float, mtbf_s: float
) -> float:
    """Daly (2006) expected wall time: M e^{R/M} (e^{(tau+C)/M} - 1) T_s / tau."""
    _check_positive(interval_seconds=interval_s, mtbf_seconds=mtbf_s)
    if work_s < 0 or save_s < 0 or restart_s < 0:
        raise PlanError("work, save and restart seconds must be >= 0")
    m = mtbf_s
    return m * math.exp(restart_s / m) * math.expm1((interval_s + save_s) / m) * work_s / interval_s


def job_mtbf_s(node_mtbf_h: float, nodes: int, spot_rate_per_h: float = 0.0) -> float:
    """The job's MTBF in seconds: any of ``nodes`` failing (or, on spot, being reclaimed) ends it."""
    if nodes < 1:
        raise PlanError(f"nodes must be >= 1 (got {nodes})")
    _check_positive(mtbf_hours=node_mtbf_h)
    if spot_rate_per_h < 0:
        raise PlanError(f"--spot-rate must be >= 0 (got {spot_rate_per_h:g})")
    node_rate = 1 / node_mtbf_h + spot_rate_per_h
    return 3600 / (node_rate * nodes)


def auto_interval(spec: JobSpec, nodes: int, gpu: bool) -> tuple[float, float] | None:
    """``--save-interval auto`` on ``nodes`` nodes: (the job's MTBF s, the preset's estimated
    save s) for rank 0's chooser (``worker.save_interval``); None for a fixed interval."""
    if spec.saves.interval != "auto":
        return None
    return job_mtbf_s(spec.saves.mtbf_hours, nodes), costs.estimated_save_s(
        spec.training.preset, gpu
    )


def _check_positive(**values: float) -> None:
    """PlanError unless every value is > 0 (NaN too); names become flags: save_s -> --save-s."""
    for name, value in values.items():
        if not value > 0:
            raise PlanError(f"--{name.replace('_', '-')} must be > 0 (got {value:g})")


# --- prices -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Price:
    on_demand: float
    spot: float


@dataclass(frozen=True)
class PriceTable:
    as_of: str
    region: str
    source: str
    prices: dict[str, Price]


def load_prices(path: Path = PRICES) -> PriceTable:
    doc = tomllib.loads(path.read_text())
    return PriceTable(
        as_of=doc["as_of"],
        region=doc["region"],
        source=f"{doc['source_on_demand']} ; {doc['source_spot']}",
        prices={
            name: Price(float(p["on_demand"]), float(p["spot"]))
            for name, p in doc["instances"].items()
        },
    )


# --- one row per node count ---------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    """One capacity type's figures at one node count."""

    mtbf_h: float  # the job's
    interval_updates: int
    interval_min: float
    ettr: float
    wall_h: float
    cost_usd: float


@dataclass(frozen=True)
class PlanRow:
    nodes: int
    update_s: float
    on_demand: Capacity
    spot: Capacity


def capacity(
    nodes: int,
    updates: int,
    update_s: float,
    save_s: float,
    restart_s: float,
    mtbf_s: float,
    price_per_h: float,
) -> Capacity:
    """The Daly interval rounded to whole updates (at least 1), and what it gives."""
    interval_updates = max(1, round(daly_interval(save_s, mtbf_s) / update_s))
    interval_s = interval_updates * update_s
    work_s = updates * update_s
    wall_s = expected_wall_s(work_s, interval_s, save_s, restart_s, mtbf_s)
    return Capacity(
        mtbf_h=mtbf_s / 3600,
        interval_updates=interval_updates,
        interval_min=interval_s / 60,
        ettr=work_s / wall_s,
        wall_h=wall_s / 3600,
        cost_usd=wall_s / 3600 * nodes * price_per_h,
    )


def plan_rows(
    node_counts: Sequence[int],
    update_seconds: Sequence[float],
    updates: int,
    save_s: float,
    restart_s: float,
    node_mtbf_h: float,
    spot_rate_per_h: float,
    price: Price,
) -> list[PlanRow]:
    if updates < 1:
        raise PlanError(f"--updates must be >= 1 (got {updates})")
    if len(update_seconds) not in (1, len(node_counts)):
        raise PlanError("--update-seconds: one value, or one per --nodes count")
    _check_positive(save_seconds=save_s)
    if restart_s < 0:
        raise PlanError(f"--restart-seconds must be >= 0 (got {restart_s:g})")
    rows = []
    for i, nodes in enumerate(node_counts):
        update_s = update_seconds[i if len(update_seconds) > 1 else 0]
        _check_positive(update_seconds=update_s)
        od = job_mtbf_s(node_mtbf_h, nodes)
        sp = job_mtbf_s(node_mtbf_h, nodes, spot_rate_per_h)
        rows.append(
            PlanRow(
                nodes,
                update_s,
                capacity(nodes, updates, update_s, save_s, restart_s, od, price.on_demand),
                capacity(nodes, updates, update_s, save_s, restart_s, sp, price.spot),
            )
        )
    return rows


HEADER = (
    f"{'nodes':>5} {'s/upd':>6} | {'on-demand: MTBF h':>17} {'interval':>15} {'ETTR':>6} "
    f"{'wall h':>8} {'cost $':>10} | {'spot: MTBF h':>12} {'interval':>15} {'ETTR':>6} "
    f"{'wall h':>8} {'cost $':>10}"
)


def _cells(c: Capacity) -> str:
    interval = f"{c.interval_updates} ({c.interval_min:.0f}m)"
    return f"{interval:>15} {c.ettr:6.3f} {c.wall_h:8.1f} {c.cost_usd:10,.0f}"


def render(rows: Sequence[PlanRow]) -> list[str]:
    lines = [HEADER]
    for r in rows:
        lines.append(
            f"{r.nodes:>5} {r.update_s:6.3g} | {r.on_demand.mtbf_h:17.1f} {_cells(r.on_demand)} | "
            f"{r.spot.mtbf_h:12.1f} {_cells(r.spot)}"
        )
    return lines


# --- the command line ---------------------------------------------------------------------------


def _listed(cast: Callable[[str], Any], example: str, rule: str) -> Callable[[str], list[Any]]:
    """An argparse type for ``V`` or ``V,V,...``: each value cast, each > 0 (``rule`` says so)."""

    def parse(text: str) -> list[Any]:
        try:
            values = [cast(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {example}") from None
        if any(not v > 0 for v in values):
            raise argparse.ArgumentTypeError(f"{text!r}: {rule}")
        return values

    return parse


_counts = _listed(int, "N or N,N,... (e.g. 1,8,64)", "every node count must be >= 1")
_floats = _listed(float, "S or S,S,...", "seconds per update must be > 0")


def build_parser() -> cli.Parser:
    p = cli.Parser(
        prog="hpc-train plan",
        description="Save interval (Young/Daly), expected ETTR, wall time and cost per node count.",
        epilog=cli.examples(__doc__, "hpc_train.planning.plan"),
    )
    p.add_argument(
        "--instance-type", default=instances.DEFAULT_INSTANCE_TYPE, metavar="TYPE",
        help="EC2 type: its prices (planning/prices.toml) and its cluster template's Lustre",
    )  # fmt: skip
    p.add_argument(
        "--nodes", type=_counts, required=True, metavar="N[,N...]", help="node counts, one row each"
    )
    p.add_argument(
        "--mtbf-hours", type=float, required=True, metavar="H",
        help="mean time between failures of ONE node (the job's is this / nodes)",
    )  # fmt: skip
    p.add_argument(
        "--spot-rate", type=float, default=0.0, metavar="PER_H",
        help="spot interruptions per node-hour, added to the failure rate in the spot columns",
    )  # fmt: skip
    p.add_argument(
        "--preset", default="roberta-base", choices=list(presets.PRESETS),
        help="model: its checkpoint bytes (save estimate) and its default --updates",
    )  # fmt: skip
    p.add_argument(
        "--updates", type=int, default=None, metavar="N", help="updates to train (default: the preset's)"
    )  # fmt: skip
    p.add_argument(
        "--update-seconds", type=_floats, required=True, metavar="S[,S...]",
        help="seconds per update: one value for every node count, or one per --nodes count",
    )  # fmt: skip
    p.add_argument(
        "--save-seconds", type=float, default=None, metavar="S",
        help="what one interval save stalls training (default: estimated from the preset's "
        "checkpoint bytes and the cluster config's Lustre throughput)",
    )  # fmt: skip
    p.add_argument(
        "--restart-seconds", type=float, default=DEFAULT_RESTART_S, metavar="S",
        help="requeue + node start + checkpoint load, per failure",
    )  # fmt: skip
    p.add_argument(
        "--throughput-mbs", type=float, default=None, metavar="MB_S",
        help="storage write MB/s for the estimate (default: FSx settings of the pcluster_configs/ "
        f"template for the instance type, else {costs.DEFAULT_THROUGHPUT_MBS:g})",
    )  # fmt: skip
    p.add_argument(
        "--on-demand-price", type=float, default=None, metavar="USD_H",
        help="per instance-hour (default: the list price in planning/prices.toml, maybe stale)",
    )  # fmt: skip
    p.add_argument(
        "--spot-price", type=float, default=None, metavar="USD_H",
        help="per instance-hour (default: the rough figure in planning/prices.toml)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    return p


def throughput_for(instance_type: str, override: float | None) -> tuple[float, str]:
    if override is not None:
        return override, "--throughput-mbs"
    config = costs.config_for(instance_type, CONFIGS) if CONFIGS.is_dir() else None
    if config is not None:
        try:
            return costs.cluster_throughput_mbs(config), f"FSx settings in {config.name}"
        except ValueError:
            pass
    return costs.DEFAULT_THROUGHPUT_MBS, "default FSx PERSISTENT_2 1.2 TiB x 125 MB/s/TiB"


@dataclass(frozen=True)
class _Plan:
    """What ``main`` reports: the save estimate, the rows, the notice-save verdicts."""

    updates: int
    save_s: float
    save_from: str
    nbytes: int
    rows: list[PlanRow]
    verdicts: list[costs.WindowFit]


def _price(parser: cli.Parser, args: argparse.Namespace, table: PriceTable) -> Price:
    """The instance type's prices, the flags' where given; a bad flag is the parser's error."""
    if args.instance_type not in table.prices:
        known = ", ".join(sorted(table.prices))
        parser.error(f"--instance-type {args.instance_type}: no price (known: {known})")
    for flag, least in (
        ("save_seconds", 0.0), ("throughput_mbs", 0.0), ("on_demand_price", -1), ("spot_price", -1)
    ):  # fmt: skip
        value = getattr(args, flag)
        if value is not None and not value > least:
            word = "> 0" if least == 0 else ">= 0"
            parser.error(f"--{flag.replace('_', '-')} must be {word} (got {value:g})")
    listed = table.prices[args.instance_type]
    return Price(
        listed.on_demand if args.on_demand_price is None else args.on_demand_price,
        listed.spot if args.spot_price is None else args.spot_price,
    )


def _plan(
    args: argparse.Namespace, price: Price, updates: int, throughput: tuple[float, str]
) -> _Plan:
    """The save estimate (or --save-seconds), the rows and the notice-save verdicts; a bad
    figure raises ValueError."""
    mbs, mbs_from = throughput
    nbytes = costs.preset_checkpoint_bytes(args.preset)
    if args.save_seconds is None:
        save_s = costs.save_seconds(nbytes, mbs, files=2)
        save_from = f"{nbytes / 1e9:.2f} GB x 2 files at {mbs:g} MB/s, {mbs_from}"
    else:
        save_s, save_from = args.save_seconds, "--save-seconds"
    rows = plan_rows(
        args.nodes, args.update_seconds, updates, save_s, args.restart_seconds,
        args.mtbf_hours, args.spot_rate, price,
    )  # fmt: skip
    notice_s = costs.save_seconds(nbytes, mbs, files=1)
    verdicts = costs.window_check(
        notice_s,
        costs.windows(SIGNAL_DELAY_S, spot=args.spot_rate > 0),
        update_s=max(args.update_seconds),
    )
    return _Plan(updates, save_s, save_from, nbytes, rows, verdicts)


def _as_json(args: argparse.Namespace, plan: _Plan, price: Price, table: PriceTable) -> str:
    out = {
        "instance_type": args.instance_type,
        "preset": args.preset,
        "updates": plan.updates,
        "save_s": plan.save_s,
        "save_from": plan.save_from,
        "restart_s": args.restart_seconds,
        "node_mtbf_h": args.mtbf_hours,
        "spot_rate_per_h": args.spot_rate,
        "prices": {**asdict(price), "as_of": table.as_of, "region": table.region},
        "checkpoint_bytes": plan.nbytes,
        "notice_save": [{"window": asdict(v.window), "needed_s": v.needed_s, "fits": v.fits}
                        for v in plan.verdicts],
        "rows": [asdict(r) for r in plan.rows],
    }  # fmt: skip
    return json.dumps(out, indent=2)


def _print_table(args: argparse.Namespace, plan: _Plan, price: Price, table: PriceTable) -> None:
    print(
        f"{args.instance_type}, {args.preset}, {plan.updates} updates; save {plan.save_s:.1f} s "
        f"({plan.save_from}), restart {args.restart_seconds:g} s, node MTBF {args.mtbf_hours:g} h, "
        f"spot {args.spot_rate:g} interruptions/node-h"
    )
    print("\n".join(render(plan.rows)))
    print(
        f"prices: ${price.on_demand:g}/h on-demand, ${price.spot:g}/h spot; list prices as of "
        f"{table.as_of} ({table.region}), may be stale: see {PRICES.name}"
    )
    for v in plan.verdicts:
        print(v.line() if v.fits else f"warning: {v.line()}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    table = load_prices()
    price = _price(parser, args, table)
    updates = presets.get(args.preset).updates(args.updates)
    throughput = throughput_for(args.instance_type, args.throughput_mbs)
    try:
        plan = _plan(args, price, updates, throughput)
    except ValueError as err:  # PlanError included
        parser.error(str(err))
    if args.json:
        print(_as_json(args, plan, price, table))
    else:
        _print_table(args, plan, price, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
