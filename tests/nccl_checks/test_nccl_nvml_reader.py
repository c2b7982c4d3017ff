"""nccl_checks.nvml_reader: the real no-driver path here, and GPU cases through a FAKE NVML.

This machine has no NVIDIA GPU, so the GPU cases use ``FakeNvml``: an object with pynvml's
names (functions, constants, NVMLError subclasses) answering from a dict per device. It is used
for those GPU cases only; the no-driver case calls the real pynvml.
"""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from nccl_checks.gpu import NvmlUnavailable, check_node
from nccl_checks.nvml_reader import read_kernel_log, read_node_state


class FakeNvml:
    """GPU case only: pynvml's surface over ``devices`` (one dict of answers per GPU)."""

    NVMLError = pynvml.NVMLError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    )
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, devices: list[dict[str, Any]]) -> None:
        self.devices = devices
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "535.183.01"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.devices[i]

    @staticmethod
    def _answer(dev: dict[str, Any], key: str) -> Any:
        value = dev.get(key, pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlDeviceGetName(self, d: dict) -> str:
        return self._answer(d, "name")

    def nvmlDeviceGetPciInfo(self, d: dict) -> Any:
        return type("Pci", (), {"busId": self._answer(d, "bus")})()

    def nvmlDeviceGetTotalEccErrors(self, d: dict, kind: int, counter: int) -> int:
        return self._answer(d, "ecc_vol" if counter == self.NVML_VOLATILE_ECC else "ecc_agg")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, d: dict) -> int:
        return self._answer(d, "pending")

    def nvmlDeviceGetRetiredPages(self, d: dict, cause: int) -> list[int]:
        return self._answer(d, "dbe_pages")

    def nvmlDeviceGetRemappedRows(self, d: dict) -> tuple[int, int, int, int]:
        return self._answer(d, "remap")

    def nvmlDeviceGetTemperature(self, d: dict, sensor: int) -> int:
        return self._answer(d, "temp")

    def nvmlDeviceGetTemperatureThreshold(self, d: dict, kind: int) -> int:
        return self._answer(d, "slowdown")

    def nvmlDeviceGetCurrentClocksEventReasons(self, d: dict) -> int:
        return self._answer(d, "reasons")

    def nvmlDeviceGetPersistenceMode(self, d: dict) -> int:
        return self._answer(d, "persistence")

    def nvmlDeviceGetNvLinkState(self, d: dict, link: int) -> int:
        links = self._answer(d, "links")
        if link >= len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]


def v100(**over: Any) -> dict[str, Any]:
    dev = {
        "name": "Tesla V100-SXM2-32GB",
        "bus": "00000000:00:16.0",
        "ecc_vol": 0,
        "ecc_agg": 0,
        "pending": 0,
        "dbe_pages": [],
        "temp": 40,
        "slowdown": 87,
        "reasons": 0x1,
        "persistence": 1,
        "links": [1] * 6,
    }  # no "remap": a V100 answers NotSupported
    return dev | over


def no_kernel_log() -> tuple[None, str]:
    return None, "not read in this test"


def test_fake_nvml_gpu_case_healthy_v100_node() -> None:
    fake = FakeNvml([v100() for _ in range(8)])
    state = read_node_state(fake, kernel_log=no_kernel_log)
    assert fake.calls == ["init", "shutdown"]
    g = state.gpus[0]
    assert state.driver_version == "535.183.01" and len(state.gpus) == 8
    assert (g.name, g.pci_bus_id, g.temperature_c, g.slowdown_temp_c) == (
        "Tesla V100-SXM2-32GB",
        "00000000:00:16.0",
        40,
        87,
    )
    assert g.retired_pages_pending is False and g.retired_pages_dbe == 0
    assert g.remap_pending is None and g.remap_failed is None  # NotSupported on V100
    assert g.persistence_mode is True and g.nvlink_up == 6 and g.nvml_errors == ()
    assert check_node(state, "p3dn.24xlarge").healthy


def test_fake_nvml_gpu_case_faults_are_recorded() -> None:
    devices = [v100() for _ in range(8)]
    devices[2] = v100(ecc_vol=3, pending=pynvml.NVML_FEATURE_ENABLED, links=[1, 1, 1, 1, 0, 0])
    devices[6] = v100(temp=pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    state = read_node_state(FakeNvml(devices), kernel_log=no_kernel_log)
    assert state.gpus[2].ecc_uncorrected_volatile == 3
    assert state.gpus[2].retired_pages_pending is True and state.gpus[2].nvlink_up == 4
    assert state.gpus[6].temperature_c is None
    assert state.gpus[6].nvml_errors == ("GpuIsLost(nvmlDeviceGetTemperature)",)
    report = check_node(state, "p3dn.24xlarge")
    assert {(f.check, f.gpu) for f in report.failures} == {
        ("ecc", 2),
        ("retired-pages", 2),
        ("nvlink", 2),
        ("nvml", 6),
    }


def test_fake_nvml_gpu_case_a100_row_remap() -> None:
    a100 = v100(
        name="NVIDIA A100-SXM4-40GB", pending=pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    )
    a100 |= {"remap": (0, 1, 0, 1), "links": [1] * 12}
    state = read_node_state(FakeNvml([a100] * 8), kernel_log=no_kernel_log)
    assert state.gpus[0].remap_failed is True and state.gpus[0].retired_pages_pending is None
    assert check_node(state, "p4d.24xlarge").reason.startswith("GPU 0: row remapping failed")


def test_kernel_log_result_is_kept() -> None:
    log = "[1.0] NVRM: Xid (PCI:0000:00:16): 74, pid=1, NVLink: fatal error\n"
    state = read_node_state(FakeNvml([v100()] * 8), kernel_log=lambda: (log, "dmesg"))
    assert [e.xid for e in state.xid_events or ()] == [74] and state.xid_source == "dmesg"
    assert not check_node(state, "p3dn.24xlarge").healthy


def test_real_pynvml_without_a_driver() -> None:
    """The real library on this machine: no driver -> NvmlUnavailable naming the NVML error."""
    with pytest.raises(NvmlUnavailable, match="NVMLError_LibraryNotFound"):
        read_node_state()


def test_real_kernel_log_reader_answers_either_way() -> None:
    text, source = read_kernel_log()
    assert (text is not None and source in ("dmesg", "journalctl -k -b --no-pager -q")) or (
        text is None and source.startswith("kernel log not readable")
    )
