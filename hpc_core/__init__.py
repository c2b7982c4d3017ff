"""The bottom layer of hpc-train: what both ``hpc_train`` and ``nccl_checks`` stand on.

- ``hpc_core.slurm``: the only way to Slurm (submit, signal, requeue, drain, state, waiting).
- ``hpc_core.rundir``: the save-dir layout of a run and the one ``atomic_write``.
- ``hpc_core.instances``: EC2 instance types (GPUs, memory, EFA) and the NCCL environment.
- ``hpc_core.wait``: the one poll-with-back-off loop.

Nothing here imports ``hpc_train``, ``nccl_checks``, torch, fairseq or submitit; ``make lint``
checks the layers with import-linter.
"""
