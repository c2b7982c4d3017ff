"""CLI: `python -m hpc_train.cluster render|validate|check-update` (the logic lives in render.py /
validate.py).

Exit codes: 0 ok; 1 the config has errors (validate); 2 bad input (a missing or malformed value,
an unreadable file, the aws extra not installed).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from hpc_core.rundir import atomic_write
from hpc_train.cluster import render
from hpc_train.cluster.validate import NODE_STATES, Report  # no pcluster import at module level

if TYPE_CHECKING:
    from hpc_train.cluster.fake_aws import AccountFacts

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2

# What add_subparsers returns (argparse names its class privately).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

FAKE_AWS_NOTE = (
    "AWS is faked by moto inside this command: fake credentials, no network. What the file names "
    "(subnets, key pair, buckets, objects, AMIs, placement groups, reservations) is created in the "
    "fake account, so each is listed below as 'not checked offline'. The last check is AWS's own: "
    "pcluster create-cluster (build-image for an image config) --dryrun true with your credentials."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.cluster",
        description="Render and check AWS ParallelCluster configs for hpc-train.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_render_parser(sub)
    _add_validate_parser(sub)
    _add_check_update_parser(sub)
    return parser


def _add_render_parser(sub: Subparsers) -> None:
    names = ", ".join("${" + p.name + "}" for p in render.PLACEHOLDERS)
    rp = sub.add_parser(
        "render",
        help="fill a template's placeholders and write a ready config",
        description=f"Fill the placeholders ({names}) of a template from pcluster_configs/ and "
        "write the result atomically (temporary file + rename). Every value is checked first; "
        "a missing or malformed one is reported in one line and nothing is written (exit 2). "
        "Flags override the values file.",
        epilog="example: python -m hpc_train.cluster render pcluster_configs/p3dn.yaml "
        "--values pcluster_configs/examples/values.yaml -o cluster.yaml",
    )
    rp.add_argument("template", type=Path, help="template, e.g. pcluster_configs/p3dn.yaml")
    rp.add_argument("-o", "--output", type=Path, required=True, help="config file to write")
    rp.add_argument(
        "--values", type=Path, help="YAML file of values (keys: head_subnet_id, bucket, ...)"
    )
    for spec in render.PLACEHOLDERS:
        rp.add_argument(spec.flag, dest=spec.key, metavar=spec.name, help=spec.help)


def _add_validate_parser(sub: Subparsers) -> None:
    vp = sub.add_parser(
        "validate",
        help="check rendered configs with ParallelCluster's schema and validators (offline)",
        description="Load each FILE through ParallelCluster's ClusterSchema, then run its "
        "validators against a fake AWS account (moto): no credentials, no network. Prints every "
        "finding with its YAML path and level. Exit 0 clean (warnings allowed), 1 errors, "
        "2 unreadable input. Needs the aws extra: pip install -e '.[aws]'.",
    )
    vp.add_argument("files", nargs="+", type=Path, metavar="FILE")
    vp.add_argument("--cluster-name", default="hpc-train", help="name the checks assume")
    vp.add_argument(
        "--suppress-validators",
        nargs="+",
        default=[],
        metavar="EXPR",
        help="skip validators, as pcluster create-cluster does: ALL or type:NAME, e.g. "
        "type:InstanceTypeBaseAMICompatibleValidator (the p3dn custom AMI, docs/on-aws.md)",
    )
    # What the account is like beyond the file: stated, then listed as assumed.
    vp.add_argument(
        "--private-subnet",
        action="append",
        default=[],
        metavar="SUBNET",
        help="this subnet of the config does not assign public IPs (by default the head node's "
        "does and every other does not); may be repeated",
    )
    vp.add_argument(
        "--public-subnet",
        action="append",
        default=[],
        metavar="SUBNET",
        help="this subnet of the config assigns public IPs; may be repeated",
    )


def _add_check_update_parser(sub: Subparsers) -> None:
    up = sub.add_parser(
        "check-update",
        help="may a cluster created from OLD be updated to NEW? (pcluster's own update check)",
        description="Run ParallelCluster's update-policy check (ConfigPatch, as pcluster "
        "update-cluster does) on two rendered configs, offline. Prints each change with its "
        "update policy and verdict. What pcluster asks the live cluster (is the compute fleet, a "
        "login node, the head node running?) is assumed, 'running' unless a flag says otherwise, "
        "and listed as 'not checked offline'. Exit 0 allowed, 1 refused, 2 unreadable input.",
        epilog="example: python -m hpc_train.cluster check-update cluster.yaml cluster-new.yaml",
    )
    up.add_argument("old", type=Path, help="the config the cluster runs")
    up.add_argument("new", type=Path, help="the config to update it to")
    # What pcluster reads from the live cluster: assumed, by name, the stricter way by default.
    up.add_argument(
        "--fleet",
        choices=NODE_STATES,
        default="running",
        help="the compute fleet's state (default running; stopped after "
        "pcluster update-compute-fleet --status STOP_REQUESTED)",
    )
    up.add_argument(
        "--login-nodes",
        choices=NODE_STATES,
        default="running",
        help="the login nodes' state, if the cluster has pools (default running)",
    )
    up.add_argument(
        "--head-node",
        choices=NODE_STATES,
        default="running",
        help="the head node's EC2 state (default running)",
    )


def cmd_check_update(args: argparse.Namespace) -> int:
    from hpc_train.cluster import requeue_hold, validate

    try:
        validate.require_extra()
        _, old = validate.read_config(args.old)
        _, new = validate.read_config(args.new)
    except (validate.MissingExtra, validate.UnreadableConfig) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    live = validate.LiveCluster(
        compute_fleet=args.fleet, login_nodes=args.login_nodes, head_node=args.head_node
    )
    try:
        allowed, changes = validate.update_check(old, new, live)
    except Exception as err:  # a crash inside pcluster or moto: one line, never a traceback
        reason = " ".join(f"{type(err).__name__}: {err}".split())
        print(f"error: the update check could not run: {reason}", file=sys.stderr)
        return EXIT_USAGE
    for line in live.not_checked(old):
        print(f"not checked offline: {line}")
    for change in changes:
        print(f"{change.check:<13} {change.path} [{change.policy}]")
        if change.check != "SUCCEEDED":
            print(f"    {change.reason}; {change.action}")
    for note in requeue_hold.update_notes(old, new):
        print(f"note: {note}")
    print(f"result: update {'allowed' if allowed else 'REFUSED'} ({len(changes)} change(s))")
    return EXIT_OK if allowed else EXIT_FINDINGS


def cmd_render(args: argparse.Namespace) -> int:
    try:
        values = render.load_values(args.values) if args.values else {}
        for spec in render.PLACEHOLDERS:
            flag_value = getattr(args, spec.key)
            if flag_value is not None:
                values[spec.key] = flag_value
        try:
            template = args.template.read_text(encoding="utf-8")
        except OSError as err:
            raise render.RenderError(
                f"cannot read template {args.template}: {err.strerror}"
            ) from None
        text = render.render_text(template, values)
        atomic_write(args.output, text)
    except render.RenderError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:
        print(f"error: cannot write {args.output}: {err.strerror}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {args.output} (from {args.template})")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from hpc_train.cluster import validate

    try:
        validate.require_extra()
    except validate.MissingExtra as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        suppress = validate.parse_suppressions(args.suppress_validators)
    except validate.BadSuppression as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    from hpc_train.cluster.fake_aws import AccountFacts

    facts = AccountFacts(frozenset(args.private_subnet), frozenset(args.public_subnet))
    print(FAKE_AWS_NOTE)
    worst = EXIT_OK
    for path in args.files:
        print(f"\n== {path}")
        code = _validate_file(path, args.cluster_name, suppress, facts)
        if code == EXIT_USAGE or (code == EXIT_FINDINGS and worst == EXIT_OK):
            worst = code
    return worst


def _validate_file(path: Path, cluster_name: str, suppress: set[str], facts: AccountFacts) -> int:
    """Check one FILE and print its report: EXIT_OK, EXIT_FINDINGS, or EXIT_USAGE (said why)."""
    from hpc_train.cluster import validate
    from hpc_train.cluster.fake_aws import BadFact

    try:
        text, data = validate.read_config(path)
    except validate.UnreadableConfig as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    started = time.monotonic()
    try:
        report = validate.validate_config(
            text, data, cluster_name=cluster_name, suppress=suppress, facts=facts
        )
    except BadFact as err:
        print(f"error: {path}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except validate.NotCheckableOffline as err:
        print(f"error: {path} is not checkable offline: {err}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:  # a crash inside pcluster or moto: say so, keep checking the rest
        reason = " ".join(f"{type(err).__name__}: {err}".split())
        print(f"error: {path} could not be checked: {reason}", file=sys.stderr)
        return EXIT_USAGE
    _print_report(report, took=time.monotonic() - started)
    return EXIT_FINDINGS if report.errors else EXIT_OK


def _print_report(report: Report, took: float) -> None:
    from hpc_train.cluster import validate

    if report.validators_run:
        print(f"schema: ok; validators: {report.validators_run} ran in {took:.1f} s")
        for name, why in report.skipped.items():
            print(f"skipped {name}: {why}")
        for name in report.suppressed:
            print(f"suppressed {name} (--suppress-validators)")
    for line in report.assumed:
        print(f"assumed: {line}")
    for line in report.not_checked:
        print(f"not checked offline: {line}")
    for line in report.slurm_kept:
        print(f"slurm.conf keeps ParallelCluster's own {line}")
    for line in report.slurm_replaced:
        print(f"slurm.conf: {line}")
    for host in report.refused:
        print(f"note: refused a network attempt to {host} (AWS is faked; nothing left the machine)")
    for finding in report.findings:
        print(finding)
    counts = Counter(f.level for f in report.findings)
    summary = ", ".join(f"{level.lower()}: {counts[level]}" for level in validate.LEVELS)
    print(f"result: {'FAILED' if report.errors else 'ok'} ({summary})")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "render":
        return cmd_render(args)
    if args.command == "check-update":
        return cmd_check_update(args)
    return cmd_validate(args)


if __name__ == "__main__":
    sys.exit(main())
