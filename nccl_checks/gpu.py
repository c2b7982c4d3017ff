"""GPU node health: a recorded device state and pure checks over it.

``nvml_reader.read_node_state()`` fills a ``NodeState`` from NVML and the kernel log on a GPU node;
``gpu --json`` prints it, ``gpu --state FILE`` judges a recorded one. Everything below is pure, so
the checks are tested against recorded states.

Fail (the node should be drained): wrong GPU count, uncorrectable ECC errors since the driver
loaded, retired pages pending (V100) or a row-remap failure/pending remap (A100+), temperature at
the slowdown threshold, hardware slowdown / thermal / power-brake throttling, fewer NVLinks up than
the instance has, a GPU lost to NVML, and critical XIDs (48, 64, 74, 79, 95, 119, 120).
Warn (reported, not drained): persistence mode off, software thermal slowdown, temperature within
5 °C of slowdown, historic (aggregate) uncorrectable ECC, other XIDs, an unreadable kernel log,
NVLink not checked because NVML does not report it (some virtualised GPUs).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from hpc_core.instances import instance_type

Severity = Literal["fail", "warn", "ok"]

# NVML clocks-event (throttle) reason bits (nvml.h nvmlClocksEventReason*).
THROTTLE_FAIL = {0x8: "hw-slowdown", 0x40: "hw-thermal-slowdown", 0x80: "hw-power-brake"}
THROTTLE_WARN = {0x20: "sw-thermal-slowdown"}
TEMP_MARGIN_C = 5

# NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors): the ones a fleet acts on.
XIDS: dict[int, tuple[Severity, str]] = {
    13: ("warn", "graphics engine exception (usually the application)"),
    31: ("warn", "GPU memory page fault (usually the application)"),
    43: ("warn", "GPU stopped processing (usually the application)"),
    48: ("fail", "double-bit ECC error"),
    63: ("warn", "ECC page retirement / row remap recorded"),
    64: ("fail", "ECC page retirement / row remap failed"),
    74: ("fail", "NVLink error"),
    79: ("fail", "GPU has fallen off the bus: reboot or replace"),
    92: ("warn", "high single-bit ECC error rate"),
    94: ("warn", "contained ECC error"),
    95: ("fail", "uncontained ECC error: reset the GPU"),
    119: ("fail", "GSP RPC timeout"),
    120: ("fail", "GSP error"),
}
_XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")


class NvmlUnavailable(RuntimeError):
    """No NVIDIA driver / NVML here: nothing to check (exit 3, not a failure)."""


@dataclass(frozen=True)
class GpuState:
    """What NVML said about one GPU; None where the device does not support the query."""

    index: int
    name: str
    pci_bus_id: str = ""
    ecc_uncorrected_volatile: int | None = None  # since the driver loaded
    ecc_uncorrected_aggregate: int | None = None  # lifetime
    retired_pages_pending: bool | None = None  # V100: page retirement waits for a reboot
    retired_pages_dbe: int | None = None
    remap_pending: bool | None = None  # A100+: row remapping waits for a GPU reset
    remap_failed: bool | None = None
    temperature_c: int | None = None
    slowdown_temp_c: int | None = None
    throttle_reasons: int | None = None  # bit mask
    persistence_mode: bool | None = None
    nvlink_up: int | None = None
    nvml_errors: tuple[str, ...] = ()  # NVML errors other than NotSupported, by name


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str
    line: str


@dataclass(frozen=True)
class NodeState:
    driver_version: str
    gpus: tuple[GpuState, ...]
    xid_events: tuple[XidEvent, ...] | None = None  # None: the kernel log was not readable
    xid_source: str = ""  # where XIDs were read from, or why they were not

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeState:
        gpus = tuple(
            GpuState(**(g | {"nvml_errors": tuple(g.get("nvml_errors", ()))})) for g in data["gpus"]
        )
        events = data.get("xid_events")
        return cls(
            driver_version=str(data["driver_version"]),
            gpus=gpus,
            xid_events=None if events is None else tuple(XidEvent(**e) for e in events),
            xid_source=str(data.get("xid_source", "")),
        )


def load_state(path: Path) -> NodeState:
    """A state recorded with ``gpu --json`` (the whole output, or just its "state")."""
    data = json.loads(path.read_text())
    return NodeState.from_dict(data.get("state", data))


def parse_xids(kernel_log: str) -> tuple[XidEvent, ...]:
    """``NVRM: Xid (PCI:0000:00:1e): 79, pid=…, GPU has fallen off the bus.`` lines."""
    return tuple(
        XidEvent(int(m.group(2)), m.group(1), line.strip())
        for line in kernel_log.splitlines()
        if (m := _XID_LINE.search(line))
    )


@dataclass(frozen=True)
class GpuFinding:
    check: str
    severity: Severity
    detail: str
    gpu: int | None = None

    def line(self) -> str:
        where = f"GPU {self.gpu}: " if self.gpu is not None else ""
        return f"{where}{self.detail}"


def check_count(state: NodeState, expected: int, itype: str) -> GpuFinding:
    found = len(state.gpus)
    if found != expected:
        return GpuFinding("count", "fail", f"{found} GPUs visible, {itype} has {expected}")
    return GpuFinding("count", "ok", f"{found} GPUs")


def check_gpu(g: GpuState, nvlinks_expected: int) -> list[GpuFinding]:
    """Every per-GPU check; only fail/warn findings are returned."""
    out: list[GpuFinding] = []

    def add(check: str, severity: Severity, detail: str) -> None:
        out.append(GpuFinding(check, severity, detail, g.index))

    if any(e.startswith("GpuIsLost") for e in g.nvml_errors):
        add("nvml", "fail", "NVML reports the GPU lost (fallen off the bus)")
    elif g.nvml_errors:
        add("nvml", "warn", f"NVML errors: {', '.join(g.nvml_errors)}")
    if g.ecc_uncorrected_volatile:
        add("ecc", "fail", f"{g.ecc_uncorrected_volatile} uncorrectable ECC errors since boot")
    elif g.ecc_uncorrected_aggregate:
        add("ecc", "warn", f"{g.ecc_uncorrected_aggregate} uncorrectable ECC errors (lifetime)")
    if g.retired_pages_pending:
        add("retired-pages", "fail", "retired pages pending: reboot to retire them")
    if g.remap_failed:
        add("row-remap", "fail", "row remapping failed: replace the GPU")
    elif g.remap_pending:
        add("row-remap", "fail", "row remap pending: reset the GPU")
    if g.temperature_c is not None and g.slowdown_temp_c:
        if g.temperature_c >= g.slowdown_temp_c:
            add("temperature", "fail", f"{g.temperature_c} C >= slowdown {g.slowdown_temp_c} C")
        elif g.temperature_c >= g.slowdown_temp_c - TEMP_MARGIN_C:
            add("temperature", "warn", f"{g.temperature_c} C near slowdown {g.slowdown_temp_c} C")
    reasons = g.throttle_reasons or 0
    if bad := [name for bit, name in THROTTLE_FAIL.items() if reasons & bit]:
        add("throttle", "fail", f"throttled: {', '.join(bad)}")
    if soft := [name for bit, name in THROTTLE_WARN.items() if reasons & bit]:
        add("throttle", "warn", f"throttled: {', '.join(soft)}")
    if g.persistence_mode is False:
        add("persistence", "warn", "persistence mode off (nvidia-smi -pm 1 / nvidia-persistenced)")
    if nvlinks_expected and g.nvlink_up is not None and g.nvlink_up < nvlinks_expected:
        add("nvlink", "fail", f"{g.nvlink_up} of {nvlinks_expected} NVLinks up")
    return out


def check_nvlink_unknown(state: NodeState, nvlinks_expected: int) -> list[GpuFinding]:
    """One warning when links are expected but NVML answered no NVLink query (NotSupported)."""
    unknown = [g.index for g in state.gpus if g.nvlink_up is None]
    if not nvlinks_expected or not unknown:
        return []
    which = "every GPU" if len(unknown) == len(state.gpus) else f"GPU {_ranges(unknown)}"
    detail = f"NVLink: not checked (NVML: not supported) on {which}; {nvlinks_expected} expected"
    return [GpuFinding("nvlink", "warn", detail)]


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans: list[list[int]] = []
    for i in sorted(indices):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def check_xids(state: NodeState) -> list[GpuFinding]:
    if state.xid_events is None:
        return [GpuFinding("xid", "warn", f"XIDs not checked: {state.xid_source}")]
    out = []
    for xid in sorted({e.xid for e in state.xid_events}):
        severity, meaning = XIDS.get(xid, ("warn", "see NVIDIA's XID catalogue"))
        pcis = sorted({e.pci for e in state.xid_events if e.xid == xid})
        out.append(GpuFinding("xid", severity, f"XID {xid} ({meaning}) on {', '.join(pcis)}"))
    return out


@dataclass(frozen=True)
class GpuReport:
    state: NodeState
    instance_type: str
    findings: tuple[GpuFinding, ...] = field(default=())

    @property
    def failures(self) -> list[GpuFinding]:
        return [f for f in self.findings if f.severity == "fail"]

    @property
    def healthy(self) -> bool:
        return not self.failures

    @property
    def reason(self) -> str:
        if self.failures:
            more = len(self.failures) - 1
            return self.failures[0].line() + (f" (+{more} more)" if more else "")
        warns = [f for f in self.findings if f.severity == "warn"]
        note = f"; {len(warns)} warning(s): {warns[0].line()}" if warns else ""
        return f"{len(self.state.gpus)} GPUs healthy ({self.instance_type}){note}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "reason": self.reason,
            "instance_type": self.instance_type,
            "findings": [asdict(f) for f in self.findings],
            "state": self.state.to_dict(),
        }


def check_node(state: NodeState, itype_name: str) -> GpuReport:
    """All checks for a node of ``itype_name``. ValueError for an unknown instance type."""
    itype = instance_type(itype_name)
    findings = [check_count(state, itype.gpus, itype.name)]
    for g in state.gpus:
        findings += check_gpu(g, itype.nvlink_links)
    findings += check_nvlink_unknown(state, itype.nvlink_links)
    findings += check_xids(state)
    return GpuReport(state, itype.name, tuple(f for f in findings if f.severity != "ok"))


def _cell(value: object, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def render(report: GpuReport) -> str:
    """A table for people: one row per GPU, then the findings."""
    s = report.state
    lines = [
        f"# driver {s.driver_version}, {len(s.gpus)} GPUs, {report.instance_type}; "
        f"kernel log: {s.xid_source or '-'}",
        f"{'GPU':>3}  {'name':<22} {'ECC-unc':>7} {'retire':>7} {'remap':>6} {'temp':>9} "
        f"{'throttle':>8} {'persist':>7} {'nvlink':>6}",
    ]
    for g in s.gpus:
        temp = f"{_cell(g.temperature_c)}/{_cell(g.slowdown_temp_c)} C"
        lines.append(
            f"{g.index:>3}  {g.name[:22]:<22} {_cell(g.ecc_uncorrected_volatile):>7} "
            f"{_cell(g.retired_pages_pending):>7} {_cell(g.remap_failed):>6} {temp:>9} "
            f"{_cell(g.throttle_reasons, '{:#x}'):>8} {_cell(g.persistence_mode):>7} "
            f"{_cell(g.nvlink_up):>6}"
        )
    lines += [f"{f.severity.upper():<4} {f.check:<13} {f.line()}" for f in report.findings]
    return "\n".join(lines)
