"""What verifying a checkpoint costs a resume (issue 41): ``make bench-verify``.

    python -m benchmarks.verify_cost --work-dir .local/bench/verify \
        --out benchmarks/results/verify_cost.json

The file: a roberta-large checkpoint as a GPU run saves it (fairseq's RoBERTa-large built at
full size on the CPU with the GPT-2 dictionary's 50,265 symbols: every parameter in fp32, the
tied output embedding written a second time as ``move_to_cpu`` does on a GPU, Adam's two moments
per parameter, the update counter), written by the toolkit's own save
(``worker.checkpoints.atomic_save``: the records read back and the digest sealed into the file
before its rename) into ``--work-dir``
(~4.5 GB; removed at the end unless ``--keep``). Its size is checked against
``planning.costs.preset_checkpoint_bytes`` (the same estimate ``submit`` uses).

Three ways to read it, each ``--repeat`` times, alternating their order:

- **load**: ``torch.load`` as fairseq's ``load_checkpoint_to_cpu`` calls it (weights_only, CPU);
- **verify**: ``hpc_core.integrity.verify`` alone (every record's CRC32 and the digest in one
  read);
- **verify beside load**: ``worker.checkpoints.load_verified``, what the rank does on a resume
  (the verification on other threads while the load runs; nothing trains until both are done).

Warm (the file in the page cache, as right after it was written or on a node that read it
before) and cold (the file's pages dropped first with ``posix_fadvise(DONTNEED)``: this file
only, never the machine's cache; the disk here is the VM's). Figures: medians, and
``overhead_beside_load`` = (verify beside load - load) / load, the goal's figure (<= 0.10);
``overhead_serial`` = verify / load, what a separate pass before the load would add. Checked on
the same file: the digest verified equals the one recorded as it was written, and one bit
flipped in the middle of it (tensor data; then flipped back) fails verification.

``--smoke``: the tiny preset's dimensions (a ~40 MB file), one repeat.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import report
from hpc_core import integrity
from hpc_train.planning import costs

NAME = "verify_cost"
GOAL = 0.10  # verification adds at most this to a resume's load
SMOKE = {"preset": "tiny", "repeat": 1}
DICT_SYMBOLS = costs.DEFAULT_VOCAB - costs.SPECIAL_SYMBOLS - costs.MASK_SYMBOLS


class BenchError(RuntimeError):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{NAME}", description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--preset", default="roberta-large", help="whose dimensions (default: %(default)s)"
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="measurements of each way (default: %(default)s)"
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=Path(".local/bench/verify"),
        help="where the file is written",
    )
    p.add_argument("--keep", action="store_true", help="keep the checkpoint file")
    p.add_argument("--out", type=Path, default=report.RESULTS / f"{NAME}.json")
    return p


# --- the file ---------------------------------------------------------------------------------


def model_state(preset: str, work: Path) -> dict[str, Any]:
    """fairseq's model for ``preset`` at full size on the CPU (GPT-2 dictionary's size), as a
    GPU rank's ``move_to_cpu`` leaves its state: fp32, the tied embedding a second tensor."""
    import torch

    from hpc_train.job import presets
    from hpc_train.worker import lean_import

    lean_import.import_fairseq()
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    data = work / "dict"
    data.mkdir(parents=True, exist_ok=True)
    (data / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(DICT_SYMBOLS)))
    recipe = presets.get(preset)
    argv = [str(data), "--task", "masked_lm", "--arch", recipe.arch, *recipe.arch_args,
            "--tokens-per-sample", str(recipe.tokens_per_sample)]  # fmt: skip
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), argv)
    )
    task = tasks.setup_task(cfg.task)
    with torch.no_grad():
        model = task.build_model(cfg.model)
        weights = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    params = [p for p in model.parameters()]
    moments = {i: {"step": torch.tensor(1000.0), "exp_avg": torch.full_like(p, 1e-3),
                   "exp_avg_sq": torch.full_like(p, 1e-6)} for i, p in enumerate(params)}  # fmt: skip
    optimizer = {"state": moments, "param_groups": [{"lr": 1e-4, "params": list(moments)}]}
    return {"model": weights, "last_optimizer_state": optimizer,
            "optimizer_history": [{"num_updates": 1000}], "extra_state": {"epoch": 1}}  # fmt: skip


def write_checkpoint(preset: str, work: Path) -> tuple[Path, float]:
    """The file, written by the toolkit's save; (its path, the save's seconds)."""
    from hpc_train.worker import checkpoints

    state = model_state(preset, work)
    path = work / "checkpoint_1_1000.pt"
    began = time.perf_counter()
    checkpoints.atomic_save(state, path)
    return path, time.perf_counter() - began


# --- the three ways to read it ------------------------------------------------------------------


def drop_cache(path: Path) -> None:
    """This file's pages out of the page cache (``posix_fadvise DONTNEED``; it is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def ways(path: Path) -> dict[str, Callable[[], object]]:
    import torch

    from hpc_train.worker import checkpoints

    def load() -> object:
        return torch.load(path, map_location="cpu", weights_only=True)

    def verify() -> object:
        check = integrity.verify(path)
        if not check.ok:
            raise BenchError(f"the checkpoint failed verification: {check.describe()}")
        return check

    return {"load": load, "verify": verify,
            "verify_beside_load": lambda: checkpoints.load_verified(path, load)}  # fmt: skip


def timed(way: Callable[[], object], cold: bool, path: Path) -> float:
    if cold:
        drop_cache(path)
    began = time.perf_counter()
    result = way()
    took = time.perf_counter() - began
    del result
    return took


def measure(path: Path, repeat: int, cold: bool) -> dict[str, Any]:
    """Each way ``repeat`` times, the order turned each round; seconds and their medians, the
    overheads."""
    funcs = ways(path)
    seconds: dict[str, list[float]] = {name: [] for name in funcs}
    for i in range(repeat):
        order = list(funcs) if i % 2 == 0 else list(reversed(funcs))
        for name in order:
            seconds[name].append(round(timed(funcs[name], cold, path), 3))
    median = {name: statistics.median(values) for name, values in seconds.items()}
    return {
        "seconds": seconds,
        "median_s": median,
        "overhead_beside_load": round(median["verify_beside_load"] / median["load"] - 1, 3),
        "overhead_serial": round(median["verify"] / median["load"], 3),
        "verify_gb_s": round(path.stat().st_size / median["verify"] / 1e9, 2),
    }


# --- the checks and the run ---------------------------------------------------------------------


def checks(path: Path) -> dict[str, Any]:
    """The digest read equals the one recorded; one bit flipped in the middle of the file (then
    restored) fails; task 0's cheap check before a start, timed."""
    from hpc_train.worker import checkpoints

    recorded = integrity.recorded(path)
    check = integrity.verify(path)
    at = path.stat().st_size // 2  # in tensor data: the records are most of the file
    with path.open("r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ 0x04]))
    try:
        flipped = integrity.verify(path)
    finally:
        with path.open("r+b") as fh:
            fh.seek(at)
            fh.write(bytes([byte]))
    began = time.perf_counter()
    problem, update = checkpoints.inspect(path)
    return {
        "records": check.records,
        "digest_verified": check.ok and check.sha256 == recorded and recorded is not None,
        "flipped_bit_caught": not flipped.ok and "CRC32 mismatch" in (flipped.problem or ""),
        "flipped_bit_problem": flipped.problem,
        "task0_check_s": round(time.perf_counter() - began, 3),
        "task0_check_ok": problem is None and update == 1000,
    }


def compute(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    work = args.work_dir / f"{NAME}-{os.getpid()}"
    work.mkdir(parents=True)
    try:
        path, save_s = write_checkpoint(args.preset, work)
        size = path.stat().st_size
        estimate = costs.preset_checkpoint_bytes(args.preset, gpu=True)
        if abs(size / estimate - 1) > 0.05:
            raise BenchError(f"the file is {size:,} bytes, the preset's estimate {estimate:,}")
        found = checks(path)
        result = {"benchmark": NAME, "preset": args.preset, "file_bytes": size,
                  "estimate_bytes": estimate, "save_s": round(save_s, 2), "repeat": args.repeat,
                  **found, "warm": measure(path, args.repeat, cold=False),
                  "cold": measure(path, args.repeat, cold=True), "goal": GOAL}  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    machine = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}
    return {**result, **report.provenance(started, load_before, machine)}


def rows(r: dict[str, Any]) -> report.Rows:
    warm, cold = r["warm"], r["cold"]
    return [
        ("file (bytes, records)", f"{r['file_bytes']:,} B, {r['records']} records", ""),
        ("torch.load warm / cold (s)", f"{warm['median_s']['load']:.2f} / {cold['median_s']['load']:.2f}", ""),
        ("verify alone warm / cold (s)", f"{warm['median_s']['verify']:.2f} / {cold['median_s']['verify']:.2f}", ""),
        ("verify beside load, warm: overhead", f"{warm['overhead_beside_load']:+.1%}", f"<= {GOAL:.0%}"),
        ("verify beside load, cold: overhead", f"{cold['overhead_beside_load']:+.1%}", f"<= {GOAL:.0%}"),
        ("verify as a separate pass, warm / cold", f"{warm['overhead_serial']:.0%} / {cold['overhead_serial']:.0%}", ""),
        ("a flipped bit caught; digest verified", f"{r['flipped_bit_caught']}; {r['digest_verified']}", "True; True"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = report.parse(build_parser(), argv, NAME, SMOKE)
    if args.repeat < 1:
        print(f"{NAME}: --repeat must be at least 1", file=sys.stderr)
        return 2
    done = report.run_and_write(NAME, args.out, lambda: compute(args), rows, (BenchError, OSError))
    return 0 if done is not None else 1


if __name__ == "__main__":
    sys.exit(main())
