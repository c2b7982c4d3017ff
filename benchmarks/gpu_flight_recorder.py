"""Does a hang's flight-recorder dump work on a real GPU? (a check, run where a GPU is visible)

One NCCL rank, set up exactly as the launcher sets up a GPU rank (``hang_monitor.flight_recorder_env``
for its heartbeat directory): a few all-reduces, then what the watchdog does on a hang —
``hang_monitor.poke_flight_recorders`` writes to the rank's FIFO and ``save_flight_records`` copies
the dump into an incident dir. Reports whether the FIFO appeared, how long the dump took, and
what it holds (its collectives). Exits 0 with ``{"gpu": false}`` where no GPU is visible.

    python -m benchmarks.gpu_flight_recorder --out benchmarks/results/gpu-flight-recorder.json
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hpc_core.rundir import atomic_write, nccl_pipe
from hpc_core.wait import FAST, wait_until
from hpc_train.watch import hang_monitor

SHOWN = ("profiling_name", "state", "input_sizes")  # of a collective's record in the dump


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check(work: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return {"gpu": False}
    beats, incident = work / "heartbeats", work / "incident"
    incident.mkdir(parents=True)
    os.environ.update(hang_monitor.flight_recorder_env(beats))
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0,
        device_id=device,
    )  # fmt: skip
    x = torch.ones(1 << 20, device=device)
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    pipe = nccl_pipe(beats, 0)
    fifo = wait_until(pipe.is_fifo, "the rank's FIFO", 10, FAST)
    poked_at = time.time()
    poked = hang_monitor.poke_flight_recorders(beats, [0])
    copied = hang_monitor.save_flight_records(beats, incident, poked, poked_at, timeout=20)
    dumped_s = time.time() - poked_at
    dumps = sorted(p.name for p in incident.iterdir())
    entries: list[dict[str, Any]] = []
    if dumps:
        # our own process's dump, read back here: a trusted pickle
        record = pickle.loads((incident / dumps[0]).read_bytes())
        entries = record.get("entries", []) if isinstance(record, dict) else []
    dist.destroy_process_group()
    first = entries[0] if entries else {}
    return {
        "gpu": True,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "fifo_appeared": bool(fifo),
        "poked_ranks": poked,
        "dumps_copied": copied,
        "dump_files": dumps,
        "seconds_poke_to_copied": round(dumped_s, 3),
        "collectives_in_dump": len(entries),
        "first_collective": {k: str(v) for k, v in first.items() if k in SHOWN},
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TORCH_NCCL", "TORCH_FR"))},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-flight-recorder.json"))
    args = p.parse_args(argv)
    import json

    with tempfile.TemporaryDirectory() as work:
        result = check(Path(work))
    result["date"] = time.strftime("%Y-%m-%d")
    text = json.dumps(result, indent=1)
    print(text)
    atomic_write(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
