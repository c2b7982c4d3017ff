"""nccl_checks.sweep: the torch.distributed worker, two real gloo ranks on this machine.

(The run through Slurm across emulated nodes is in test_nccl_allreduce.py; this one starts the two
ranks directly, as torchrun would, to check the worker's own contract quickly.)
"""

from __future__ import annotations

import os
import subprocess
import sys

from hpc_train.testing import free_port
from nccl_checks.parse import parse
from nccl_checks.verdict import judge


def test_two_gloo_ranks_print_one_parsable_table() -> None:
    env = os.environ | {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
    }
    for key in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "nccl_checks.sweep", "-b", "1K", "-e", "1M", "-f", "4", "-n", "3"]
    ranks = [
        subprocess.Popen(cmd, env=env | {"RANK": str(r)}, stdout=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120)[0] for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0]
    assert outs[1] == ""  # only rank 0 prints
    table = parse(outs[0])
    assert [r.size for r in table.rows] == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert table.nranks == 2 and table.out_of_bounds == 0
    assert all(r.out_of_place.time_us is None for r in table.rows)  # torch reduces in place
    assert all(r.in_place.wrong == 0 and (r.in_place.time_us or 0) > 0 for r in table.rows)
    # busbw printed by the worker agrees with size/time for 2 ranks (the verdict's cross-check)
    check = next(c for c in judge(table, "cpu", 2).checks if c.name == "busbw-recompute")
    assert check.ok and check.detail.startswith("6 values agree")
    assert "step: 4(factor)" in outs[0] and "iters: 3" in outs[0]
