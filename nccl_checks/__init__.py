"""Node and interconnect health checks: nccl-tests all_reduce_perf, a gloo twin, NVML.

Exit codes shared by every subcommand of ``python -m nccl_checks``.
"""

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2  # bad arguments, unreadable input
EXIT_CANNOT_RUN = 3  # no NVIDIA driver, no Slurm, a job that never ran: nothing was judged
EXIT_CRASHED = 4  # the check itself failed (a bug): traceback on stderr, nothing was judged
