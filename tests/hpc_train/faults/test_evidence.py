"""Blame on evidence (issue 30 item 7): the table of docs/faults.md, "Bad nodes", row by row.
Pure: no Slurm, no files."""

from __future__ import annotations

import pytest

from hpc_core import ledger
from hpc_train.faults import suspects
from hpc_train.faults.failures import Failure
from hpc_train.faults.suspects import Evidence

HOUR = 3600.0
# docs/faults.md's table: evidence -> drained at its first blame of a machine (else: at its second)
TABLE = {
    Evidence.HARDWARE: True,
    Evidence.HEALTH_CHECK: True,
    Evidence.LOST: True,
    Evidence.HANG_NO_STACK: True,
    Evidence.STRAGGLER: True,
    Evidence.STORAGE: True,
    Evidence.SIGNAL: False,
    Evidence.OWN_ERROR: False,
    Evidence.HANG_WITH_STACKS: False,
}


def test_the_table_names_every_kind_of_evidence():
    assert set(TABLE) == set(Evidence)


@pytest.mark.parametrize("found", list(Evidence))
def test_each_row_first_blame_then_a_second_on_the_same_machine(found: Evidence):
    first = suspects.drain_verdict(found, earlier=0)
    assert first.drain is TABLE[found]
    assert first.why.startswith("drained" if TABLE[found] else "not drained")
    assert str(found) in first.why  # the ledger and the log say on what
    again = suspects.drain_verdict(found, earlier=1)
    assert again.drain  # whatever the evidence, a machine's second blame drains it
    assert again.why.startswith("drained")


def test_a_hangs_suspect_without_a_stack_is_evidence_about_its_node():
    assert suspects.of_hang(stack=True) is Evidence.HANG_WITH_STACKS
    assert suspects.of_hang(stack=False) is Evidence.HANG_NO_STACK
    assert suspects.drain_verdict(suspects.of_hang(stack=False), 0).drain
    assert not suspects.drain_verdict(suspects.of_hang(stack=True), 0).drain


@pytest.mark.parametrize(
    ("error", "hardware"),
    [
        (("RuntimeError", "CUDA error: uncorrectable ECC error encountered"), True),
        (("RuntimeError", "CUDA error: uncorrectable NVLink error was detected"), True),
        (("RuntimeError", "NVRM: Xid (PCI:0000:00:1e): 79, GPU has fallen off the bus"), True),
        (("NVMLError_GpuIsLost", "GPU is lost"), True),
        (
            ("RuntimeError", "NVML_SUCCESS == r INTERNAL ASSERT FAILED at CUDACachingAllocator"),
            False,
        ),
        (("RuntimeError", "CUDA error: an illegal memory access was encountered"), False),
        (("DistBackendError", "NCCL error: unhandled system error"), False),
        # a peer's ECC error seen from here: this rank only lost its peer
        (("DistBackendError", "[gloo] Connection closed by peer after ECC error"), False),
    ],
)
def test_a_hardware_finding_is_an_ecc_nvlink_xid_or_nvml_error_of_the_rank_itself(
    error: tuple[str, str], hardware: bool
):
    failure = Failure(0, 12, *error)
    assert failure.hardware is hardware
    if hardware:
        assert failure.cause == "infrastructure"  # retried, never taken for a user error


def blamed(node: str, at_h: float, machine: str = "") -> ledger.Event:
    data = {"node": node, "why": "crash", "machine": machine}
    return ledger.Event("blamed", at_h * HOUR, "7", 0, data)


def test_earlier_blames_count_per_machine_within_the_window():
    events = [
        blamed("n2", 0, "10.0.1.5"),
        blamed("n2", 1, "10.0.1.9"),  # the name's next machine (clustermgtd replaced it)
        blamed("n3", 2, "10.0.1.5"),  # another name
        ledger.Event("started", 2 * HOUR, "7", 0, {"node": "n2", "machine": "10.0.1.5"}),
    ]
    assert suspects.earlier(events, "n2", "10.0.1.5", 3 * HOUR) == 1
    assert suspects.earlier(events, "n2", "10.0.1.9", 3 * HOUR) == 1
    assert suspects.earlier(events, "n2", "10.0.1.7", 3 * HOUR) == 0  # a new machine: fresh
    assert suspects.earlier(events, "n2", "10.0.1.5", 25 * HOUR) == 0  # a day later: fresh
    unknown = [blamed("n4", 0), blamed("n4", 1, "10.0.1.4")]  # "": Slurm could not say
    assert suspects.earlier(unknown, "n4", "", 2 * HOUR) == 1
    assert suspects.earlier(unknown, "n4", "10.0.1.4", 2 * HOUR) == 1


def test_the_blame_that_finds_an_earlier_one_is_the_one_that_quarantines():
    """Drained at the second blame and quarantined at the second blame: one count."""
    past = [blamed("n2", 0, "10.0.1.5")]
    now = blamed("n2", 5, "10.0.1.5")
    assert suspects.quarantined(past) == []
    assert suspects.earlier(past, "n2", "10.0.1.5", now.time) == 1
    assert [(e.node, e.machine) for e in suspects.quarantined([*past, now])] == [("n2", "10.0.1.5")]
