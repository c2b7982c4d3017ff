"""slurm/healthcheck.sh: the prolog / HealthCheckProgram wrapper, run for real."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpc_core import slurm

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "slurm" / "healthcheck.sh"
FIXTURES = Path(__file__).parent / "fixtures"
STAMP = re.compile(r"^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\] healthcheck n4: ")


def run_script(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"NCCL_CHECKS_NODE": "n4"} | env,
    )


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean() -> None:
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.slurm
@pytest.mark.nogpu
def test_no_gpu_is_a_skip_not_a_drain(drainable_node: str, tmp_path: Path) -> None:
    log = tmp_path / "hc.log"
    proc = run_script(NCCL_CHECKS_LOG=str(log))
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    assert all(STAMP.match(line) for line in lines), lines
    assert (
        "skip: no GPU check on this node" in lines[-1] and "NVMLError_LibraryNotFound" in lines[-1]
    )
    assert "DRAIN" not in slurm.node_info(drainable_node)["State"]


@pytest.mark.slurm
def test_failing_node_is_drained_with_the_reason(drainable_node: str) -> None:
    proc = run_script(NCCL_CHECKS_STATE=str(FIXTURES / "gpu_state_p3dn_ecc.json"))
    assert proc.returncode == 1, proc.stderr
    assert "FAILED, node drained: UNHEALTHY: GPU 3: 2 uncorrectable ECC" in proc.stderr
    info = slurm.node_info(drainable_node)
    assert "DRAIN" in info["State"]
    assert info["Reason"].startswith("nccl_checks gpu: GPU 3: 2 uncorrectable ECC errors")


@pytest.mark.slurm
def test_healthy_recorded_state_passes(drainable_node: str) -> None:
    proc = run_script(NCCL_CHECKS_STATE=str(FIXTURES / "gpu_state_p3dn_healthy.json"))
    assert proc.returncode == 0 and "ok: HEALTHY: 8 GPUs healthy" in proc.stderr
    assert "DRAIN" not in slurm.node_info(drainable_node)["State"]


def test_a_check_that_cannot_run_does_not_fail_the_node_unless_strict() -> None:
    broken = {"NCCL_CHECKS_PYTHON": "/bin/false"}
    relaxed = run_script(**broken)
    assert relaxed.returncode == 0 and "ERROR: the check could not run (exit 1)" in relaxed.stderr
    assert run_script(**broken, NCCL_CHECKS_STRICT="1").returncode == 1
