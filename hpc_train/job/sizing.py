"""The spec's sizing section (``JobSpec.sizing``): how wide a run is and on what, and how its batch
divides. Its options (``--nodes``, ``--gpus-per-node``, ``--instance-type``, ``--global-batch``,
``--batch-per-device``, ``--precision``), and what is derived from them alone: Slurm's ``--nodes``
(with the hot spares), the spares in an allocation, ranks per node, the largest world, the batch
per device and the batch plan on a world. What it needs from other sections (the preset's recipe,
``--spares``) it is given as a value. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpc_core.instances import DEFAULT_INSTANCE_TYPE
from hpc_train.job import batch, devices
from hpc_train.job.fields import SpecError, option
from hpc_train.job.presets import Preset


def parse_nodes(text: str) -> tuple[int, int]:
    """``"2"`` → (2, 2); ``"1-4"`` → (1, 4). SpecError when malformed or below 1."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not m:
        raise SpecError(f"--nodes {text!r}: expected N or MIN-MAX, e.g. 2 or 1-4")
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) else low
    if low < 1:
        raise SpecError(f"--nodes {text}: at least 1 node is needed")
    if high < low:
        raise SpecError(f"--nodes {text}: MAX is smaller than MIN")
    return low, high


@dataclass(frozen=True)
class Sizing:
    """How wide a run is, on what, and its batch (``JobSpec.sizing``)."""

    nodes_min: int = option(
        "--nodes", "N, or MIN-MAX to start with as many as are free (elastic)", default=1,
        parse=parse_nodes, fills=("nodes_min", "nodes_max"),
        metavar="N|MIN-MAX",
    )  # fmt: skip
    nodes_max: int = 1
    gpus_per_node: int = option(
        "--gpus-per-node", "GPUs (ranks) per node; 0: one CPU rank per node (gloo)", default=8,
        type=int, metavar="N",
    )  # fmt: skip
    instance_type: str = option(
        "--instance-type", "EC2 type: EFA/NCCL settings, cores, GPU batch and precision",
        default=DEFAULT_INSTANCE_TYPE, metavar="TYPE",
    )  # fmt: skip
    global_batch: int | None = option(
        "--global-batch", "sequences per update, kept whatever the node count (via update_freq)",
        default=None, type=int, default_text="the preset's", metavar="N",
    )  # fmt: skip
    batch_per_device: int | None = option(
        "--batch-per-device", "sequences per GPU", default=None, type=int, metavar="N",
        default_text="by preset and GPU memory, see hpc_train/job/devices.py",
    )  # fmt: skip
    precision: str | None = option(
        "--precision", "GPU ranks' precision", default=None, choices=devices.PRECISIONS,
        default_text="bf16 on A100/H100, fp16 on V100",
    )  # fmt: skip

    @property
    def nodes_arg(self) -> str:
        """Slurm's --nodes value: ``N`` or ``MIN-MAX`` for an elastic run."""
        if self.nodes_min == self.nodes_max:
            return str(self.nodes_min)
        return f"{self.nodes_min}-{self.nodes_max}"

    def allocation_arg(self, spares: int) -> str:
        """What the job asks Slurm for (sbatch --nodes): ``nodes_arg``, and with ``--spares K``
        up to K more: ``N-(N+K)``. The spares are best effort: a start (a requeue above all)
        never waits in the queue for them, it takes the ones that are free."""
        if not spares:
            return self.nodes_arg
        return f"{self.nodes_min}-{self.nodes_max + spares}"

    def spares_in(self, allocated: int, spares: int) -> int:
        """The hot spares in an allocation of ``allocated`` nodes: those past N, at most K
        (``spares``)."""
        return min(spares, max(0, allocated - self.nodes_min))

    @property
    def gpu_precision(self) -> str:
        return devices.precision(self.instance_type, self.precision)

    def ranks_per_node(self, gpu: bool) -> int:
        return self.gpus_per_node if gpu and self.gpus_per_node > 0 else 1

    def largest_world(self, gpu: bool) -> int:
        """Ranks at ``--nodes`` MAX: the world ``--dry-run`` shows and ``validate`` checks."""
        return self.nodes_max * self.ranks_per_node(gpu)

    def sequences_per_update(self, recipe: Preset) -> int:
        """The global batch: ``--global-batch``, else the recipe's."""
        return self.global_batch if self.global_batch is not None else recipe.global_batch

    def device_batch(self, recipe: Preset, gpu: bool, world_size: int) -> int:
        """Sequences per rank (``hpc_train.job.devices``), decided for the widest world the run
        may have (``--nodes`` MAX): the same at every width of an elastic run, so a resume at
        another width stays sample-exact (``worker.data_position``); narrower starts take more
        steps per update instead."""
        widest = max(world_size, self.largest_world(gpu))
        return devices.batch_per_device(
            recipe.name,
            self.instance_type if gpu else None,
            recipe.batch_per_device,
            self.sequences_per_update(recipe),
            widest,
            self.batch_per_device,
        )

    def batch_plan(self, recipe: Preset, world_size: int, gpu: bool) -> batch.BatchPlan:
        """The batch plan on ``world_size`` ranks, the one place it is derived (task 0 at each
        start, ``validate`` for the largest world): the global batch kept by ``--update-freq``;
        ValueError if it cannot be kept (smaller than one step of this world)."""
        per_device = self.device_batch(recipe, gpu, world_size)
        return batch.keep_global_batch(self.sequences_per_update(recipe), per_device, world_size)
