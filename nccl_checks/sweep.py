"""The torch.distributed all-reduce sweep: one rank per node (gloo) or per GPU (nccl).

Started by ``srun`` (see allreduce.py), never by hand; rank 0 prints a table in nccl-tests' text
format so the output goes through the same parser and verdict as ``all_reduce_perf``.

    srun -N2 --ntasks-per-node=1 python -m nccl_checks.sweep --backend gloo

Rank and world size come from Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or torchrun
(RANK, WORLD_SIZE, LOCAL_RANK); the rendezvous from MASTER_ADDR and MASTER_PORT.

What is measured: ``dist.all_reduce`` (sum, float32) works in place, so the out-of-place columns
are N/A. For each size: ``--warmup`` untimed calls, then ``--iters`` timed calls back to back; the
time is the slowest rank's mean. #wrong: after timing, every rank fills the buffer with rank+1,
reduces once and counts elements that differ from n(n+1)/2.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from hpc_core.slurm_env import LOCALID, NTASKS, PROCID, SlurmEnv
from nccl_checks.parse import Measurement
from nccl_checks.table import footer_lines, header_lines, parse_size, row_line, sizes
from nccl_checks.verdict import algbw, bus_factor

PROGRAM = "all_reduce_perf (hpc-train torch.distributed sweep)"
NA = Measurement(None, None, None, None)


def _env_int(
    name: str, slurm: tuple[str, int | None] | None = None, default: int | None = None
) -> int:
    """Slurm's value (``slurm``: its variable and what ``hpc_core.slurm_env`` read of it) when
    it set one, else ``name``'s (torchrun's), else ``default``."""
    if slurm is not None and slurm[1] is not None:
        return slurm[1]
    if os.environ.get(name):
        return int(os.environ[name])
    if default is None:
        names = [slurm[0], name] if slurm is not None else [name]
        raise SystemExit(f"error: none of {', '.join(names)} is set (start me with srun)")
    return default


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(buf: torch.Tensor, iters: int, device: torch.device) -> float:
    """Mean seconds per all_reduce on this rank."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    _sync(device)
    return (time.perf_counter() - start) / iters


def _wrong(buf: torch.Tensor, rank: int, world: int, device: torch.device) -> int:
    buf.fill_(rank + 1)
    dist.all_reduce(buf)
    wrong = (buf != world * (world + 1) / 2).sum().to(torch.int64).reshape(1)
    dist.all_reduce(wrong)
    return int(wrong.item())


def _slowest(seconds: float, device: torch.device) -> float:
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def run(
    backend: str, size_list: list[int], factor: int, warmup: int, iters: int, timeout_s: float
) -> int:
    slurm = SlurmEnv()
    rank = _env_int("RANK", (PROCID, slurm.procid))
    world = _env_int("WORLD_SIZE", (NTASKS, slurm.ntasks))
    local = _env_int("LOCAL_RANK", (LOCALID, slurm.localid), default=0)
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = _env_int("MASTER_PORT")
    if backend == "nccl":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        name = "[cpu] gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        me = (socket.gethostname(), os.getpid(), local if backend == "nccl" else -1, name)
        everyone: list[tuple[str, int, int, str] | None] = [None] * world
        dist.all_gather_object(everyone, me)
        if rank == 0:
            ranks = [r for r in everyone if r is not None]
            head = header_lines(PROGRAM, ranks, size_list[0], size_list[-1], factor, warmup, iters)
            print("\n".join(head), flush=True)
        big = torch.zeros(size_list[-1] // 4, dtype=torch.float32, device=device)
        total_wrong, busbws = 0, []
        for size in size_list:
            count = size // 4
            buf = big[:count]
            buf.zero_()
            for _ in range(warmup):
                dist.all_reduce(buf)
            seconds = _slowest(_timed(buf, iters, device), device)
            wrong = _wrong(buf, rank, world, device)
            total_wrong += wrong
            time_us = seconds * 1e6
            alg = algbw(count * 4, time_us)
            busbws.append(alg * bus_factor(world))
            if rank == 0:
                in_place = Measurement(time_us, alg, alg * bus_factor(world), float(wrong))
                print(row_line(count * 4, count, NA, in_place), flush=True)
        if rank == 0:
            avg = sum(busbws) / len(busbws)
            print("\n".join(footer_lines(total_wrong, avg, PROGRAM)), flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nccl_checks.sweep",
        description="torch.distributed all-reduce sweep printing an nccl-tests table (rank 0).",
    )
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--min-bytes", "-b", default="8")
    parser.add_argument("--max-bytes", "-e", default="16M")
    parser.add_argument("--factor", "-f", type=int, default=2)
    parser.add_argument("--warmup", "-w", type=int, default=2)
    parser.add_argument("--iters", "-n", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=120.0, help="collective timeout, s")
    args = parser.parse_args(argv)
    try:
        size_list = sizes(parse_size(args.min_bytes), parse_size(args.max_bytes), args.factor)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run(args.backend, size_list, args.factor, args.warmup, args.iters, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
