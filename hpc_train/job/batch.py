"""Global-batch arithmetic: keep the sequences per update fixed whatever the world size. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPlan:
    global_batch: int  # sequences per update the user asked for
    batch_per_device: int
    world_size: int
    update_freq: int

    @property
    def effective(self) -> int:
        """Sequences actually consumed per update (>= global_batch)."""
        return self.batch_per_device * self.world_size * self.update_freq

    def describe(self) -> str:
        exact = "" if self.effective == self.global_batch else f" (asked {self.global_batch})"
        return (
            f"update_freq={self.update_freq}: {self.batch_per_device} sequences x "
            f"{self.world_size} ranks x {self.update_freq} = {self.effective} per update{exact}"
        )


def keep_global_batch(global_batch: int, batch_per_device: int, world_size: int) -> BatchPlan:
    """update_freq = ceil(global / (batch_per_device x world)); ValueError when it cannot fit.

    A global batch smaller than one step of the whole world cannot be honoured by gradient
    accumulation, so it is refused rather than silently enlarged.
    """
    if batch_per_device < 1 or world_size < 1:
        raise ValueError("batch per device and world size must be >= 1")
    step = batch_per_device * world_size
    if global_batch < step:
        raise ValueError(
            f"global batch {global_batch} is smaller than one step of the world "
            f"({batch_per_device} sequences x {world_size} ranks = {step})"
        )
    return BatchPlan(global_batch, batch_per_device, world_size, math.ceil(global_batch / step))
