"""Print the process environment hpc-train sets for an instance type (the table lives in
``hpc_core.instances``; this is its command line).

    python -m hpc_train.environment --instance-type p3dn.24xlarge     # prints `export` lines
    python -m hpc_train.environment --instance-type p4d.24xlarge --versions /etc/hpc-train/efa-versions
    python -m hpc_train.environment --instance-type cpu

``--versions FILE``: the libfabric / aws-ofi-nccl versions installed on the node, ``name=X.Y.Z``
lines as bootstrap/nccl-profile.sh records them; the variables follow aws-ofi-nccl's table for
those versions, and a version the file lacks is named "unknown" in the reasons.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpc_core.instances import cpu_env, efa_nccl_env, read_versions, shell_lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.environment",
        description="Print the EFA/NCCL (or CPU) environment hpc-train sets for an instance type.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--instance-type", required=True, help="e.g. p3dn.24xlarge, or 'cpu'")
    parser.add_argument("--debug", action="store_true", help="NCCL_DEBUG=INFO")
    parser.add_argument(
        "--versions",
        type=Path,
        metavar="FILE",
        help="installed versions, name=X.Y.Z lines (libfabric, aws-ofi-nccl); default: unknown",
    )
    args = parser.parse_args(argv)
    if args.instance_type == "cpu":
        env = cpu_env()
    else:
        try:
            versions = read_versions(args.versions.read_text()) if args.versions else None
        except OSError as err:
            print(f"error: --versions {args.versions}: {err.strerror}", file=sys.stderr)
            return 2
        except ValueError as err:
            print(f"error: --versions {args.versions}: {err}", file=sys.stderr)
            return 2
        try:
            env = efa_nccl_env(args.instance_type, debug=args.debug, versions=versions)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    print("\n".join(shell_lines(env)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
