"""What a run asks of the cluster and how its batch divides, derived from the spec's fields:
Slurm's ``--nodes`` (with the hot spares), the spares in an allocation, ranks per node, the
largest world, the batch per device and the batch plan on a world. Pure.

``Sizing`` is ``JobSpec``'s base: its members are the spec's (``spec.batch_plan(...)``), kept here
apart from the option declarations; it has no fields of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpc_train.job import batch, devices

if TYPE_CHECKING:
    from hpc_train.job import presets
    from hpc_train.job.spec import Recovery


class Sizing:
    """The spec's sizing: ``JobSpec`` inherits it (the fields below are the spec's)."""

    if TYPE_CHECKING:
        preset: str
        nodes_min: int
        nodes_max: int
        recovery: Recovery  # its spares
        gpus_per_node: int
        instance_type: str
        global_batch: int | None
        batch_per_device: int | None

        @property
        def recipe(self) -> presets.Preset: ...

    @property
    def sequences_per_update(self) -> int:
        return self.global_batch if self.global_batch is not None else self.recipe.global_batch

    @property
    def allocation_arg(self) -> str:
        """What the job asks Slurm for (sbatch --nodes): ``nodes_arg``, and with ``--spares K``
        up to K more: ``N-(N+K)``. The spares are best effort: a start (a requeue above all)
        never waits in the queue for them, it takes the ones that are free."""
        if not self.recovery.spares:
            return self.nodes_arg
        return f"{self.nodes_min}-{self.nodes_max + self.recovery.spares}"

    def spares_in(self, allocated: int) -> int:
        """The hot spares in an allocation of ``allocated`` nodes: those past N, at most K."""
        return min(self.recovery.spares, max(0, allocated - self.nodes_min))

    @property
    def nodes_arg(self) -> str:
        """Slurm's --nodes value: ``N`` or ``MIN-MAX`` for an elastic run."""
        if self.nodes_min == self.nodes_max:
            return str(self.nodes_min)
        return f"{self.nodes_min}-{self.nodes_max}"

    def ranks_per_node(self, gpu: bool) -> int:
        return self.gpus_per_node if gpu and self.gpus_per_node > 0 else 1

    def device_batch(self, gpu: bool, world_size: int) -> int:
        """Sequences per rank (``hpc_train.job.devices``), decided for the widest world the run
        may have (``--nodes`` MAX): the same at every width of an elastic run, so a resume at
        another width stays sample-exact (``worker.data_position``); narrower starts take more
        steps per update instead."""
        widest = max(world_size, self.largest_world(gpu))
        return devices.batch_per_device(
            self.preset,
            self.instance_type if gpu else None,
            self.recipe.batch_per_device,
            self.sequences_per_update,
            widest,
            self.batch_per_device,
        )

    def batch_plan(self, world_size: int, gpu: bool) -> batch.BatchPlan:
        """The batch plan on ``world_size`` ranks, the one place it is derived (task 0 at each
        start, ``validate`` for the largest world): the global batch kept by ``--update-freq``;
        ValueError if it cannot be kept (smaller than one step of this world)."""
        per_device = self.device_batch(gpu, world_size)
        return batch.keep_global_batch(self.sequences_per_update, per_device, world_size)

    def largest_world(self, gpu: bool) -> int:
        """Ranks at ``--nodes`` MAX: the world ``--dry-run`` shows and ``validate`` checks."""
        return self.nodes_max * self.ranks_per_node(gpu)
