"""nccl_checks.allreduce: plans, the sbatch/srun commands, and real runs on the local Slurm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_core import slurm
from nccl_checks import __main__ as cli
from nccl_checks import allreduce
from nccl_checks.parse import parse
from nccl_checks.verdict import judge, threshold_for

FIXTURES = Path(__file__).parent / "fixtures"


def plan(backend: str = "gloo", **kw: object) -> allreduce.CheckPlan:
    return allreduce.make_plan(backend, kw.pop("nodes", 2), Path("/tmp/x"), **kw)  # type: ignore[arg-type]


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB")}
    return subprocess.run(
        [sys.executable, "-m", "nccl_checks", "allreduce", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_defaults_per_backend() -> None:
    gloo = plan("gloo")
    assert (gloo.instance_type, gloo.ranks_per_node, gloo.max_bytes) == ("cpu", 1, 16 << 20)
    gpu = plan("nccl-tests", binary="/opt/all_reduce_perf")
    assert (gpu.instance_type, gpu.ranks_per_node, gpu.max_bytes) == ("p3dn.24xlarge", 8, 2 << 30)
    assert (gpu.warmup, gpu.iters) == (5, 20) and (gloo.warmup, gloo.iters) == (2, 10)


@pytest.mark.parametrize(
    ("backend", "itype", "message"),
    [
        ("gloo", "p3dn.24xlarge", "runs on CPUs"),
        ("nccl", "cpu", "need a GPU type"),
        ("mpi", None, "unknown backend"),
        ("nccl", "m5.large", "unknown instance type"),
    ],
)
def test_make_plan_rejects(backend: str, itype: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan(backend, instance_type=itype)


def test_plan_args_round_trip_through_the_cli() -> None:
    original = plan(
        "nccl-tests",
        nodes=4,
        binary=sys.executable,
        partition="gpu",
        nodelist="a,b,c,d",
        min_busbw=7.5,
        drain=True,
        time_limit=7,
    )
    args = cli.build_parser().parse_args(["allreduce", *allreduce.plan_args(original)])
    assert cli._plan(args) == original


def test_sbatch_script_for_gloo_and_gpu() -> None:
    text = allreduce.sbatch_script(plan("gloo", drain=True))
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in text
    assert "#SBATCH --output=/tmp/x/slurm-%j.out" in text and "--no-requeue" in text
    assert "#SBATCH --gpus-per-node" not in text and "--exclusive" not in text
    assert text.rstrip().splitlines()[-1].split()[1:4] == ["-m", "nccl_checks", "allreduce"]
    assert "--drain" not in text  # the submitting process drains, after the job
    gpu = allreduce.sbatch_script(plan("nccl", nodes=2))
    assert "#SBATCH --gpus-per-node=8" in gpu and "#SBATCH --exclusive" in gpu
    assert "#SBATCH --ntasks-per-node=8" in gpu


def test_srun_commands() -> None:
    nodes = ["n1", "n2"]
    gloo = allreduce.srun_command(plan("gloo"), nodes)
    assert gloo[:2] == ["srun", "--overlap"] and "--nodelist=n1,n2" in gloo
    assert gloo[gloo.index("-m") + 1] == "nccl_checks.sweep" and "--backend=gloo" in gloo
    perf = allreduce.srun_command(plan("nccl-tests", binary="/b/all_reduce_perf"), nodes)
    assert "--mpi=pmix" in perf and "--ntasks-per-node=8" in perf
    tail = perf[perf.index("/b/all_reduce_perf") :]
    assert tail[1:9] == ["-b", "8", "-e", str(2 << 30), "-f", "2", "-g", "1"]


def test_rank_environment() -> None:
    gloo = allreduce.rank_settings(plan("gloo"), "n1", "1234")
    assert gloo["OMP_NUM_THREADS"].value == "1" and gloo["MASTER_ADDR"].value == "n1"
    other = allreduce.rank_settings(plan("gloo"), "n1", "1235")
    assert gloo["MASTER_PORT"].value != other["MASTER_PORT"].value  # per job
    p3dn = allreduce.rank_settings(plan("nccl-tests", binary="x"), "n1", "1")
    assert p3dn["FI_PROVIDER"].value == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in p3dn
    assert "MASTER_PORT" not in p3dn  # all_reduce_perf finds its peers through PMIx
    p4d = allreduce.rank_settings(plan("nccl", instance_type="p4d.24xlarge"), "n1", "1")
    assert p4d["FI_EFA_USE_DEVICE_RDMA"].value == "1" and "MASTER_PORT" in p4d


def test_truncated_run_output_is_unhealthy() -> None:
    text = (FIXTURES / "truncated_p3dn_2nodes.txt").read_text()
    code, reason, verdict = allreduce.judge_output(plan("nccl-tests", binary="x"), text)
    assert code == 1 and verdict is None
    assert reason.startswith("the run left no complete table: truncated")


def test_dry_run_submits_nothing(tmp_path: Path) -> None:
    out = tmp_path / "dry"
    proc = run_cli("--backend", "gloo", "--nodes", "3", "--out", str(out), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=3" in proc.stdout and "srun --overlap --nodes=3" in proc.stdout
    assert "export OMP_NUM_THREADS=1" in proc.stdout
    assert not out.exists()
    gpu = run_cli("--binary", "/nowhere/all_reduce_perf", "--out", str(out), "--dry-run")
    assert gpu.returncode == 0 and "export FI_PROVIDER=efa" in gpu.stdout
    assert "--mpi=pmix" in gpu.stdout and "/nowhere/all_reduce_perf -b 8" in gpu.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--binary", "/nowhere/all_reduce_perf"], "not an executable file"),
        (["--backend", "gloo", "--max-bytes", "lots"], "not a size"),
        (["--backend", "gloo", "--instance-type", "p3dn.24xlarge"], "runs on CPUs"),
        (["--backend", "gloo", "--nodes", "0"], ">= 1"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_missing_all_reduce_perf_says_what_to_do() -> None:
    env_path = os.environ.get("PATH", "")
    assert "all_reduce_perf" not in env_path
    proc = run_cli("--nodes", "2")
    assert proc.returncode == 2 and "--backend nccl" in proc.stderr


@pytest.mark.slurm
def test_gloo_sweep_across_two_emulated_nodes(slurm_cluster: Path, tmp_path: Path) -> None:
    out = tmp_path / "gloo"
    start = time.monotonic()
    proc = run_cli("--backend", "gloo", "--nodes", "2", "--out", str(out))
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("HEALTHY: busbw")

    raw = (out / allreduce.RAW).read_text()
    table = parse(raw)  # the sweep's output goes through the nccl-tests parser
    assert table.nranks == 2 and len(set(table.hosts)) == 2
    assert set(table.hosts) <= {"n1", "n2", "n3", "n4"}
    assert [r.size for r in table.rows] == [8 << i for i in range(22)]  # 8 B .. 16 MiB
    assert all(r.in_place.wrong == 0 and r.in_place.time_us for r in table.rows)
    verdict = judge(table, "cpu", 2)
    result = json.loads((out / allreduce.RESULT).read_text())
    assert result["healthy"] is True and result["exit_code"] == 0
    assert result["reason"] == verdict.reason
    assert result["rank_env"]["OMP_NUM_THREADS"] == "1"
    assert sorted(result["nodelist"]) == sorted(set(table.hosts))
    floor = threshold_for("cpu", 2)
    assert floor is not None and verdict.large_busbw is not None
    assert verdict.large_busbw > floor.floor_gbps
    print(
        f"\ngloo 2 nodes: peak busbw {verdict.large_busbw:.2f} GB/s at {verdict.large_size} B; "
        f"sweep step {result['wall_seconds']} s; submit-to-verdict {wall:.1f} s"
    )


@pytest.mark.slurm
def test_unhealthy_run_drains_its_node(drainable_node: str, tmp_path: Path) -> None:
    out = tmp_path / "drain"
    proc = run_cli(
        "--backend",
        "gloo",
        "--nodelist",
        drainable_node,
        "--max-bytes",
        "64K",
        "--min-busbw",
        "1000",
        "--drain",
        "--out",
        str(out),
        "--json",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    outcome = json.loads(proc.stdout)
    assert outcome["drained"] == [drainable_node] and "< 1000 GB/s floor" in outcome["reason"]
    info = slurm.node_info(drainable_node)
    assert "DRAIN" in info["State"]
    assert info["Reason"].startswith("nccl_checks allreduce: busbw")


@pytest.mark.slurm
def test_job_that_never_produced_a_result(slurm_cluster: Path, tmp_path: Path) -> None:
    """A job that dies before the check ran: exit 3 with the job's log, not a verdict."""
    bad = allreduce.make_plan("gloo", 1, tmp_path / "x", python="/nonexistent/python")
    outcome = allreduce.submit(bad, wait_timeout_s=120)
    assert outcome.exit_code == 3
    assert "without a result" in outcome.reason and "/nonexistent/python" in outcome.reason


def test_no_slurm_is_exit_3(tmp_path: Path) -> None:
    env = os.environ | {"SLURM_CONF": str(tmp_path / "missing.conf")}
    proc = subprocess.run(
        [sys.executable, "-m", "nccl_checks", "allreduce", "--backend", "gloo"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: no ") and "Traceback" not in proc.stderr


def test_rank_environment_follows_the_nodes_recorded_versions(tmp_path, monkeypatch) -> None:
    """Inside the allocation the check reads the node's versions file (issue 17)."""
    from hpc_core import instances

    versions = tmp_path / "efa-versions"
    monkeypatch.setenv(instances.NODE_VERSIONS_ENV, str(versions))
    p4d = plan("nccl", instance_type="p4d.24xlarge")
    unknown = allreduce.rank_settings(p4d, "n1", "1")
    assert unknown["FI_PROVIDER"].value == "efa" and "unknown" in unknown["FI_PROVIDER"].why
    assert unknown["FI_EFA_USE_DEVICE_RDMA"].value == "1"
    versions.write_text("libfabric=1.22.0amzn4.0\naws-ofi-nccl=1.13.2-aws\n")
    recorded = allreduce.rank_settings(p4d, "n1", "1")
    assert "FI_PROVIDER" not in recorded and "FI_EFA_USE_DEVICE_RDMA" not in recorded
