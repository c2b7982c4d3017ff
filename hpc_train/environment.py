"""Print the process environment hpc-train sets for an instance type (the table lives in
``hpc_core.instances``; this is its command line).

    python -m hpc_train.environment --instance-type p3dn.24xlarge     # prints `export` lines
    python -m hpc_train.environment --instance-type cpu
"""

from __future__ import annotations

import argparse
import sys

from hpc_core.instances import cpu_env, efa_nccl_env, shell_lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.environment",
        description="Print the EFA/NCCL (or CPU) environment hpc-train sets for an instance type.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--instance-type", required=True, help="e.g. p3dn.24xlarge, or 'cpu'")
    parser.add_argument("--debug", action="store_true", help="NCCL_DEBUG=INFO")
    args = parser.parse_args(argv)
    if args.instance_type == "cpu":
        env = cpu_env()
    else:
        try:
            env = efa_nccl_env(args.instance_type, debug=args.debug)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    print("\n".join(shell_lines(env)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
