"""bootstrap/head-node-services.sh: the doctor's timer and the metrics service installed on a
head node (units into a temp dir, systemctl a stub that records), idempotent, every log line
timestamped; the units it renders pass `systemd-analyze verify`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "bootstrap" / "head-node-services.sh"
UNITS = ("hpc-train-metrics.service", "hpc-train-doctor.service", "hpc-train-doctor.timer")
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \[[^]]+\] head-node-services: ")


def install(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    stub = tmp_path / "systemctl"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/systemctl.calls\n')
    stub.chmod(0o755)
    env = {
        **os.environ,
        "BOOTSTRAP_PREFIX": str(tmp_path / "prefix"),
        "BOOTSTRAP_LOG_FILE": str(tmp_path / "bootstrap.log"),
        "BOOTSTRAP_NODE_TYPE": "HeadNode",
        "HPC_TRAIN_VENV": str(Path(sys.executable).parent.parent),
        "HPC_TRAIN_SYSTEMD_DIR": str(tmp_path / "units"),
        "HPC_TRAIN_ENV_FILE": str(tmp_path / "etc" / "head-node.env"),
        "HPC_TRAIN_SYSTEMCTL": str(stub),
        **settings,
    }
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env,
                          timeout=60)  # fmt: skip


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "systemctl.calls"
    return path.read_text().splitlines() if path.exists() else []


def test_units_installed_enabled_and_a_second_run_changes_nothing(tmp_path):
    first = install(tmp_path, HPC_TRAIN_DOCTOR_NOTIFY="https://hooks.example.com/x")
    assert first.returncode == 0, first.stderr
    units = tmp_path / "units"
    assert sorted(p.name for p in units.iterdir()) == sorted(UNITS)
    doctor = (units / "hpc-train-doctor.service").read_text()
    venv = Path(sys.executable).parent.parent
    assert f"ExecStart={venv}/bin/hpc-train doctor --all-users $HPC_TRAIN_DOCTOR_ARGS" in doctor
    env = (tmp_path / "etc" / "head-node.env").read_text()
    assert "HPC_TRAIN_DOCTOR_ARGS=--notify https://hooks.example.com/x" in env
    assert oct((tmp_path / "etc" / "head-node.env").stat().st_mode & 0o777) == "0o600"
    assert "OnUnitActiveSec=5min" in (units / "hpc-train-doctor.timer").read_text()
    assert calls(tmp_path) == [
        "daemon-reload",
        "enable --now hpc-train-metrics.service hpc-train-doctor.timer",
    ]
    again = install(tmp_path, HPC_TRAIN_DOCTOR_NOTIFY="https://hooks.example.com/x")
    assert again.returncode == 0, again.stderr
    assert len(calls(tmp_path)) == 2  # nothing reloaded or restarted
    assert "already done: head-node services" in again.stderr
    log = (tmp_path / "bootstrap.log").read_text().splitlines()
    assert log and all(STAMP.match(line) for line in log), log
    # a new period changes the timer only: reload and enable again, no metrics restart
    third = install(tmp_path, HPC_TRAIN_DOCTOR_EVERY="10min",
                    HPC_TRAIN_DOCTOR_NOTIFY="https://hooks.example.com/x")  # fmt: skip
    assert third.returncode == 0, third.stderr
    assert calls(tmp_path)[2:] == [
        "daemon-reload",
        "enable --now hpc-train-metrics.service hpc-train-doctor.timer",
    ]
    # a new port changes the env file: the running metrics service restarts, once
    fourth = install(tmp_path, HPC_TRAIN_DOCTOR_EVERY="10min", HPC_TRAIN_METRICS_PORT="9500",
                     HPC_TRAIN_DOCTOR_NOTIFY="https://hooks.example.com/x")  # fmt: skip
    assert fourth.returncode == 0, fourth.stderr
    assert calls(tmp_path)[4:] == [
        "daemon-reload",
        "enable --now hpc-train-metrics.service hpc-train-doctor.timer",
        "restart hpc-train-metrics.service",
    ]


def test_the_rendered_units_pass_systemd_analyze_verify(tmp_path):
    assert install(tmp_path).returncode == 0
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze not found (the systemd package)"
    units = [str(tmp_path / "units" / u) for u in UNITS]
    proc = subprocess.run([analyze, "verify", *units], capture_output=True, text=True, timeout=60)
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "hpc-train" in ln]
    assert proc.returncode == 0 and not said, proc.stdout + proc.stderr


def test_bad_settings_and_other_nodes(tmp_path):
    bad = install(tmp_path, HPC_TRAIN_METRICS_PORT="99999")
    assert bad.returncode == 1 and "is not a TCP port" in bad.stderr
    assert not (tmp_path / "units").exists()
    compute = install(tmp_path, BOOTSTRAP_NODE_TYPE="ComputeFleet")
    assert compute.returncode == 0 and "skipped: not the head node" in compute.stderr
    assert not (tmp_path / "units").exists()


def test_the_local_install_brings_systemd_analyze(tmp_path):
    """slurm/local/install-packages.sh installs Debian's systemd when systemd-analyze (needed by
    the verify test above) is missing, and changes nothing once it is there."""
    script = REPO / "slurm" / "local" / "install-packages.sh"
    listed = re.search(r"for cmd in (.*?); do", script.read_text(), re.S)
    assert listed, "the script's command:package list"
    pairs = re.findall(r"([\w.-]+):([\w.-]+)", listed.group(1))
    assert ("systemd-analyze", "systemd") in pairs
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "date").symlink_to(shutil.which("date") or "/usr/bin/date")
    (bin_dir / "id").write_text("#!/bin/sh\necho 1000\n")  # not root: it only says what is missing
    (bin_dir / "id").chmod(0o755)
    for cmd, _ in pairs:
        if cmd != "systemd-analyze":
            (bin_dir / cmd).write_text("#!/bin/sh\n")
            (bin_dir / cmd).chmod(0o755)

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([shutil.which("bash") or "/bin/bash", str(script)],
                              capture_output=True, text=True, timeout=30,
                              env={"PATH": str(bin_dir)})  # fmt: skip

    missing = run()
    assert missing.returncode == 1 and "missing packages: systemd;" in missing.stderr, missing
    (bin_dir / "systemd-analyze").write_text("#!/bin/sh\n")
    (bin_dir / "systemd-analyze").chmod(0o755)
    there = run()
    assert there.returncode == 0 and "already installed" in there.stderr, there
