"""python -m nccl_checks: the parse subcommand's exit codes and output, and --help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def nccl_checks(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nccl_checks", *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
    )


@pytest.mark.parametrize(
    ("fixture", "itype", "nodes", "code", "reason"),
    [
        ("current_root_p3dn_2nodes.txt", "p3dn.24xlarge", "2", 0, "busbw 9.60 GB/s at"),
        ("older_noroot_error_p3dn_2nodes_slow.txt", "p3dn.24xlarge", "2", 1, "busbw 3.10 GB/s"),
        ("srun_label_wrong_p3dn_2nodes.txt", "p3dn.24xlarge", "2", 1, "3 out-of-bounds"),
        ("mpirun_prefix_p3dn_2nodes.txt", "p3dn.24xlarge", "2", 0, "busbw 9.89 GB/s"),
        ("na_values_p3dn_4nodes.txt", "p3dn.24xlarge", "4", 0, "busbw 7.00 GB/s"),
        ("nccl_tests_p4de_2nodes.json", "p4de.24xlarge", "2", 0, "busbw 76.94 GB/s at 2 GiB"),
        ("table_only_16ranks.txt", "p3dn.24xlarge", "4", 1, "size/time for 32 ranks"),
    ],
)
def test_parse_verdicts(fixture: str, itype: str, nodes: str, code: int, reason: str) -> None:
    proc = nccl_checks("parse", str(FIXTURES / fixture), "--instance-type", itype, "--nodes", nodes)
    assert proc.returncode == code, proc.stdout + proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("HEALTHY: " if code == 0 else "UNHEALTHY: ") and reason in last


def test_parse_without_a_threshold_for_the_shape_exits_3_not_judged() -> None:
    table = str(FIXTURES / "table_only_16ranks.txt")
    shape = ("--instance-type", "p4d.24xlarge", "--nodes", "1", "--gpus-per-node", "16")
    proc = nccl_checks("parse", table, *shape)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("NOT CHECKED: bandwidth not judged: no threshold for p4d.24xlarge x 1")
    assert nccl_checks("parse", table, *shape, "--min-busbw", "1").returncode == 0


def test_parse_json_output() -> None:
    proc = nccl_checks(
        "parse",
        str(FIXTURES / "older_noroot_error_p3dn_2nodes_slow.txt"),
        "--instance-type",
        "p3dn.24xlarge",
        "--nodes",
        "2",
        "--json",
    )
    data = json.loads(proc.stdout)
    assert proc.returncode == 1 and data["exit_code"] == 1 and data["healthy"] is False
    assert data["threshold"]["floor_gbps"] == 8.0 and data["large_busbw"] == pytest.approx(3.1)
    assert {c["name"] for c in data["checks"]} >= {"bandwidth", "correctness", "busbw-recompute"}


def test_parse_from_stdin() -> None:
    text = (FIXTURES / "mpirun_prefix_p3dn_2nodes.txt").read_text()
    proc = nccl_checks("parse", "-", "--instance-type", "p3dn.24xlarge", "--nodes", "2", stdin=text)
    assert proc.returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([str(FIXTURES / "truncated_p3dn_2nodes.txt")], "truncated: no '# Out of bounds values'"),
        (["/nonexistent/out.txt"], "cannot read /nonexistent/out.txt"),
        ([str(FIXTURES / "gpu_state_p3dn_healthy.json")], "no 'results' list"),
    ],
)
def test_unreadable_input_exits_2(args: list[str], message: str) -> None:
    proc = nccl_checks("parse", *args, "--instance-type", "p3dn.24xlarge", "--nodes", "2")
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""


def test_unknown_instance_type_exits_2() -> None:
    fixture = str(FIXTURES / "current_root_p3dn_2nodes.txt")
    proc = nccl_checks("parse", fixture, "--instance-type", "p9.huge", "--nodes", "2")
    assert proc.returncode == 2 and "unknown instance type 'p9.huge'" in proc.stderr


def test_help_explains_exit_codes_and_subcommands() -> None:
    top = nccl_checks("--help")
    assert top.returncode == 0 and "3 could not check" in top.stdout
    for sub in ("allreduce", "parse", "gpu"):
        assert sub in top.stdout
    assert "--dry-run" in nccl_checks("allreduce", "--help").stdout
    assert "Exit 3 when there is no NVIDIA driver" in nccl_checks("gpu", "--help").stdout


def test_a_crash_is_exit_4_not_a_verdict(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A bug inside a check must not read as 'unhealthy' (exit 1) to scripts."""
    from nccl_checks import __main__ as cli

    def boom(text: str) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(cli, "parse", boom)
    fixture = str(FIXTURES / "current_root_p3dn_2nodes.txt")
    assert cli.main(["parse", fixture, "--instance-type", "p3dn.24xlarge", "--nodes", "2"]) == 4
    assert "nccl_checks crashed: RuntimeError('bug')" in capsys.readouterr().err
