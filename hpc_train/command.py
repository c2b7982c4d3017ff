"""``hpc-train``: one command over everything the toolkit does.

    hpc-train submit --preset tiny --nodes 2 --gpus-per-node 0 --data DIR --save-dir DIR --follow
    hpc-train status
    hpc-train logs JOBID --follow
    hpc-train plan --instance-type p4d.24xlarge --nodes 1,8,64 --mtbf-hours 2000
    hpc-train chaos JOBID notice
    hpc-train check allreduce --backend gloo --nodes 2 --instance-type cpu
    hpc-train data demo --out .local/data/demo-bin
    hpc-train cluster render pcluster_configs/p3dn.yaml --values my.yaml -o cluster.yaml
    hpc-train metrics serve --port 9478
    hpc-train doctor --act --notify https://hooks.example.com/hpc-train

Each verb is a thin command line over a library module, and ``python -m <module>`` runs the same
thing. ``hpc-train VERB --help`` shows that verb's options, defaults and examples.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# verb: (module whose main(argv) runs it, one line of what it does)
VERBS: dict[str, tuple[str, str]] = {
    "submit": ("hpc_train.submit", "submit a training run to Slurm (submitit, torchrun, fairseq)"),
    "logs": ("hpc_train.runs.logs", "a run's logs across requeues; --follow re-attaches"),
    "status": ("hpc_train.runs.status", "where your runs stand: update, restarts, ETTR, ETA"),
    "plan": (
        "hpc_train.planning.plan",
        "save interval (Young/Daly), ETTR, wall time, cost per node count",
    ),
    "plot": ("hpc_train.runs.plot", "plot a run's loss with each restart and its cause marked"),
    "chaos": ("hpc_train.chaos", "preempt, requeue, kill a node or hang a rank of a running job"),
    "check": ("nccl_checks.__main__", "all-reduce bandwidth and GPU health checks (nccl_checks)"),
    "data": ("hpc_train.data.command", "prepare a binarized masked-LM corpus (GPT-2 BPE)"),
    "cluster": ("hpc_train.cluster.__main__", "render and validate ParallelCluster configs"),
    "env": ("hpc_train.environment", "print the EFA/NCCL environment for an instance type"),
    "metrics": (
        "hpc_train.runs.metrics",
        "your runs as Prometheus metrics: serve, or write a textfile",
    ),
    "audit": (
        "hpc_train.runs.audit",
        "per epoch, samples trained 0 or 2+ times (runs with --audit-samples)",
    ),
    "doctor": (
        "hpc_train.runs.doctor",
        "find stalled, stuck, storming or stuck-pending runs; --act fixes",
    ),
}


def usage() -> str:
    lines = [
        "usage: hpc-train VERB [ARGS ...]",
        "",
        (__doc__ or "").split("\n\n")[0],
        "",
        "verbs:",
        *(f"  {verb:8s} {what}" for verb, (_, what) in VERBS.items()),
        "",
        "examples:",
        *(line for line in (__doc__ or "").splitlines() if line.startswith("    hpc-train")),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(usage())
        return 0
    verb, rest = args[0], args[1:]
    if verb not in VERBS:
        print(
            f"hpc-train: error: unknown verb {verb!r} (one of: {', '.join(VERBS)})", file=sys.stderr
        )
        return 2
    module = importlib.import_module(VERBS[verb][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
