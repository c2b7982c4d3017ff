"""The training worker's GPU binding, logging and warnings (hpc_train.worker.train), without a GPU.

The binding itself (NCCL process group bound to LOCAL_RANK's GPU) was checked on an H100: no
"Guessing device ID", "barrier(): using the device under current context" or
"destroy_process_group() was not called" in the worker logs of benchmarks/results/gpu.json's runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from hpc_train.job.command_lines import fairseq_args
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Training
from hpc_train.worker import train

TORCHRUN = {"WORLD_SIZE": "16", "RANK": "11", "LOCAL_RANK": "3"}
STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (INFO|WARNING|ERROR) \| [\w.]+ \| ")


def test_each_gpu_rank_binds_to_its_local_rank() -> None:
    assert train.local_gpu(TORCHRUN, ["data"], visible=8) == 3
    assert train.local_gpu(TORCHRUN, ["data", "--cpu"], visible=8) is None  # gloo: fairseq's
    assert train.local_gpu(TORCHRUN, ["data"], visible=0) is None
    assert train.local_gpu({}, ["data"], visible=8) is None  # outside torchrun
    with pytest.raises(ValueError, match="LOCAL_RANK=3 but 2 GPU"):
        train.local_gpu(TORCHRUN, ["data"], visible=2)


def test_cpu_ranks_leave_the_process_group_to_fairseq() -> None:
    assert train.start_process_group(TORCHRUN, ["data", "--cpu"]) is None
    train.stop_process_group()  # nothing started: a no-op


def test_hydra_schema_warning_is_silenced_and_nothing_else() -> None:
    hydra_text = (
        "\n'config' is validated against ConfigStore schema with the same name.\n"
        "This behavior is deprecated in Hydra 1.1 and will be removed in Hydra 1.2."
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train.quiet_known_warnings()
        warnings.warn(hydra_text, UserWarning, stacklevel=1)
        warnings.warn("Distributed is already initialized, cannot initialize twice!", stacklevel=1)
        warnings.warn("something else is validated against ConfigStore schema", stacklevel=1)
    # a ResourceWarning is the garbage collector's, whenever it runs (an earlier test's file)
    assert [str(w.message) for w in seen if w.category is not ResourceWarning] == [
        "something else is validated against ConfigStore schema"
    ]


@pytest.mark.fairseq
def test_bf16_off_tpus(tmp_path: Path) -> None:
    spec = JobSpec(Training("tiny", tmp_path, tmp_path / "s"), sizing=Sizing(gpus_per_node=0))
    args, _ = fairseq_args(spec, world_size=1, gpu=False)
    cfg = train.fairseq_config([*args, "--bf16"])
    assert cfg.common.bf16 and not cfg.common.tpu  # fairseq alone would set tpu (torch_xla)
    assert train.fairseq_config([*args, "--bf16", "--tpu"]).common.tpu


def test_worker_output_keeps_fairseq_format_and_no_known_warnings(
    corpus: Path, tmp_path: Path
) -> None:
    spec = JobSpec(
        Training("tiny", corpus, tmp_path / "run", max_update=3), sizing=Sizing(gpus_per_node=0)
    )
    args, _ = fairseq_args(spec, world_size=1, gpu=False)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpc_train.worker.train",
            *args,
            "--optimizer",
            "fused_adamw",
            "--bf16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == "", proc.stderr[-3000:]  # no warnings, no DEBUG lines from hydra
    starts = [line for line in proc.stdout.splitlines() if re.match(r"^\S", line)]
    unstamped = [line for line in starts if not STAMPED.match(line) and line != ")"]
    assert len(starts) > 20 and unstamped == []  # the model printout continues indented
    assert "done training" in proc.stdout
