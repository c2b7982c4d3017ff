"""Fill a ``gpu.NodeState`` from NVML (nvidia-ml-py, ``import pynvml``) and the kernel log.

Thin on purpose: no judgement here (that is gpu.py). A query the device does not support is
recorded as None; any other NVML error is recorded by name on the GPU, so a lost GPU shows up
as a finding instead of a crash.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from nccl_checks.gpu import GpuState, NodeState, NvmlUnavailable, parse_xids

_HINTS = {
    "NVMLError_LibraryNotFound": "NVML library not found: no NVIDIA driver on this machine",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_NoPermission": "no permission to talk to the NVIDIA driver",
}


def _error_name(err: Exception) -> str:
    return type(err).__name__.removeprefix("NVMLError_")


class _Device:
    """Calls on one device handle; unsupported -> None, other NVML errors collected by name."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle
        self.errors: list[str] = []

    def get(self, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(self.handle, *args)
        except self.nvml.NVMLError as err:
            name = _error_name(err)
            if name not in ("NotSupported", "InvalidArgument", "FunctionNotFound"):
                self.errors.append(f"{name}({fn_name})")
            return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu(nvml: Any, index: int) -> GpuState:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as err:
        return GpuState(index, "?", nvml_errors=(f"{_error_name(err)}(GetHandleByIndex)",))
    d = _Device(nvml, handle)
    unc, vol, agg = (
        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nvml.NVML_VOLATILE_ECC,
        nvml.NVML_AGGREGATE_ECC,
    )
    remap = d.get("nvmlDeviceGetRemappedRows")  # (corrected, uncorrected, pending, failed)
    pending = d.get("nvmlDeviceGetRetiredPagesPendingStatus")
    dbe = d.get("nvmlDeviceGetRetiredPages", nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    reasons = d.get("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:
        reasons = d.get("nvmlDeviceGetCurrentClocksThrottleReasons")
    persistence = d.get("nvmlDeviceGetPersistenceMode")
    links = [d.get("nvmlDeviceGetNvLinkState", link) for link in range(nvml.NVML_NVLINK_MAX_LINKS)]
    answered = [s for s in links if s is not None]
    pci = d.get("nvmlDeviceGetPciInfo")
    return GpuState(
        index=index,
        name=_text(d.get("nvmlDeviceGetName") or "?"),
        pci_bus_id=_text(pci.busId) if pci is not None else "",
        ecc_uncorrected_volatile=d.get("nvmlDeviceGetTotalEccErrors", unc, vol),
        ecc_uncorrected_aggregate=d.get("nvmlDeviceGetTotalEccErrors", unc, agg),
        retired_pages_pending=None if pending is None else pending == nvml.NVML_FEATURE_ENABLED,
        retired_pages_dbe=None if dbe is None else len(dbe),
        remap_pending=None if remap is None else bool(remap[2]),
        remap_failed=None if remap is None else bool(remap[3]),
        temperature_c=d.get("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU),
        slowdown_temp_c=d.get(
            "nvmlDeviceGetTemperatureThreshold", nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        ),
        throttle_reasons=reasons,
        persistence_mode=None if persistence is None else persistence == nvml.NVML_FEATURE_ENABLED,
        nvlink_up=sum(s == nvml.NVML_FEATURE_ENABLED for s in answered) if answered else None,
        nvml_errors=tuple(d.errors),
    )


def read_kernel_log() -> tuple[str | None, str]:
    """(text, source) from dmesg or the journal's kernel messages; (None, why) if unreadable."""
    tried = []
    for cmd in (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            tried.append(f"{cmd[0]}: {err}")
            continue
        if proc.returncode == 0:
            return proc.stdout, " ".join(cmd)
        tried.append(f"{cmd[0]}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
    return None, "kernel log not readable (" + "; ".join(tried) + ")"


def read_node_state(
    nvml: Any | None = None,
    kernel_log: Callable[[], tuple[str | None, str]] = read_kernel_log,
) -> NodeState:
    """Read every GPU through NVML; NvmlUnavailable when there is no driver (not a crash)."""
    if nvml is None:
        try:
            import pynvml  # only on the path that needs it
        except ImportError as err:
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({err})") from None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        name = type(err).__name__
        raise NvmlUnavailable(f"{_HINTS.get(name, 'NVML did not initialise')} ({name})") from None
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus = tuple(_gpu(nvml, i) for i in range(nvml.nvmlDeviceGetCount()))
    finally:
        nvml.nvmlShutdown()
    text, source = kernel_log()
    return NodeState(driver, gpus, None if text is None else parse_xids(text), source)
