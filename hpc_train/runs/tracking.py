"""Where a run's curves are (``--tensorboard``, ``--wandb-project``), for ``hpc-train status RUN``,
``logs`` and the end-of-run report: what rank 0 said at its last start
(``contract.TrackingRecord``). Nothing before a first start, nothing for a run without tracking.
"""

from __future__ import annotations

from hpc_core.rundir import RunDir
from hpc_train.contract import read_tracking


def lines(run: RunDir) -> list[str]:
    """The TensorBoard command, the W&B run (its URL online; ``wandb sync`` offline)."""
    said = read_tracking(run)
    if said is None:
        return []
    out = []
    if said.tensorboard:
        out.append(f"tensorboard: tensorboard --logdir {said.tensorboard}")
    wandb = said.wandb
    if wandb is not None:
        owner = f"{wandb.entity}/" if wandb.entity else ""
        where = said.url or (
            f"offline: wandb sync {run.wandb}/offline-run-*"
            if wandb.mode == "offline"
            else "online"
        )
        out.append(f"W&B: run {wandb.name} (id {wandb.run_id}) in {owner}{wandb.project}, {where}")
    return out
