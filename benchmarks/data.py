"""Data-preparation benchmark (issue 13): ``make bench-data``.

    python -m benchmarks.data --out benchmarks/results/data.json

GPT-2 BPE encoding speed on the same text, measured in one run as ratios (the machine is shared
and noisy, so every figure is compared with one taken beside it):

1. **fairseq** - ``multiprocessing_bpe_encoder.py --keep-empty --workers N``, the seeds' command
   (fairseq's own file from the installed package), N = 1 and 2;
2. **ours** - ``python -m hpc_train.data bpe --workers N``: the pipeline's BPE step (scan with
   sha256 and UTF-8 check, encode, atomic write), N = 1 and 2;
3. **tokenizers' own pipeline** - the Rust library with its ByteLevel pre-tokenizer, in this
   process, one thread, against ours in this process on the same lines: why its pre-tokenizer is
   not used (same ids, slower here).

Each command is a subprocess timed by wall clock, minus its start-up (the same command on a
one-line file: fairseq's script imports torch). Repeats alternate the commands (f1 o1 f2 o2 ...)
and the median is kept. The outputs must be byte-identical to fairseq's, else the run fails.

Text: ``--articles`` made-up articles in wikitext-103-raw's layout (``demo.wikitext_layout`` over
Python's docstring sentences): headings, paragraphs, blank lines. Its vocabulary is smaller than
wikitext's, so both encoders' word caches hit more often than on the real corpus; a miss costs
fairseq a Python BPE and us a Rust one, so the real ratio is likely higher (not measured here).

Figures (keys of the JSON):
- ``speedup_1_worker`` / ``speedup_2_workers``: lines/s ours / fairseq, same workers;
- ``scaling_2_over_1``: ours with 2 workers / 1 (2 shared cores here, the reader is a third
  process), and the same for fairseq;
- ``tokenizers_pipeline_over_ours``: lines/s of tokenizers' own pipeline / ours, in-process;
- ``wikitext103_hours_1_process`` / ``wikitext103_hours_96_vcpus``: ~543 MB (wikitext-103-raw:
  train ~540 MB, issue 13) over the byte rate of one worker, times 96 for the second: an
  extrapolation assuming linear scaling (optimistic: 96 vCPUs are 48 cores with hyper-threads).
  Neither can beat the one process that reads, hands out and writes for all workers: ours is
  measured alone (``coordinator_mb_per_s``: scan, read, pickle both ways, hash, write; its time
  for wikitext-103 is ``wikitext103_hours_ours_coordinator``); fairseq's is not measured.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.report import fmt, provenance, ratio, run_and_write
from hpc_train import data

WIKITEXT103_BYTES = 543_000_000  # train ~540 MB (issue 13) + valid, test (3,760 + 4,358 lines)
WIKITEXT103_LINES = 1_801_350 + 3_760 + 4_358
TARGET_VCPUS = 96
WORKERS = (1, 2)
# How the wikitext103_hours_* figures are extrapolated from the measured rates.
EXTRAPOLATION = {
    "bytes": WIKITEXT103_BYTES,
    "lines": WIKITEXT103_LINES,
    "vcpus": TARGET_VCPUS,
    "per_worker_rate_from": "1 worker",
    "assumes": "linear scaling in workers (optimistic); ours can be no faster than its "
    "coordinating process (wikitext103_hours_ours_coordinator); fairseq's reader is "
    "not measured",
}
SMOKE = {"articles": 40, "repeats": 1, "inprocess_lines": 500}  # --smoke: the same, on ~70 kB


class BenchError(RuntimeError):
    """The benchmark could not measure what it set out to."""


# --- pure arithmetic ---------------------------------------------------------------------------


def steady_seconds(wall: Sequence[float], startup: Sequence[float]) -> float:
    """Median wall time less the median start-up: the time the work itself took."""
    return max(1e-9, statistics.median(wall) - statistics.median(startup))


def per_second(amount: float, seconds: float) -> float:
    return amount / seconds


def hours_for(total_bytes: float, per_worker: float, workers: int) -> float:
    """Hours to encode ``total_bytes`` with ``workers`` processes of ``per_worker`` bytes/s each,
    scaling linearly."""
    return total_bytes / (per_worker * workers) / 3600


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rates, hours = result["lines_per_s"], result["wikitext103_hours_96_vcpus"]
    single = result["wikitext103_hours_1_process"]
    rows = []
    for n in WORKERS:
        rows += [
            (f"lines/s, fairseq script, {n} worker(s)", fmt(rates[f"fairseq_{n}"], ".0f"), ""),
            (f"lines/s, this pipeline, {n} worker(s)", fmt(rates[f"ours_{n}"], ".0f"), ""),
        ]
    rows += [
        ("speedup ours / fairseq, 1 worker", fmt(result["speedup_1_worker"]), "> 1"),
        ("speedup ours / fairseq, 2 workers", fmt(result["speedup_2_workers"]), "> 1"),
        ("scaling 2 / 1 workers, ours (2 shared cores)", fmt(result["scaling_2_over_1"]["ours"]), ""),
        ("scaling 2 / 1 workers, fairseq", fmt(result["scaling_2_over_1"]["fairseq"]), ""),
        ("tokenizers' own pipeline / ours, in-process", fmt(result["tokenizers_pipeline_over_ours"]), ""),
        ("ours' coordinating process alone (MB/s)", fmt(result["coordinator_mb_per_s"]), ""),
        ("wikitext-103, 1 process, fairseq (min, extrapolated)", minutes(single["fairseq"]), ""),
        ("wikitext-103, 1 process, ours (min, extrapolated)", minutes(single["ours"]), ""),
        ("wikitext-103, 96 vCPUs, fairseq (s, linear)", seconds(hours["fairseq"]), ""),
        ("wikitext-103, 96 vCPUs, ours (s, linear)", seconds(hours["ours"]), ""),
        ("  ours' coordinating process alone needs (s)",
         seconds(result["wikitext103_hours_ours_coordinator"]), ""),
    ]  # fmt: skip
    return rows


def minutes(hours: float | None) -> str:
    return fmt(None if hours is None else hours * 60, ".1f")


def seconds(hours: float | None) -> str:
    return fmt(None if hours is None else hours * 3600, ".1f")


# --- measuring ---------------------------------------------------------------------------------


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fairseq_script() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("fairseq")
    if spec is None or spec.origin is None:
        raise BenchError("fairseq is not installed")
    script = Path(spec.origin).parent / "examples" / "roberta" / "multiprocessing_bpe_encoder.py"
    if not script.is_file():
        raise BenchError(f"{script}: fairseq's multiprocessing_bpe_encoder.py is missing")
    return script


def commands(src: Path, dest: Path) -> dict[str, list[str]]:
    """The timed commands by name (``fairseq_1``, ``ours_2``, ...): ``src`` → ``dest``."""
    files = data.gpt2_bpe_files()
    script = fairseq_script()
    out: dict[str, list[str]] = {}
    for n in WORKERS:
        out[f"fairseq_{n}"] = [
            sys.executable, str(script), "--encoder-json", str(files["encoder.json"]),
            "--vocab-bpe", str(files["vocab.bpe"]), "--inputs", str(src),
            "--outputs", str(dest), "--keep-empty", "--workers", str(n),
        ]  # fmt: skip
        out[f"ours_{n}"] = [
            sys.executable, "-m", "hpc_train.data", "bpe", "--input", str(src),
            "--output", str(dest), "--workers", str(n),
        ]  # fmt: skip
    return out


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BenchError(f"{cmd[1]} … failed: {tail}")
    return wall


def with_input(cmd: list[str], src: Path, dest: Path, tiny: Path, tiny_out: Path) -> list[str]:
    """The same command on another input and output (to time its start-up)."""
    swap = {str(src): str(tiny), str(dest): str(tiny_out)}
    return [swap.get(arg, arg) for arg in cmd]


def in_process(lines: list[str], repeats: int) -> dict[str, Any]:
    """tokenizers' own pipeline vs ours on the same lines, this process, one thread each; both
    built afresh each time (cold caches, loading included)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer, models, pre_tokenizers

    files = data.gpt2_bpe_files()

    def theirs() -> str:
        own = Tokenizer(models.BPE.from_file(str(files["encoder.json"]), str(files["vocab.bpe"])))
        own.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        encoded = own.encode_batch_fast([line.strip() for line in lines], add_special_tokens=False)
        return "".join(" ".join(map(str, e.ids)) + "\n" for e in encoded)

    def ours() -> str:
        return data.Gpt2Bpe(files).encode_lines(lines).text

    times: dict[str, list[float]] = {"tokenizers": [], "ours": []}
    outputs = {}
    for _ in range(repeats):
        for name, fn in (("tokenizers", theirs), ("ours", ours)):
            started = time.perf_counter()
            outputs[name] = fn()
            times[name].append(time.perf_counter() - started)
    if outputs["tokenizers"] != outputs["ours"]:
        raise BenchError("tokenizers' own pipeline gave other ids than ours")
    return {name: round(statistics.median(t), 4) for name, t in times.items()}


def serial_stage(src: Path, encoded: bytes, chunk_lines: int, dest: Path) -> float:
    """Seconds the coordinating process of a parallel run needs without any encoding: scan the
    file (sha256, UTF-8), read it in chunks, pickle each chunk and its result both ways (the
    pipes to and from a worker), write and hash the result. Its byte rate bounds any worker
    count from above."""
    import hashlib
    import pickle

    from hpc_train.data import bpe, sources

    results = [
        "".join(part)
        for part in sources.chunks(encoded.decode("ascii").splitlines(keepends=True), chunk_lines)
    ]
    started = time.perf_counter()
    split = sources.Source("file", src, {"all": (sources.TextFile(src),)}).splits()["all"]
    digest = hashlib.sha256()
    with dest.open("wb") as fh:
        for chunk, text in zip(sources.chunks(split.read(), chunk_lines), results, strict=True):
            pickle.loads(pickle.dumps(chunk))
            back = pickle.loads(pickle.dumps(bpe.Encoded(text, len(chunk), 0)))
            block = back.text.encode("ascii")
            digest.update(block)
            fh.write(block)
    return time.perf_counter() - started


def timed_repeats(
    cmds: dict[str, list[str]], repeats: int, files: tuple[Path, Path], tiny: tuple[Path, Path]
) -> tuple[dict[str, list[float]], dict[str, list[float]], bytes | None]:
    """Each command `repeats` times, in turn: its start-up (on the one-line `tiny` input) and its
    wall time on `files` (source, destination); every output must equal the first one.
    Returns the wall and start-up seconds per command, and that first output."""
    src, dest = files
    wall: dict[str, list[float]] = {name: [] for name in cmds}
    startup: dict[str, list[float]] = {name: [] for name in cmds}
    reference: bytes | None = None
    for repeat in range(repeats):
        for name, cmd in cmds.items():
            startup[name].append(timed(with_input(cmd, src, dest, *tiny)))
            wall[name].append(timed(cmd))
            output = dest.read_bytes()
            reference = reference if reference is not None else output
            if output != reference:
                raise BenchError(f"{name}: output differs from fairseq_1's")
            say(f"repeat {repeat + 1}/{repeats} {name}: {wall[name][-1]:.2f} s "
                f"(start-up {startup[name][-1]:.2f} s)")  # fmt: skip
    return wall, startup, reference


def wikitext103_hours(bytes_per_s: dict[str, float], ceiling: float) -> dict[str, Any]:
    """WikiText-103's encoding time extrapolated from the 1-worker rates: on TARGET_VCPUS
    workers, on one process, and the coordinating process's floor (`ceiling`, bytes/s)."""
    return {
        "wikitext103_hours_96_vcpus": {
            name: hours_for(WIKITEXT103_BYTES, bytes_per_s[f"{name}_1"], TARGET_VCPUS)
            for name in ("ours", "fairseq")
        },
        # the one process that reads, hands out and writes for all workers, alone: a floor
        "wikitext103_hours_ours_coordinator": hours_for(WIKITEXT103_BYTES, ceiling, 1),
        "wikitext103_hours_1_process": {
            name: hours_for(WIKITEXT103_BYTES, bytes_per_s[f"{name}_1"], 1)
            for name in ("ours", "fairseq")
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    started, load_before = time.time(), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-data-", dir=args.work_dir))
    src, dest = work / "wiki.train.raw", work / "out.bpe"
    text = data.wikitext_layout(data.demo_corpus(100_000), args.articles, seed=1)
    src.write_text(text, encoding="utf-8")
    n_lines, n_bytes = text.count("\n"), src.stat().st_size
    tiny, tiny_out = work / "one-line.raw", work / "one-line.bpe"
    tiny.write_text(" = Start up = \n", encoding="utf-8")
    say(f"text: {n_lines:,} lines, {n_bytes / 1e6:.1f} MB in {work}")
    cmds = commands(src, dest)
    wall, startup, reference = timed_repeats(cmds, args.repeats, (src, dest), (tiny, tiny_out))
    seconds = {name: steady_seconds(wall[name], startup[name]) for name in cmds}
    lines_per_s = {name: per_second(n_lines, s) for name, s in seconds.items()}
    bytes_per_s = {name: per_second(n_bytes, s) for name, s in seconds.items()}
    say("in-process: tokenizers' own pipeline vs ours; the coordinating process alone")
    inproc = in_process(text.splitlines(keepends=True)[: args.inprocess_lines], args.repeats)
    from hpc_train.data.pipeline import CHUNK_LINES

    serial = statistics.median(
        serial_stage(src, reference or b"", CHUNK_LINES, dest) for _ in range(args.repeats)
    )
    ceiling = per_second(n_bytes, serial)
    result = {
        "speedup_1_worker": ratio(lines_per_s["ours_1"], lines_per_s["fairseq_1"]),
        "speedup_2_workers": ratio(lines_per_s["ours_2"], lines_per_s["fairseq_2"]),
        "scaling_2_over_1": {
            "ours": ratio(lines_per_s["ours_2"], lines_per_s["ours_1"]),
            "fairseq": ratio(lines_per_s["fairseq_2"], lines_per_s["fairseq_1"]),
        },
        "tokenizers_pipeline_over_ours": ratio(inproc["ours"], inproc["tokenizers"]),  # speed
        **wikitext103_hours(bytes_per_s, ceiling),
        "coordinator_mb_per_s": round(ceiling / 1e6, 2),
        "lines_per_s": {k: round(v, 1) for k, v in lines_per_s.items()},
        "mb_per_s": {k: round(v / 1e6, 3) for k, v in bytes_per_s.items()},
        "seconds": {
            "wall": wall,
            "startup": startup,
            "steady_median": seconds,
            "in_process_median": inproc,
            "coordinator_median": serial,
        },
        "outputs_identical": True,
        "text": {
            "lines": n_lines,
            "bytes": n_bytes,
            "articles": args.articles,
            "layout": "wikitext-103-raw (demo.wikitext_layout of stdlib docstrings)",
            "in_process_lines": min(n_lines, args.inprocess_lines),
        },
        "extrapolation": dict(EXTRAPOLATION),
        "settings": {"repeats": args.repeats, "workers": list(WORKERS)},
        **provenance(started, load_before, machine()),
    }
    shutil.rmtree(work)
    return result


def machine() -> dict[str, Any]:
    from importlib import metadata

    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        **{d: metadata.version(d) for d in ("tokenizers", "regex", "fairseq-fixed")},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.data", description=__doc__)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/data.json"))
    p.add_argument("--articles", type=int, default=12000, help="made-up articles (~1.7 kB each)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--inprocess-lines", type=int, default=60000)
    p.add_argument("--work-dir", type=Path, default=Path(".local/bench"))
    args = report.parse(p, argv, "data", SMOKE)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    errors = (BenchError, data.DataError)
    result = run_and_write("bench-data", args.out, lambda: run(args), summary_rows, errors)
    return 0 if result is not None else 1


if __name__ == "__main__":
    sys.exit(main())
