"""Node and interconnect health checks: nccl-tests all_reduce_perf, a gloo twin, NVML.

- ``allreduce``: the all-reduce check through Slurm (a batch job, or a step inside one), judged;
  ``sweep``: its torch.distributed twin (gloo without GPUs); ``preflight``: the check inside a
  training job's allocation, before training;
- ``parse``, ``table``, ``verdict``: nccl-tests' output read and written, bus bandwidth and the
  verdict (pure);
- ``gpu``: a node's GPU health from a recorded state (pure), ``nvml_reader`` records it (NVML);
- ``__main__``: the CLI, ``python -m nccl_checks``; the exit codes every subcommand shares:
"""

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2  # bad arguments, unreadable input
EXIT_CANNOT_RUN = 3  # no NVIDIA driver, no Slurm, a job that never ran: nothing was judged
EXIT_CRASHED = 4  # the check itself failed (a bug): traceback on stderr, nothing was judged
