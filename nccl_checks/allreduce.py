"""Run the all-reduce check through Slurm and judge it: nccl-tests, or the torch.distributed sweep.

Outside an allocation, ``submit`` writes an sbatch script whose only step is this same check run
inside the allocation, submits it, waits, and reads the result the job wrote. Inside an allocation
(SLURM_JOB_ID set), ``run_in_allocation`` starts one ``srun`` step over the first N nodes, saves
the raw output, parses it and writes ``result.json`` next to it. No torch import here.

Files in the output directory: ``job.sbatch``, ``slurm-<job>.out`` (the batch script's log),
``allreduce.out`` (raw table), ``allreduce.err`` (the ranks' stderr), ``result.json``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpc_core import slurm
from hpc_core.instances import Setting, cpu_env, efa_nccl_env, node_versions, plain, shell_lines
from hpc_core.rundir import atomic_write, atomic_writer
from hpc_core.slurm import rendezvous_port
from hpc_core.slurm_env import JOB_ID, JOB_NODELIST, SlurmEnv
from hpc_core.wait import Backoff
from nccl_checks import EXIT_CANNOT_RUN, EXIT_HEALTHY, EXIT_UNHEALTHY
from nccl_checks.parse import ParseError, parse
from nccl_checks.verdict import CPU, AllReduceVerdict, judge, ranks_per_node

BACKENDS = ("nccl-tests", "nccl", "gloo")
GPU_DEFAULT = "p3dn.24xlarge"
REPO = Path(__file__).resolve().parents[1]
RAW, ERR, RESULT, SCRIPT = "allreduce.out", "allreduce.err", "result.json", "job.sbatch"


@dataclass(frozen=True)
class CheckPlan:
    """Everything one all-reduce check needs; the CLI builds it, the job re-reads it as flags."""

    backend: str
    nodes: int
    ranks_per_node: int
    instance_type: str
    out_dir: Path
    min_bytes: int
    max_bytes: int
    factor: int = 2
    warmup: int = 5
    iters: int = 20
    binary: str | None = None
    partition: str | None = None
    nodelist: str | None = None  # run on exactly these nodes (e.g. a pair, to localise a bad one)
    time_limit: int = 10  # minutes
    mpi: str = "pmix"
    min_busbw: float | None = None
    drain: bool = False
    python: str = field(default_factory=lambda: sys.executable)

    @property
    def uses_gpus(self) -> bool:
        return self.backend != "gloo"


# Defaults per backend family: (max bytes, warmup, iters). gloo stays small and quick on CPUs.
DEFAULTS = {"gpu": (2 << 30, 5, 20), "gloo": (16 << 20, 2, 10)}


def make_plan(
    backend: str,
    nodes: int,
    out_dir: Path,
    instance_type: str | None = None,
    gpus_per_node: int | None = None,
    max_bytes: int | None = None,
    warmup: int | None = None,
    iters: int | None = None,
    **options: Any,
) -> CheckPlan:
    """A validated CheckPlan with the per-backend defaults; ValueError names what is wrong."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    gloo = backend == "gloo"
    itype = instance_type or (CPU if gloo else GPU_DEFAULT)
    if gloo != (itype == CPU):
        raise ValueError(
            "--backend gloo runs on CPUs (--instance-type cpu); nccl and nccl-tests need a GPU type"
        )
    per_node = gpus_per_node or ranks_per_node(itype)
    if nodes < 1 or per_node < 1:
        raise ValueError("nodes and GPUs per node must be >= 1")
    default_max, default_warmup, default_iters = DEFAULTS["gloo" if gloo else "gpu"]
    return CheckPlan(
        backend=backend,
        nodes=nodes,
        ranks_per_node=per_node,
        instance_type=itype,
        out_dir=Path(out_dir).absolute(),
        min_bytes=options.pop("min_bytes", 8),
        max_bytes=max_bytes or default_max,
        warmup=default_warmup if warmup is None else warmup,
        iters=default_iters if iters is None else iters,
        **options,
    )


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    reason: str
    verdict: AllReduceVerdict | None = None
    job_id: str | None = None
    nodelist: tuple[str, ...] = ()
    out_dir: Path | None = None
    wall_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["out_dir"] = str(self.out_dir) if self.out_dir else None
        out["healthy"] = self.exit_code == EXIT_HEALTHY
        return out


def plan_args(plan: CheckPlan) -> list[str]:
    """The plan as ``python -m nccl_checks allreduce`` flags (the batch job re-reads these)."""
    args = [
        f"--backend={plan.backend}",
        f"--nodes={plan.nodes}",
        f"--gpus-per-node={plan.ranks_per_node}",
        f"--instance-type={plan.instance_type}",
        f"--out={plan.out_dir}",
        f"--min-bytes={plan.min_bytes}",
        f"--max-bytes={plan.max_bytes}",
        f"--factor={plan.factor}",
        f"--warmup={plan.warmup}",
        f"--iters={plan.iters}",
        f"--time={plan.time_limit}",
        f"--mpi={plan.mpi}",
    ]
    args += [f"--binary={plan.binary}"] if plan.binary else []
    args += [f"--partition={plan.partition}"] if plan.partition else []
    args += [f"--nodelist={plan.nodelist}"] if plan.nodelist else []
    args += [f"--min-busbw={plan.min_busbw}"] if plan.min_busbw is not None else []
    return args + (["--drain"] if plan.drain else [])


def worker_command(plan: CheckPlan) -> list[str]:
    """What each rank runs: all_reduce_perf (one rank per GPU) or the torch sweep."""
    if plan.backend == "nccl-tests":
        return [
            plan.binary or "all_reduce_perf",
            *("-b", str(plan.min_bytes), "-e", str(plan.max_bytes), "-f", str(plan.factor)),
            *("-g", "1", "-c", "1", "-w", str(plan.warmup), "-n", str(plan.iters)),
        ]
    return [
        plan.python,
        "-m",
        "nccl_checks.sweep",
        f"--backend={plan.backend}",
        f"--min-bytes={plan.min_bytes}",
        f"--max-bytes={plan.max_bytes}",
        f"--factor={plan.factor}",
        f"--warmup={plan.warmup}",
        f"--iters={plan.iters}",
    ]


def srun_command(plan: CheckPlan, nodelist: list[str]) -> list[str]:
    """One step over ``nodelist``; --overlap so it also runs beside a job's existing tasks."""
    cmd = [
        "srun",
        "--overlap",
        f"--nodes={plan.nodes}",
        f"--ntasks-per-node={plan.ranks_per_node}",
        f"--nodelist={','.join(nodelist)}",
        "--kill-on-bad-exit=1",
        "--wait=60",
    ]
    if plan.uses_gpus:
        cmd.append(f"--gpus-per-node={plan.ranks_per_node}")
    if plan.backend == "nccl-tests":
        cmd.append(f"--mpi={plan.mpi}")  # all_reduce_perf built with MPI=1 finds its peers by PMI
    return cmd + worker_command(plan)


def rank_settings(plan: CheckPlan, master: str, job_id: str) -> dict[str, Setting]:
    """The variables the ranks get on top of the job's: EFA/NCCL (GPU) or CPU threads (gloo).

    EFA/NCCL as this node's recorded versions ask (hpc_core.instances.node_versions; this runs
    inside the allocation), the unknown-version set only where the node recorded none."""
    if plan.uses_gpus:
        env = efa_nccl_env(plan.instance_type, versions=node_versions())
    else:
        env = cpu_env(threads=1)
    if plan.backend == "nccl-tests":
        return env  # all_reduce_perf finds its peers through MPI/PMIx
    port = os.environ.get("NCCL_CHECKS_PORT") or str(rendezvous_port(job_id))
    return env | {
        "MASTER_ADDR": Setting(master, "the step's first node hosts the c10d store"),
        "MASTER_PORT": Setting(port, "from the job id: emulated nodes share one port space"),
    }


def sbatch_script(plan: CheckPlan) -> str:
    """A batch script whose one step is this check, run inside the allocation."""
    inner = replace(plan, drain=False)  # the submitting process drains, after the job ended
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=nccl-check-{plan.backend}",
        f"#SBATCH --nodes={plan.nodes}",
        f"#SBATCH --ntasks-per-node={plan.ranks_per_node}",
        f"#SBATCH --time={plan.time_limit}",
        f"#SBATCH --output={plan.out_dir}/slurm-%j.out",
        "#SBATCH --no-requeue",
    ]
    if plan.partition:
        lines.append(f"#SBATCH --partition={plan.partition}")
    if plan.nodelist:
        lines.append(f"#SBATCH --nodelist={plan.nodelist}")
    if plan.uses_gpus:
        lines += [f"#SBATCH --gpus-per-node={plan.ranks_per_node}", "#SBATCH --exclusive"]
    check = [plan.python, "-m", "nccl_checks", "allreduce", *plan_args(inner)]
    lines += [
        "set -euo pipefail",
        f'export PYTHONPATH={shlex.quote(str(REPO))}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        f'echo "[$(date -u +%FT%TZ)] nccl-check: job ${JOB_ID} on ${JOB_NODELIST}"',
        shlex.join(check),
    ]
    return "\n".join(lines) + "\n"


def dry_run_text(plan: CheckPlan) -> str:
    """What would run, without submitting or writing anything."""
    job_id = SlurmEnv().job_id
    inside = job_id is not None
    nodes = _allocation_nodes(plan) if inside else [f"<node{i + 1}>" for i in range(plan.nodes)]
    settings = rank_settings(plan, nodes[0], job_id or "0")
    if not inside and "MASTER_PORT" in settings:
        settings["MASTER_PORT"] = replace(settings["MASTER_PORT"], value="<from-the-job-id>")
    out = [] if inside else [f"# sbatch --parsable {plan.out_dir / SCRIPT}", sbatch_script(plan)]
    out.append("# the step the job runs, with these variables for the ranks:")
    out += shell_lines(settings)
    out.append(shlex.join(srun_command(plan, nodes)))
    return "\n".join(out)


def _allocation_nodes(plan: CheckPlan) -> list[str]:
    """The step's nodes: --nodelist if given (within the allocation), else the first N."""
    allocated = slurm.hostnames(_allocation_has(SlurmEnv().job_nodelist, JOB_NODELIST))
    wanted = slurm.hostnames(plan.nodelist) if plan.nodelist else allocated[: plan.nodes]
    if len(wanted) != plan.nodes or not set(wanted) <= set(allocated):
        raise slurm.SlurmError(
            f"the check needs {plan.nodes} node(s) ({plan.nodelist or 'any'}) of the "
            f"allocation's {', '.join(allocated)}"
        )
    return wanted


def _allocation_has(value: str | None, name: str) -> str:
    """A variable Slurm sets in every allocation (``value``: ``hpc_core.slurm_env``'s)."""
    if value is None:
        raise slurm.SlurmError(f"not inside a Slurm allocation: {name} is unset")
    return value


def judge_output(plan: CheckPlan, text: str) -> tuple[int, str, AllReduceVerdict | None]:
    try:
        table = parse(text)
    except ParseError as err:
        return EXIT_UNHEALTHY, f"the run left no complete table: {err}", None
    verdict = judge(table, plan.instance_type, plan.nodes, plan.ranks_per_node, plan.min_busbw)
    return (EXIT_HEALTHY if verdict.healthy else EXIT_UNHEALTHY), verdict.reason, verdict


def run_in_allocation(plan: CheckPlan, timeout_s: float | None = None) -> Outcome:
    """Inside an allocation: one srun step, raw output saved, parsed, judged, result.json."""
    job_id = _allocation_has(SlurmEnv().job_id, JOB_ID)
    nodes = _allocation_nodes(plan)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    settings = plain(rank_settings(plan, nodes[0], job_id))
    env = os.environ | settings
    cmd = srun_command(plan, nodes)
    raw, err = plan.out_dir / RAW, plan.out_dir / ERR
    start = time.monotonic()
    with atomic_writer(raw, "w") as out, open(err, "w") as errf:
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=errf, env=env, timeout=timeout_s)
            status = f"srun exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            status = f"srun killed after {timeout_s:.0f} s"
        except OSError as exc:
            raise slurm.SlurmError(f"cannot start srun: {exc}") from None
    wall = time.monotonic() - start
    code, reason, verdict = judge_output(plan, raw.read_text())
    if code != EXIT_HEALTHY and status != "srun exit 0":
        reason = f"{reason} ({status}; see {err})"
    outcome = Outcome(code, reason, verdict, job_id, tuple(nodes), plan.out_dir, round(wall, 2))
    record = outcome.to_dict() | {"command": cmd, "rank_env": settings}
    atomic_write(plan.out_dir / RESULT, json.dumps(record, indent=2) + "\n")
    return outcome


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text().strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def submit(
    plan: CheckPlan, wait_timeout_s: float = 1800.0, poll: Backoff = Backoff(0.5, 1.5, 5.0)
) -> Outcome:
    """Outside an allocation: sbatch the check, wait for the job, read the result it wrote."""
    slurm.ensure_reachable()
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    (plan.out_dir / RESULT).unlink(missing_ok=True)
    script = plan.out_dir / SCRIPT
    atomic_write(script, sbatch_script(plan))
    job_id = slurm.sbatch([str(script)])
    try:
        state = slurm.wait_for_job(job_id, timeout=wait_timeout_s, backoff=poll)
    except TimeoutError:
        slurm.cancel(job_id, check=False)
        return Outcome(
            EXIT_CANNOT_RUN,
            f"job {job_id} did not end in {wait_timeout_s:.0f} s; cancelled",
            job_id=job_id,
        )
    except BaseException:
        slurm.cancel(job_id, check=False)
        raise
    result = plan.out_dir / RESULT
    if not result.exists():
        log = plan.out_dir / f"slurm-{job_id}.out"
        return Outcome(
            EXIT_CANNOT_RUN,
            f"job {job_id} ended {state.state} without a result: {_log_tail(log)}",
            job_id=job_id,
            out_dir=plan.out_dir,
        )
    return load_outcome(result)


def load_outcome(path: Path) -> Outcome:
    """Re-read a result.json (the verdict stays a dict: it is only printed and drained on)."""
    data = json.loads(path.read_text())
    return Outcome(
        exit_code=int(data["exit_code"]),
        reason=str(data["reason"]),
        verdict=None,
        job_id=data.get("job_id"),
        nodelist=tuple(data.get("nodelist") or ()),
        out_dir=path.parent,
        wall_seconds=data.get("wall_seconds"),
    )


def drain_failed(outcome: Outcome) -> list[str]:
    """Drain the nodes of an unhealthy run (a pairwise run localises the bad node best)."""
    if outcome.exit_code != EXIT_UNHEALTHY:
        return []
    for node in outcome.nodelist:
        slurm.drain(node, f"nccl_checks allreduce: {outcome.reason}"[:200])
    return list(outcome.nodelist)
