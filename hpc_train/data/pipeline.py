"""The steps from raw text to a binarized corpus, each recorded when complete, so a rerun after a
kill resumes where it stopped and ends with the same bytes.

    <out>/                      appears only when complete (renamed from <staging>/bin)
      dict.txt {train,valid,test}.{bin,idx} preprocess.log manifest.json
    .<out>.staging/             beside it, while at work (removed at the end)
      .lock                     one run at a time per --out (flock)
      manifest.json             the steps done so far: each split's BPE file
      {train,valid,test}.bpe    GPT-2 BPE ids, one line per input line (atomic writes)
      bin/                      fairseq-preprocess at work (redone whole if interrupted)

1. check: every source file scanned (sha256, UTF-8, lines), ``--srcdict`` parsed; bad input stops
   here, before anything is written.
2. encode each split (parallel, order-preserving), unless the staging manifest proves it done.
3. binarize with ``fairseq-preprocess --only-source`` (dictionary from train, or ``--srcdict``).
4. write ``manifest.json`` into the result and rename it to ``<out>``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from hpc_core.rundir import atomic_write, atomic_writer, fsync_dir
from hpc_train.data import dictionary, manifest
from hpc_train.data.base import DataError, log
from hpc_train.data.bpe import GPT2_SHA256, encode_chunks, gpt2_bpe_files
from hpc_train.data.progress import Progress
from hpc_train.data.sources import Source, Split, chunks, split_files
from hpc_train.job.spec import is_binarized

CHUNK_LINES = 2000  # lines per task for a worker (wikitext: ~600 kB)
ENCODER = {
    "files": GPT2_SHA256,  # what the ids depend on; the rest describes
    "ids": "fairseq's GPT-2 BPE (gpt2_bpe_utils.Encoder), one line per input line, empty kept",
    "implementation": "fairseq's pre-tokenizer regex, tokenizers' byte-level BPE",
}


@dataclass(frozen=True)
class Options:
    workers: int = 1
    srcdict: Path | None = None
    force: bool = False  # redo every step, replace --out
    chunk_lines: int = CHUNK_LINES


def staging_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.staging"


class Stage:
    """The staging directory, locked for this run; stale partial files from a killed run go.
    It goes at the end, and after a failure too unless it holds recorded steps to resume."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.dir = staging_dir(out)
        self._lock: int | None = None

    def __enter__(self) -> Stage:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise DataError(f"--out {self.out}: cannot write beside it ({err.strerror})") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise DataError(f"another run is preparing {self.out} right now") from None
        except OSError:
            pass  # a file system without flock: one run at a time is then up to the user
        for stale in self.dir.glob(".*.tmp"):  # atomic writes a killed run left half-done
            stale.unlink(missing_ok=True)
        shutil.rmtree(self.dir / "bin", ignore_errors=True)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._lock is not None:
            os.close(self._lock)
        if kind is None or not self.manifest.exists():  # done, or nothing worth resuming
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def manifest(self) -> Path:
        return self.dir / manifest.NAME


def request(splits: Mapping[str, Split], srcdict: Path | None) -> dict[str, Any]:
    """The manifest's inputs for this run: what any existing output must have been made from."""
    dictionary_info: dict[str, Any] = {"from": "train split"}
    if srcdict is not None:
        symbols = dictionary.check_srcdict(srcdict)
        record = manifest.file_record(srcdict) | {"file": str(srcdict), "symbols": symbols}
        dictionary_info = {"from": "--srcdict", "srcdict": record}
    return {
        "encoder": ENCODER,
        "dictionary": dictionary_info,
        "splits": {name: {"source": split.identity()} for name, split in splits.items()},
    }


def workers_for(lines: int, options: Options) -> int:
    """No more workers than chunks: a small split is encoded here, without starting a pool."""
    return max(1, min(options.workers, -(-lines // options.chunk_lines)))


def encode_split(
    split: Split, dest: Path, files: Mapping[str, Path], options: Options
) -> dict[str, Any]:
    """Write ``dest`` (atomically): one line of ids per line of the split. The manifest record."""
    progress = Progress(f"{split.name} BPE", split.lines)
    digest, lines, tokens = hashlib.sha256(), 0, 0
    with atomic_writer(dest, "wb") as fh:
        for encoded in encode_chunks(
            chunks(split.read(), options.chunk_lines), files, options.workers
        ):
            data = encoded.text.encode("ascii")
            fh.write(data)
            digest.update(data)
            lines += encoded.lines
            tokens += encoded.tokens
            progress.advance(encoded.lines)
        progress.finish()
        if tokens == 0:
            raise DataError(f"the {split.name} split has no text (only blank lines)")
        if lines != split.lines:
            raise RuntimeError(f"{split.name}: read {lines} lines, the scan counted {split.lines}")
    bpe = {"file": dest.name, "sha256": digest.hexdigest(), "size": dest.stat().st_size}
    return {"source": split.identity(), "lines": lines, "tokens": tokens, "bpe": bpe}


def binarize(
    stage: Path, splits: Sequence[str], srcdict: Path | None, workers: int
) -> dict[str, dictionary.Summary]:
    """fairseq-preprocess --only-source into ``stage/bin``; its per-split summaries."""
    dest = stage / "bin"
    cmd = [
        sys.executable, "-m", "fairseq_cli.preprocess", "--only-source",
        "--destdir", str(dest), "--workers", str(workers),
    ]  # fmt: skip
    for split in splits:
        cmd += [f"--{split}pref", str(stage / f"{split}.bpe")]
    if srcdict is not None:
        cmd += ["--srcdict", str(srcdict)]
    log(f"binarizing with fairseq-preprocess ({workers} workers)")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise DataError(f"fairseq-preprocess failed: {tail}")
    return dictionary.summaries(proc.stdout + proc.stderr)


def already_prepared(out: Path, wanted: Mapping[str, Any], force: bool) -> bool:
    """True when ``out`` is the corpus ``wanted`` describes; DataError when it is another."""
    if not out.exists() or force:
        return False
    found = manifest.load(out / manifest.NAME)
    if found is None:
        if is_binarized(out):
            log(f"{out} is already a binarized corpus, without manifest.json (--force rebuilds)")
            return True
        raise DataError(f"--out {out} exists and is not a corpus (remove it or use --force)")
    if manifest.same_request(found, wanted) and manifest.corpus_intact(found, out):
        log(f"{out} is already prepared from this input (manifest.json; --force rebuilds)")
        return True
    raise DataError(
        f"--out {out} holds a corpus from other input or damaged (see its manifest.json); "
        "--force replaces it"
    )


def publish(built: Path, out: Path) -> None:
    """Rename the complete corpus to ``out`` (an existing one is replaced only then)."""
    aside = out.parent / f".{out.name}.replaced-{os.getpid()}"
    if out.exists():
        os.replace(out, aside)
    os.replace(built, out)
    fsync_dir(out.parent)
    shutil.rmtree(aside, ignore_errors=True)


def prepare(source: Source, out: Path, options: Options = Options()) -> Path:
    """Encode and binarize ``source`` into ``out``; resumable, idempotent (module docstring)."""
    out = out.absolute()
    files = gpt2_bpe_files()
    splits = source.splits()  # reads every file: bad input stops here
    if "train" not in splits or "valid" not in splits:
        raise DataError(f"{source.path}: a train and a valid split are needed")
    wanted = request(splits, options.srcdict)
    with Stage(out) as stage:
        if already_prepared(out, wanted, options.force):
            return out
        done = {} if options.force else manifest.load(stage.manifest) or {}
        record = {"format": manifest.FORMAT, "source": source.describe(), **wanted, "splits": {}}
        for name, split in splits.items():
            previous = manifest.encoded_split(done, name, split.identity(), ENCODER["files"])
            if previous is not None and manifest.intact(previous["bpe"], stage.dir):
                log(f"{name}: BPE done before ({previous['lines']:,} lines; manifest.json)")
                record["splits"][name] = dict(previous, source=split.identity())
            else:
                dest = stage.dir / f"{name}.bpe"
                record["splits"][name] = encode_split(split, dest, files, options)
            manifest.save(stage.manifest, record)
        summaries = binarize(stage.dir, list(splits), options.srcdict, options.workers)
        record = finish_record(record, stage.dir / "bin", summaries, options.srcdict)
        manifest.save(stage.dir / "bin" / manifest.NAME, record)
        publish(stage.dir / "bin", out)
    log(f"binarized corpus ready in {out}")
    return out


def finish_record(
    record: dict[str, Any],
    built: Path,
    summaries: Mapping[str, dictionary.Summary],
    srcdict: Path | None,
) -> dict[str, Any]:
    """The staging manifest plus the binarized files; DataError when --srcdict does not fit."""
    for name, split in record["splits"].items():
        summary = summaries.get(f"{name}.bpe")
        if srcdict is not None and summary is not None and summary.replaced_percent > 0:
            raise DataError(
                f"--srcdict {srcdict} lacks {summary.replaced_percent:.3g}% of the {name} "
                "tokens (replaced by <unk>): it does not fit this BPE"
            )
        files = [manifest.file_record(built / f"{name}.{ext}") for ext in ("bin", "idx")]
        split["binarized"] = {"files": files}
        if summary is not None:
            split["binarized"].update(
                sentences=summary.sentences,
                tokens=summary.tokens,
                unknown_percent=summary.replaced_percent,
            )
    dict_txt = built / "dict.txt"
    record["dictionary"] = dict(
        record["dictionary"],
        **{"dict.txt": manifest.file_record(dict_txt) | {"symbols": dictionary.symbols(dict_txt)}},
    )
    record["tools"] = manifest.tools()
    return record


def prepare_lines(
    splits: Mapping[str, Sequence[str]],
    out: Path,
    options: Options = Options(),
    kind: str = "lines",
) -> Path:
    """Prepare text held in memory (one string per line): written beside ``out`` first."""
    text_dir = staging_dir(out.absolute()) / "text"
    for name, lines in splits.items():
        atomic_write(text_dir / f"{name}.txt", "".join(f"{line}\n" for line in lines))
    source = split_files(kind, text_dir, {name: f"{name}.txt" for name in splits})
    return prepare(source, out, options)
