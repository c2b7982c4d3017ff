"""Pre-flight all-reduce check for a training job, run inside its allocation before training.

Two ways to use it from the training submit path:

* as shell in the batch script (e.g. submitit's ``slurm_setup``), before the training step::

      setup = preflight.setup_lines(nodes=2, backend="gloo", out_dir=save_dir / "preflight")

  The line runs ``python -m nccl_checks allreduce`` inside the allocation (one ``srun --overlap``
  step over the job's first N nodes) and ends the batch script with exit 1 if the verdict is
  unhealthy (2/3 when it could not check), before any training step starts;
* from Python code already running inside the allocation: ``preflight.run(...)`` returns the
  outcome (``.exit_code`` 0 healthy, ``.reason`` one line, ``.nodelist``).

And one node's GPUs before training: ``preflight.node(instance_type)``, ``nccl_checks gpu``'s NVML
checks judged for the instance type, which the launcher runs on each node at every start where
``submit --node-check`` says so (the default on p3dn, whose clusters run no DCGM check in the
prolog: docs/on-aws.md); its failure is evidence about the node (``hpc_train.faults``).

No torch import here; the ranks import it in their own processes.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nccl_checks import allreduce, gpu, nvml_reader


def command(
    nodes: int,
    backend: str = "gloo",
    out_dir: str | Path = "preflight",
    instance_type: str | None = None,
    python: str = sys.executable,
    drain: bool = False,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """argv of the check for the batch script; validated now (ValueError), run later in the job.

    ``backend``: "gloo" on CPU nodes, "nccl" on GPU nodes without nccl-tests, "nccl-tests" with a
    built all_reduce_perf (give ``extra=("--binary=/path/all_reduce_perf",)``).
    """
    plan = allreduce.make_plan(backend, nodes, Path(out_dir), instance_type, drain=drain)
    return [python, "-m", "nccl_checks", "allreduce", *allreduce.plan_args(plan), *extra]


def setup_lines(
    nodes: int,
    backend: str = "gloo",
    out_dir: str | Path = "preflight",
    instance_type: str | None = None,
    drain: bool = False,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """Shell lines for the batch script: run the check, stop the job if it is not healthy."""
    cmd = shlex.join(command(nodes, backend, out_dir, instance_type, drain=drain, extra=extra))
    where = shlex.quote(str(Path(out_dir).absolute()))
    return [
        f'echo "[$(date -u +%FT%TZ)] preflight: all-reduce check ({backend}, {nodes} nodes)"',
        f'{cmd} || {{ rc=$?; echo "preflight failed (exit $rc): see "{where} >&2; exit "$rc"; }}',
    ]


def run(
    nodes: int,
    backend: str = "gloo",
    out_dir: str | Path = "preflight",
    instance_type: str | None = None,
    timeout_s: float = 600.0,
    **options: Any,
) -> allreduce.Outcome:
    """Inside an allocation (SLURM_JOB_ID set): run the check now and return its outcome.

    ``options`` go to ``allreduce.make_plan`` (e.g. ``max_bytes=1 << 20``, ``min_busbw=...``).
    """
    plan = allreduce.make_plan(backend, nodes, Path(out_dir), instance_type, **options)
    return allreduce.run_in_allocation(plan, timeout_s=timeout_s)


@dataclass(frozen=True)
class NodeCheck:
    """One node's GPU check: ``failed`` is why the node is unhealthy, one line ('' when it is
    healthy or could not be checked); ``said`` is what the caller logs either way."""

    failed: str
    said: str


def node(instance_type: str, state: gpu.NodeState | None = None) -> NodeCheck:
    """This node's GPUs through NVML (``nccl_checks gpu``'s checks: count, ECC, retired pages
    or row remaps, temperature, throttling, NVLink, XIDs), judged for ``instance_type``;
    ``state``: a recorded one (``gpu --json``) instead of NVML's. No driver is no failure here:
    the start sees no GPU and refuses the node for that."""
    try:
        found = state if state is not None else nvml_reader.read_node_state()
    except gpu.NvmlUnavailable as err:
        return NodeCheck("", f"GPU check: not checked ({err})")
    report = gpu.check_node(found, instance_type)
    if report.healthy:
        return NodeCheck("", f"GPU check passed: {report.reason}")
    return NodeCheck(f"GPU check failed: {report.reason}", f"GPU check failed: {report.reason}")
