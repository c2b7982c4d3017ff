"""``python -m nccl_checks``: all-reduce bandwidth and GPU health checks for Slurm nodes.

Exit codes: 0 healthy, 1 unhealthy (one-line reason), 2 bad arguments or unreadable input,
3 could not check (no NVIDIA driver, no Slurm, a job that never ran), 4 the check crashed (a bug).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import TypeAlias

from hpc_core import slurm
from hpc_core.slurm_env import SlurmEnv
from nccl_checks import (
    EXIT_CANNOT_RUN,
    EXIT_CRASHED,
    EXIT_HEALTHY,
    EXIT_UNHEALTHY,
    EXIT_USAGE,
    allreduce,
    gpu,
    nvml_reader,
)
from nccl_checks.parse import ParseError, parse
from nccl_checks.table import parse_size
from nccl_checks.verdict import judge

DESCRIPTION = __doc__
GPU_DEFAULT = allreduce.GPU_DEFAULT
# What add_subparsers returns (argparse names its class privately).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class UsageError(ValueError):
    """Bad input: one line on stderr, exit 2."""


def _verdict_line(code: int, reason: str) -> str:
    word = {EXIT_HEALTHY: "HEALTHY", EXIT_UNHEALTHY: "UNHEALTHY"}.get(code, "NOT CHECKED")
    return f"{word}: {reason}"


def _find_binary(given: str | None) -> str:
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise UsageError(f"--binary {given}: not an executable file")
        return os.path.abspath(given)
    home = os.environ.get("NCCL_TESTS_HOME")
    candidates = [shutil.which("all_reduce_perf")]
    candidates += [os.path.join(home, "build", "all_reduce_perf")] if home else []
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise UsageError(
        "all_reduce_perf not found (PATH, $NCCL_TESTS_HOME/build): build nccl-tests with MPI=1 "
        "and pass --binary, or use --backend nccl (torch.distributed, no nccl-tests needed)"
    )


def _node_count(args: argparse.Namespace) -> int:
    if args.nodes is not None:
        return int(args.nodes)
    if args.nodelist:
        try:
            return len(slurm.hostnames(args.nodelist))
        except slurm.SlurmError as err:
            raise UsageError(f"--nodelist {args.nodelist}: {err}; give --nodes") from None
    nodes = SlurmEnv().job_num_nodes
    return nodes if nodes is not None else 2


def _plan(args: argparse.Namespace) -> allreduce.CheckPlan:
    binary = None
    if args.backend == "nccl-tests":
        binary = args.binary if args.dry_run else _find_binary(args.binary)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    return allreduce.make_plan(
        backend=args.backend,
        nodes=_node_count(args),
        out_dir=Path(args.out or f".local/nccl-checks/allreduce-{args.backend}-{stamp}"),
        instance_type=args.instance_type,
        gpus_per_node=args.gpus_per_node,
        min_bytes=parse_size(args.min_bytes),
        max_bytes=parse_size(args.max_bytes) if args.max_bytes else None,
        factor=args.factor,
        warmup=args.warmup,
        iters=args.iters,
        binary=binary,
        partition=args.partition,
        nodelist=args.nodelist,
        time_limit=args.time,
        mpi=args.mpi,
        min_busbw=args.min_busbw,
        drain=args.drain,
    )


def cmd_allreduce(args: argparse.Namespace) -> int:
    plan = _plan(args)
    try:
        if args.dry_run:
            print(allreduce.dry_run_text(plan))
            return EXIT_HEALTHY
        if SlurmEnv().job_id:
            outcome = allreduce.run_in_allocation(plan, timeout_s=plan.time_limit * 60.0)
        else:
            outcome = allreduce.submit(plan, wait_timeout_s=args.wait_timeout)
        drained = allreduce.drain_failed(outcome) if plan.drain else []
    except slurm.SlurmError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    result = plan.out_dir / allreduce.RESULT
    if args.json:
        record = json.loads(result.read_text()) if result.exists() else outcome.to_dict()
        print(json.dumps(record | {"drained": drained}, indent=2))
        return outcome.exit_code
    raw = plan.out_dir / allreduce.RAW
    if raw.exists():
        print(raw.read_text().rstrip())
    print(f"# results: {result}")
    if drained:
        print(f"# drained: {', '.join(drained)}")
    print(_verdict_line(outcome.exit_code, outcome.reason))
    return outcome.exit_code


def cmd_parse(args: argparse.Namespace) -> int:
    try:
        text = Path(args.file).read_text() if args.file != "-" else sys.stdin.read()
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read {args.file}: {err}") from None
    try:
        table = parse(text)
    except ParseError as err:
        raise UsageError(f"{args.file}: {err}") from None
    verdict = judge(table, args.instance_type, args.nodes, args.gpus_per_node, args.min_busbw)
    code = verdict.exit_code  # 3 when no threshold covers this shape: not judged
    if args.json:
        print(json.dumps(verdict.to_dict() | {"exit_code": code}, indent=2))
    else:
        for check in verdict.checks:
            print(f"# {check.name:<18} {'ok  ' if check.ok else 'FAIL'} {check.detail}")
        print(_verdict_line(code, verdict.reason))
    return code


def cmd_gpu(args: argparse.Namespace) -> int:
    try:
        state = gpu.load_state(Path(args.state)) if args.state else nvml_reader.read_node_state()
    except gpu.NvmlUnavailable as err:
        print(f"no GPU check: {err}", file=sys.stderr)
        if args.json:
            print(json.dumps({"exit_code": EXIT_CANNOT_RUN, "reason": str(err)}))
        return EXIT_CANNOT_RUN
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(f"--state {args.state}: {err}") from None
    report = gpu.check_node(state, args.instance_type or GPU_DEFAULT)
    code = EXIT_HEALTHY if report.healthy else EXIT_UNHEALTHY
    node = args.node or SlurmEnv().nodename or socket.gethostname().split(".")[0]
    drained = False
    if args.drain and not report.healthy:
        try:
            slurm.drain(node, f"nccl_checks gpu: {report.reason}"[:200])
            drained = True
        except slurm.SlurmError as err:
            print(f"error: could not drain {node}: {err}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict() | {"node": node, "drained": drained}, indent=2))
    else:
        print(gpu.render(report))
        if drained:
            print(f"# drained {node}")
        print(_verdict_line(code, report.reason))
    return code


def _verdict_options(p: argparse.ArgumentParser) -> None:
    """Options that shape the all-reduce verdict, shared by `allreduce` and `parse`."""
    p.add_argument("--gpus-per-node", type=int, help="ranks per node (default: instance's GPUs)")
    p.add_argument("--min-busbw", type=float, help="override the bandwidth floor, GB/s")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nccl_checks",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{allreduce,parse,gpu}")
    _add_allreduce_parser(sub)
    _add_parse_parser(sub)
    _add_gpu_parser(sub)
    return parser


def _add_allreduce_parser(sub: Subparsers) -> None:
    ar = sub.add_parser(
        "allreduce",
        help="all-reduce bus bandwidth across nodes through Slurm",
        description="Submit (or, inside an allocation, run) an all-reduce sweep over N nodes, "
        "save the raw table and result.json, and judge the large-message busbw against the "
        "threshold for the instance type. Backends: nccl-tests (all_reduce_perf, one rank per "
        "GPU, srun --mpi), nccl (torch.distributed on GPUs, when nccl-tests is not built), gloo "
        "(torch.distributed on CPUs, one rank per node: the GPU-free twin).",
    )
    ar.add_argument("--backend", choices=allreduce.BACKENDS, default="nccl-tests")
    ar.add_argument("--nodes", type=int, help="default: the allocation's node count, else 2")
    ar.add_argument("--instance-type", help=f"default {GPU_DEFAULT}; 'cpu' for gloo")
    _verdict_options(ar)
    ar.add_argument("--binary", help="a built all_reduce_perf (nccl-tests, MPI=1)")
    ar.add_argument("--out", help="result directory (default .local/nccl-checks/…)")
    ar.add_argument("--min-bytes", "-b", default="8")
    ar.add_argument("--max-bytes", "-e", help="default 2G on GPUs, 16M with gloo")
    ar.add_argument("--factor", "-f", type=int, default=2)
    ar.add_argument("--warmup", "-w", type=int, help="default 5 (gloo: 2)")
    ar.add_argument("--iters", "-n", type=int, help="default 20 (gloo: 10)")
    ar.add_argument("--partition")
    ar.add_argument("--nodelist", help="exactly these nodes, e.g. a pair: n3,n4")
    ar.add_argument("--time", type=int, default=10, help="job time limit, minutes")
    ar.add_argument("--mpi", default="pmix", help="srun --mpi for all_reduce_perf")
    ar.add_argument("--wait-timeout", type=float, default=1800.0, help="seconds to wait for job")
    ar.add_argument("--drain", action="store_true", help="drain the run's nodes if unhealthy")
    ar.add_argument("--dry-run", action="store_true", help="print sbatch/srun, submit nothing")
    ar.set_defaults(func=cmd_allreduce)


def _add_parse_parser(sub: Subparsers) -> None:
    pa = sub.add_parser(
        "parse",
        help="judge an all_reduce_perf output saved by hand",
        description="Parse nccl-tests output (text in any known layout, or the -J JSON) and "
        "give the same verdict as `allreduce`. Exit 0 healthy, 1 unhealthy, 2 unreadable, "
        "3 not judged (no bandwidth threshold for this instance type and node count).",
    )
    pa.add_argument("file", help="saved output ('-' for stdin)")
    pa.add_argument("--instance-type", required=True, help="e.g. p3dn.24xlarge, or cpu")
    pa.add_argument("--nodes", type=int, required=True)
    _verdict_options(pa)
    pa.set_defaults(func=cmd_parse)


def _add_gpu_parser(sub: Subparsers) -> None:
    gp = sub.add_parser(
        "gpu",
        help="NVML health of this node's GPUs (count, ECC, retired/remapped memory, …)",
        description="Check this node's GPUs through NVML: count for the instance type, "
        "uncorrectable ECC, retired pages pending (V100) / row-remap failures (A100+), "
        "temperature and throttling, persistence mode, NVLink links, and XID errors in the "
        "kernel log. Exit 3 when there is no NVIDIA driver.",
    )
    gp.add_argument("--instance-type", help=f"expected GPUs and NVLinks (default {GPU_DEFAULT})")
    gp.add_argument("--drain", action="store_true", help="drain this node if unhealthy")
    gp.add_argument("--node", help="Slurm node name to drain (default $SLURMD_NODENAME/hostname)")
    gp.add_argument("--state", help="judge a recorded state (`gpu --json` output) instead")
    gp.add_argument("--json", action="store_true")
    gp.set_defaults(func=cmd_gpu)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (UsageError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:  # a bug must not read as a verdict (1 = unhealthy)
        traceback.print_exc()
        print(f"error: nccl_checks crashed: {err!r}", file=sys.stderr)
        return EXIT_CRASHED


if __name__ == "__main__":
    sys.exit(main())
