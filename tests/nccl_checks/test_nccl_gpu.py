"""nccl_checks.gpu: the pure checks against recorded device states (no NVML involved).

The two JSON fixtures are synthetic states in the exact format `gpu --json` records on a node
(no p3dn was available to record from); variations are made with dataclasses.replace.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nccl_checks.gpu import (
    GpuState,
    NodeState,
    XidEvent,
    check_node,
    load_state,
    parse_xids,
    render,
)

FIXTURES = Path(__file__).parent / "fixtures"
HEALTHY = FIXTURES / "gpu_state_p3dn_healthy.json"
P3DN = "p3dn.24xlarge"


@pytest.fixture
def healthy() -> NodeState:
    return load_state(HEALTHY)


def with_gpu(state: NodeState, index: int, **changes: object) -> NodeState:
    gpus = list(state.gpus)
    gpus[index] = dataclasses.replace(gpus[index], **changes)
    return dataclasses.replace(state, gpus=tuple(gpus))


def failed_checks(state: NodeState, itype: str = P3DN) -> list[tuple[str, int | None]]:
    return [(f.check, f.gpu) for f in check_node(state, itype).failures]


def test_recorded_healthy_state(healthy: NodeState) -> None:
    report = check_node(healthy, P3DN)
    assert report.healthy and report.findings == ()
    assert report.reason == "8 GPUs healthy (p3dn.24xlarge)"
    assert len(healthy.gpus) == 8 and healthy.gpus[0].name == "Tesla V100-SXM2-32GB"


def test_state_round_trips_through_json(healthy: NodeState) -> None:
    data = json.loads(json.dumps(check_node(healthy, P3DN).to_dict()))
    assert NodeState.from_dict(data["state"]) == healthy


def test_recorded_failing_state() -> None:
    report = check_node(load_state(FIXTURES / "gpu_state_p3dn_ecc.json"), P3DN)
    assert not report.healthy
    assert [(f.check, f.gpu) for f in report.failures] == [
        ("ecc", 3),
        ("retired-pages", 3),
        ("xid", None),
    ]
    assert report.reason == "GPU 3: 2 uncorrectable ECC errors since boot (+2 more)"


def test_gpu_count(healthy: NodeState) -> None:
    seven = dataclasses.replace(healthy, gpus=healthy.gpus[:7])
    report = check_node(seven, P3DN)
    assert report.reason == "7 GPUs visible, p3dn.24xlarge has 8"


@pytest.mark.parametrize(
    ("changes", "check", "severity"),
    [
        ({"ecc_uncorrected_volatile": 1}, "ecc", "fail"),
        ({"ecc_uncorrected_aggregate": 4}, "ecc", "warn"),
        ({"retired_pages_pending": True}, "retired-pages", "fail"),
        ({"remap_failed": True}, "row-remap", "fail"),
        ({"remap_pending": True}, "row-remap", "fail"),
        ({"temperature_c": 87}, "temperature", "fail"),
        ({"temperature_c": 84}, "temperature", "warn"),
        ({"throttle_reasons": 0x40 | 0x1}, "throttle", "fail"),
        ({"throttle_reasons": 0x80}, "throttle", "fail"),
        ({"throttle_reasons": 0x20}, "throttle", "warn"),
        ({"persistence_mode": False}, "persistence", "warn"),
        ({"nvlink_up": 5}, "nvlink", "fail"),
        ({"nvml_errors": ("GpuIsLost(nvmlDeviceGetTemperature)",)}, "nvml", "fail"),
        ({"nvml_errors": ("Unknown(nvmlDeviceGetPciInfo)",)}, "nvml", "warn"),
    ],
)
def test_each_gpu_check(healthy: NodeState, changes: dict, check: str, severity: str) -> None:
    report = check_node(with_gpu(healthy, 5, **changes), P3DN)
    assert [(f.check, f.severity, f.gpu) for f in report.findings] == [(check, severity, 5)]
    assert report.healthy == (severity == "warn")
    if severity == "warn":
        assert "1 warning(s)" in report.reason


@pytest.mark.parametrize(
    "changes",
    [
        {"throttle_reasons": 0x1 | 0x2 | 0x4 | 0x10},  # idle, app clocks, power cap, sync boost
        {"temperature_c": 81},  # more than 5 C below slowdown
        {"slowdown_temp_c": None, "temperature_c": 95},  # no threshold known: not judged
    ],
)
def test_normal_conditions_are_not_findings(healthy: NodeState, changes: dict) -> None:
    assert check_node(with_gpu(healthy, 0, **changes), P3DN).findings == ()


def test_nvlink_unknown_to_nvml_is_said_not_silently_skipped(healthy: NodeState) -> None:
    # seen on a real H100: all 36 link queries answered NotSupported
    unknown = dataclasses.replace(
        healthy, gpus=tuple(dataclasses.replace(g, nvlink_up=None) for g in healthy.gpus)
    )
    report = check_node(unknown, "p5.48xlarge")
    assert report.healthy
    assert [(f.check, f.severity, f.gpu) for f in report.findings] == [("nvlink", "warn", None)]
    assert "NVLink: not checked (NVML: not supported) on every GPU; 18 expected" in report.reason
    some = with_gpu(
        with_gpu(with_gpu(healthy, 0, nvlink_up=None), 1, nvlink_up=None), 5, nvlink_up=None
    )
    assert "on GPU 0-1, 5;" in check_node(some, P3DN).reason


def test_nvlink_expectation_follows_the_instance_type(healthy: NodeState) -> None:
    # p4d expects 12 links per GPU: a V100 state with 6 fails there on every GPU
    assert failed_checks(healthy, "p4d.24xlarge") == [("nvlink", i) for i in range(8)]


def test_row_remap_state_of_an_a100(healthy: NodeState) -> None:
    a100 = dataclasses.replace(
        healthy,
        gpus=tuple(
            dataclasses.replace(
                g,
                name="NVIDIA A100-SXM4-40GB",
                retired_pages_pending=None,
                remap_pending=False,
                remap_failed=False,
                nvlink_up=12,
            )
            for g in healthy.gpus
        ),
    )
    assert check_node(a100, "p4d.24xlarge").healthy
    assert failed_checks(with_gpu(a100, 2, remap_failed=True), "p4d.24xlarge") == [("row-remap", 2)]


KERNEL_LOG = """\
[ 12.000001] nvidia-nvlink: Nvlink Core is being initialized
[ 8123.456789] NVRM: Xid (PCI:0000:00:19): 79, pid=1234, name=python, GPU has fallen off the bus.
[ 8124.000000] NVRM: Xid (PCI:0000:00:19): 79, pid=1234, name=python, GPU has fallen off the bus.
[ 9000.1] NVRM: Xid (PCI:0000:00:1a): 13, pid=77, name=python, Graphics Exception: ESR 0x504648
[ 9001.2] NVRM: Xid (PCI:0000:00:1b): 999, pid=77, something new
"""


def test_xids_from_the_kernel_log(healthy: NodeState) -> None:
    events = parse_xids(KERNEL_LOG)
    assert [(e.xid, e.pci) for e in events] == [
        (79, "0000:00:19"),
        (79, "0000:00:19"),
        (13, "0000:00:1a"),
        (999, "0000:00:1b"),
    ]
    report = check_node(dataclasses.replace(healthy, xid_events=events), P3DN)
    by_severity = {(f.severity, f.detail.split(" (")[0]) for f in report.findings}
    assert by_severity == {("fail", "XID 79"), ("warn", "XID 13"), ("warn", "XID 999")}
    assert "fallen off the bus" in report.reason


def test_unreadable_kernel_log_is_a_warning(healthy: NodeState) -> None:
    state = dataclasses.replace(healthy, xid_events=None, xid_source="dmesg: not permitted")
    report = check_node(state, P3DN)
    assert report.healthy and "XIDs not checked: dmesg: not permitted" in report.reason


def test_render_has_a_row_per_gpu_and_the_findings() -> None:
    text = render(check_node(load_state(FIXTURES / "gpu_state_p3dn_ecc.json"), P3DN))
    lines = text.splitlines()
    assert len([ln for ln in lines if ln[:3].strip().isdigit()]) == 8
    assert any(ln.startswith("FAIL ecc") and "GPU 3" in ln for ln in lines)


def test_unknown_instance_type(healthy: NodeState) -> None:
    with pytest.raises(ValueError, match="unknown instance type"):
        check_node(healthy, "m5.large")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nccl_checks", "gpu", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_on_recorded_states() -> None:
    ok = run_cli("--state", str(HEALTHY), "--instance-type", P3DN)
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1].startswith("HEALTHY: 8 GPUs")
    bad = run_cli("--state", str(FIXTURES / "gpu_state_p3dn_ecc.json"), "--json")
    assert bad.returncode == 1
    out = json.loads(bad.stdout)
    assert out["healthy"] is False and out["drained"] is False
    assert out["reason"].startswith("GPU 3: 2 uncorrectable ECC")


def test_cli_bad_state_file(tmp_path: Path) -> None:
    broken = tmp_path / "state.json"
    broken.write_text("{")
    proc = run_cli("--state", str(broken))
    assert proc.returncode == 2 and proc.stderr.startswith("error: --state")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.nogpu
def test_cli_real_no_driver_path() -> None:
    """On this machine (no NVIDIA driver) the real NVML path says so and exits 3."""
    proc = run_cli("--instance-type", P3DN)
    assert proc.returncode == 3, proc.stderr
    assert "NVMLError_LibraryNotFound" in proc.stderr and "no NVIDIA driver" in proc.stderr
    assert "Traceback" not in proc.stderr
    as_json = run_cli("--json")
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["exit_code"] == 3


def test_xid_event_dataclass_is_hashable() -> None:
    # NodeState is frozen and compared in tests; events must compare by value
    assert XidEvent(79, "x", "l") == XidEvent(79, "x", "l")
    assert GpuState(0, "g") == GpuState(0, "g")
