"""The bottom layer of hpc-train: what both ``hpc_train`` and ``nccl_checks`` stand on.

- ``hpc_core.slurm``: the only way to Slurm's commands (submit, signal, requeue, drain, release,
  job and node state, waiting for a job).
- ``hpc_core.slurm_conf``: where the Slurm clients' configuration is and what it says, read as a
  file (no Slurm command: a training rank may import it).
- ``hpc_core.slurm_env``: what Slurm tells a process through its environment, one property per
  ``SLURM_*`` variable (``SlurmEnv``); nothing else reads one.
- ``hpc_core.rundir``: the save-dir layout of a run and the one ``atomic_write``.
- ``hpc_core.integrity``: a checkpoint that proves itself whole: its digest sealed into it as
  it is written (in the zip's comment), one read that checks it and every record's CRC32, and
  where a file that fails is set aside.
- ``hpc_core.space``: a file system's free bytes and inodes where a run writes, and the one
  sentence that says what is short.
- ``hpc_core.ledger``: a run's ledger (what happened to it) and the user's index of runs.
- ``hpc_core.instances``: EC2 instance types (GPUs, memory, EFA) and the NCCL environment.
- ``hpc_core.wait``: the one poll-with-back-off loop.
- ``hpc_core.doorbell``: a node waiting on another node's word wakes when it is written (a UDP
  datagram with nothing in it, to a port each launcher registers in the run directory), not at
  its next poll; the polls stay the backstop.
- ``hpc_core.procs``: this host's processes whose environment carries given values (a job's, a
  start's, one emulated node's), read from /proc.

Nothing here imports ``hpc_train``, ``nccl_checks``, torch, fairseq, submitit, NVML or YAML;
``make lint`` checks it with import-linter.
"""
