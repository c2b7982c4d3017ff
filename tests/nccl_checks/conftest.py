"""Fixtures for the nccl_checks tests: a node that may be drained, and always comes back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc_core import slurm
from hpc_core.wait import wait_until

DRAIN_NODE = "n4"  # other tests of the session use n1..n4 concurrently: only n4 is drained here
OURS = "nccl_checks"  # every drain reason these checks write starts with this


def node_state(node: str) -> tuple[str, str]:
    info = slurm.node_info(node)
    return info.get("State", ""), info.get("Reason", "")


def _wait(predicate, seconds: float) -> bool:
    try:
        return wait_until(predicate, "the node", timeout=seconds)
    except TimeoutError:
        return False


@pytest.fixture
def drainable_node(slurm_cluster: Path) -> Iterator[str]:
    """n4 while nobody else has it drained or down; resumed afterwards if we drained it."""

    def usable() -> bool:
        state = node_state(DRAIN_NODE)[0]
        return not any(s in state for s in ("DRAIN", "DOWN", "FAIL"))

    if not _wait(usable, 60):
        pytest.skip(f"{DRAIN_NODE} is drained/down by someone else: {node_state(DRAIN_NODE)}")
    try:
        yield DRAIN_NODE
    finally:
        state, reason = node_state(DRAIN_NODE)
        if "DRAIN" in state and reason.startswith(OURS):
            slurm.resume(DRAIN_NODE)
            assert _wait(lambda: "DRAIN" not in node_state(DRAIN_NODE)[0], 30), node_state(
                DRAIN_NODE
            )
