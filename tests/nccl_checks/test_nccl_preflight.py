"""nccl_checks.preflight: the API the training submit path calls, run in a real batch job."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hpc_core import slurm
from nccl_checks import preflight


def test_command_is_validated_when_built(tmp_path: Path) -> None:
    cmd = preflight.command(2, "gloo", tmp_path / "pf")
    assert cmd[:4] == [sys.executable, "-m", "nccl_checks", "allreduce"]
    assert "--nodes=2" in cmd and f"--out={tmp_path / 'pf'}" in cmd and "--drain" not in cmd
    assert "--drain" in preflight.command(2, drain=True)
    with pytest.raises(ValueError, match="unknown backend"):
        preflight.command(2, "mpi")
    with pytest.raises(ValueError, match="runs on CPUs"):
        preflight.command(2, "gloo", instance_type="p3dn.24xlarge")


def test_setup_lines_stop_the_script_on_failure(tmp_path: Path) -> None:
    lines = preflight.setup_lines(2, out_dir=tmp_path)
    assert len(lines) == 2 and lines[1].endswith('exit "$rc"; }')


def wait_for(job_id: str, seconds: float = 240) -> slurm.JobState:
    return slurm.wait_for_job(job_id, timeout=seconds)


@pytest.mark.slurm
def test_preflight_inside_a_batch_job(slurm_cluster: Path, tmp_path: Path) -> None:
    """A training-like batch script: in-process preflight.run, then setup_lines that pass, then
    setup_lines that fail (floor set out of reach): the script must stop before 'TRAINING'."""
    small = ("--max-bytes=1M",)  # the CPU floor is judged from 1 MiB up
    run_py = (
        "from nccl_checks import preflight; "
        f"o = preflight.run(2, out_dir={str(tmp_path / 'inproc')!r}, max_bytes=1 << 20); "
        "print('INPROC', o.exit_code, sorted(o.nodelist), o.reason)"
    )
    script = tmp_path / "train.sbatch"
    script.write_text(
        "\n".join(
            [
                "#!/bin/bash",
                "#SBATCH --nodes=2",
                "#SBATCH --ntasks-per-node=1",
                f"#SBATCH --output={tmp_path}/job.out",
                "#SBATCH --time=5",
                f"{sys.executable} -c {json.dumps(run_py)}",
                *preflight.setup_lines(2, out_dir=tmp_path / "ok", extra=small),
                "echo PASSED-FIRST",
                *preflight.setup_lines(
                    2, out_dir=tmp_path / "bad", extra=(*small, "--min-busbw=1000")
                ),
                "echo TRAINING",
            ]
        )
        + "\n"
    )
    job_id = slurm.sbatch([str(script)])
    state = wait_for(job_id)
    log = (tmp_path / "job.out").read_text()
    assert state.state == "FAILED", log
    inproc = next(line for line in log.splitlines() if line.startswith("INPROC"))
    assert inproc.startswith("INPROC 0 ['n")
    assert "PASSED-FIRST" in log and "TRAINING" not in log
    assert "preflight failed (exit 1)" in log
    ok = json.loads((tmp_path / "ok" / "result.json").read_text())
    bad = json.loads((tmp_path / "bad" / "result.json").read_text())
    assert ok["healthy"] is True and ok["job_id"] == job_id
    assert bad["healthy"] is False and "< 1000 GB/s floor" in bad["reason"]


FIXTURES = Path(__file__).parent / "fixtures"


def test_node_check_judges_a_node_state_for_its_instance_type() -> None:
    """Recorded states (``gpu --json``; no V100 here): 8 healthy V100s pass as a p3dn; GPU 3's
    uncorrectable ECC errors fail it, the first failure in the one-line reason; the same healthy
    V100s judged as a p5 fail (6 NVLinks up where a p5 has 18)."""
    from nccl_checks import gpu

    healthy = gpu.load_state(FIXTURES / "gpu_state_p3dn_healthy.json")
    passed = preflight.node("p3dn.24xlarge", healthy)
    assert passed.failed == "" and passed.said == "GPU check passed: 8 GPUs healthy (p3dn.24xlarge)"
    ecc = preflight.node("p3dn.24xlarge", gpu.load_state(FIXTURES / "gpu_state_p3dn_ecc.json"))
    assert ecc.failed.startswith("GPU check failed: GPU 3: 2 uncorrectable ECC errors since boot")
    assert ecc.said == ecc.failed
    assert "NVLink" in preflight.node("p5.48xlarge", healthy).failed


@pytest.mark.nogpu
def test_node_check_without_a_driver_is_no_failure() -> None:
    check = preflight.node("p3dn.24xlarge")
    assert check.failed == "" and check.said.startswith("GPU check: not checked (")
