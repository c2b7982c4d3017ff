"""PyTorch's NCCL flight recorder on GPU ranks: the environment the launcher gives them, and the
hang response's write on each rank's FIFO and copy of the dumps.

The GPU side is not exercised here: no NCCL process group runs (this machine has no GPU and a
CPU-only torch). A real FIFO made with ``os.mkfifo`` and read by a thread stands in for the one
ProcessGroupNCCL makes and reads; files written by the test stand in for its dumps.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from hpc_core import instances
from hpc_core.rundir import RunDir, nccl_pipe, nccl_trace_prefix, nccl_traces
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, SlurmJob, Training
from hpc_train.launch import launcher
from hpc_train.watch import hang_monitor

FR_VARS = (
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
)


class EnvTorchrun(launcher.Launcher):
    """torchrun replaced by a Python that writes the flight-recorder variables it was given."""

    def __init__(self, spec: JobSpec, out: Path) -> None:
        super().__init__(spec)
        self.out = out

    def torchrun_command(self, start: launcher.Start, nproc: int, args: list[str]) -> list[str]:
        body = (
            "import json, os\n"
            f"names = {list(FR_VARS)!r}\n"
            f"json.dump({{k: os.environ.get(k) for k in names}}, open({str(self.out)!r}, 'w'))\n"
        )
        return [sys.executable, "-c", body]


def launched_env(tmp_path: Path, gpus_per_node: int, gpus: int) -> dict[str, str | None]:
    out = tmp_path / "env.json"
    spec = JobSpec(
        Training("tiny", Path("/d"), tmp_path / "save"),
        sizing=Sizing(gpus_per_node=gpus_per_node),
        slurm=SlurmJob(node_check="off"),  # this machine's NVML: no p3dn's GPUs
    )
    EnvTorchrun(spec, out).run(launcher.Start("41", 0, 1, "n1", 0), gpus=gpus)
    return json.loads(out.read_text())


def test_gpu_ranks_get_the_flight_recorder_dumping_into_their_heartbeat_dir(tmp_path, fake_slurm):
    env = launched_env(tmp_path, gpus_per_node=1, gpus=1)
    beats = RunDir(tmp_path / "save").heartbeats("41", 0, launcher.node_name())
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == str(instances.FLIGHT_RECORDER_ENTRIES)
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"]
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(nccl_trace_prefix(beats))
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    # torch makes <prefix><rank>.pipe: the very path the hang response writes to
    assert f"{env['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}3.pipe" == str(nccl_pipe(beats, 3))
    assert beats.is_dir()  # made before the ranks start: they make their FIFO in it
    assert not RunDir(tmp_path / "save").incident("41", 0).exists()  # no hang, no incident dir


def test_cpu_ranks_get_no_flight_recorder(tmp_path, fake_slurm):
    env = launched_env(tmp_path, gpus_per_node=0, gpus=0)
    assert all(value is None for value in env.values()), env


def reader(pipe: Path, got: list[bytes]) -> threading.Thread:
    """Read the FIFO the way a rank does: opened non-blocking, polled."""
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)

    def poll() -> None:
        try:
            for _ in range(200):
                try:
                    data = os.read(fd, 128)
                except BlockingIOError:
                    data = b""
                if data:
                    got.append(data)
                    return
                time.sleep(0.01)
        finally:
            os.close(fd)

    thread = threading.Thread(target=poll)
    thread.start()
    return thread


def test_the_hang_response_writes_to_each_live_ranks_pipe(tmp_path):
    os.mkfifo(nccl_pipe(tmp_path, 0))
    os.mkfifo(nccl_pipe(tmp_path, 1))  # a rank that is gone: its FIFO has no reader
    got: list[bytes] = []
    thread = reader(nccl_pipe(tmp_path, 0), got)
    poked = hang_monitor.poke_flight_recorders(tmp_path, [0, 1, 2])  # rank 2: no FIFO (gloo)
    thread.join(timeout=5)
    assert poked == [0]
    assert got and got[0]


def test_the_dumps_are_copied_into_the_incident_dir(tmp_path):
    beats, incident = tmp_path / "beats", tmp_path / "incident"
    beats.mkdir()
    since = time.time()
    late = threading.Timer(0.3, Path(f"{nccl_trace_prefix(beats)}0").write_bytes, [b"trace 0"])
    late.start()  # rank 0 dumps a moment after the write on its pipe
    (beats / "rank-0.json").write_text("{}")  # a heartbeat: not a dump
    copied = hang_monitor.save_flight_records(beats, incident, [0], since, timeout=5)
    late.join()
    assert copied == 1
    assert [p.name for p in nccl_traces(incident)] == ["nccl_trace_rank_0"]
    assert (incident / "nccl_trace_rank_0").read_bytes() == b"trace 0"


def test_no_dump_is_waited_for_when_no_rank_was_poked(tmp_path):
    started = time.monotonic()
    assert hang_monitor.save_flight_records(tmp_path, tmp_path / "incident", [], 0.0, 30) == 0
    assert time.monotonic() - started < 10  # never the 30 s wait for a dump, even on a busy machine
    assert not (tmp_path / "incident").exists()
