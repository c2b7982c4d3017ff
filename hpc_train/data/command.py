"""Prepare a binarized masked-LM corpus: raw text -> GPT-2 BPE -> fairseq-preprocess.

    python -m hpc_train.data demo --out .local/data/demo-bin
    python -m hpc_train.data text --raw wikitext-103-raw-v1.zip --sha256 --out /lustre/data-bin/wikitext-103
    python -m hpc_train.data text --raw wikitext-103-raw --srcdict gpt2_bpe/dict.txt --out /lustre/data-bin/wt103
    python -m hpc_train.data text --raw /lustre/books --ratios 0.98,0.01,0.01 --out /lustre/data-bin/books --submit --follow
    python -m hpc_train.data bpe --input wiki.valid.raw --output valid.bpe --workers 4

Sources (``--raw``): the wikitext-103-raw zip itself (read in place; ``--sha256`` checks it
against the published sha256, ``--sha256 HEX`` against yours), its extracted directory
(wiki.{train,valid,test}.raw), or any directory of .txt files cut into train/valid/test by
``--ratios`` (by lines, in sorted file order). GPT-2 BPE gives exactly fairseq's ids; ``--workers``
processes encode in order-preserving chunks. Each finished step is recorded in manifest.json: a
rerun (after a kill, say) skips what it proves done; a corpus already prepared from the same
input is left alone. ``<out>`` appears only when complete.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from hpc_core import slurm
from hpc_train import cli
from hpc_train.data import demo, dictionary, job, manifest, pipeline, sources
from hpc_train.data.base import DataError, log
from hpc_train.data.bpe import available_cores, default_workers, gpt2_bpe_files

PROG = "python -m hpc_train.data"
DEMO_LINES = 6000


def prepare_demo(
    out: Path, lines: int = DEMO_LINES, options: pipeline.Options | None = None
) -> Path:
    """The offline demo corpus: stdlib docstring sentences, 5% (at least 100) for valid."""
    sentences = demo.demo_corpus(lines)
    if len(sentences) < 200:
        raise DataError(f"only {len(sentences)} sentences found in the standard library")
    n_valid = max(100, len(sentences) // 20)
    splits = {"train": sentences[n_valid:], "valid": sentences[:n_valid]}
    return pipeline.prepare_lines(splits, out, options or pipeline.Options(), kind="demo")


def prepare_text(
    raw: Path,
    out: Path,
    options: pipeline.Options | None = None,
    ratios: tuple[float, float, float] | None = None,
    sha256: str | None = None,
) -> Path:
    source = sources.find(raw, ratios, sha256)
    return pipeline.prepare(source, out, options or pipeline.Options())


def encode_file(src: Path, dest: Path, workers: int) -> int:
    """The BPE step alone, one file (like fairseq's multiprocessing_bpe_encoder.py --keep-empty).
    The number of lines."""
    split = sources.Source("file", src, {src.name: (sources.TextFile(src),)}).splits()[src.name]
    pipeline.encode_split(split, dest, gpt2_bpe_files(), pipeline.Options(workers))
    return split.lines


# --- the command line ---------------------------------------------------------------------------


def _ratios(text: str) -> tuple[float, float, float]:
    try:
        return sources.parse_ratios(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog=PROG,
        description=__doc__.split("\n\n")[0] + "\n\n" + "\n\n".join(__doc__.split("\n\n")[2:]),
        epilog=cli.examples(__doc__, PROG),
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=cli.Parser)
    workers = (
        f"processes for BPE and fairseq-preprocess (default: the cores available, Slurm's "
        f"allocation inside a job: {default_workers(os.environ, available_cores())} here)"
    )

    def add(name: str, summary: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=summary, description=summary, epilog=cli.examples(__doc__, f"{PROG} {name}")
        )

    demo_p = add("demo", "small offline corpus from Python's stdlib docstrings")
    demo_p.add_argument("--lines", type=int, default=DEMO_LINES, help="sentences")
    text_p = add("text", "wikitext-103-raw (zip or directory) or .txt files -> binarized corpus")
    text_p.add_argument("--raw", type=Path, required=True, help="zip, directory of wiki.*.raw, "
                        "or directory of .txt files")  # fmt: skip
    text_p.add_argument(
        "--sha256", nargs="?", const=sources.PUBLISHED, metavar="HEX",
        help="check the zip's sha256: the published one (no value) or HEX",
    )  # fmt: skip
    text_p.add_argument("--ratios", type=_ratios, metavar="TRAIN,VALID,TEST",
                        help="shares of the lines of a .txt directory (default: 0.9,0.05,0.05)")  # fmt: skip
    text_p.add_argument("--srcdict", type=Path, metavar="DICT",
                        help="use this fairseq dictionary (e.g. GPT-2's dict.txt) instead of "
                        "building one from train")  # fmt: skip
    for p in (demo_p, text_p):
        p.add_argument("--out", type=Path, required=True, help="output directory (the corpus)")
        p.add_argument("--workers", type=int, help=workers)
        p.add_argument("--force", action="store_true", help="redo every step, replace --out")
        p.add_argument("--dry-run", action="store_true", help="print the plan, do nothing")
        p.add_argument("--submit", action="store_true",
                       help="run this as a one-node exclusive Slurm job")  # fmt: skip
        p.add_argument("--partition", help="with --submit: the partition (default: Slurm's)")
        p.add_argument("--time", type=int, metavar="MIN", help="with --submit: time limit, minutes")
        p.add_argument("--follow", action="store_true",
                       help="with --submit: show the job's progress until it ends")  # fmt: skip
    bpe_p = add("bpe", "GPT-2 BPE of one text file (fairseq's ids), no binarizing")
    bpe_p.add_argument("--input", type=Path, required=True, help="UTF-8 text")
    bpe_p.add_argument("--output", type=Path, required=True, help="ids, one line per line")
    bpe_p.add_argument("--workers", type=int, help=workers)
    return parser


def plan_lines(args: argparse.Namespace, source: sources.Source | None, workers: int) -> list[str]:
    """What a run would do (``--dry-run``)."""
    out = args.out.absolute()
    lines = []
    if source is not None:
        lines.append(f"source: {source.kind} {source.path}")
        for split, files in source.files.items():
            for f in files:
                lines.append(f"  {split}: {f.name} ({f.size():,} bytes)")
        if source.ratios:
            lines.append(f"  cut by lines into train/valid/test {source.ratios}")
    else:
        lines.append(f"source: {args.lines} stdlib docstring sentences (demo)")
    staged = manifest.load(pipeline.staging_dir(out) / manifest.NAME)
    done = sorted((staged or {}).get("splits", {}))
    lines += [
        f"staging: {pipeline.staging_dir(out)} (BPE recorded for: {', '.join(done) or 'none'})",
        f"BPE with {workers} worker(s), fairseq-preprocess --workers {workers}"
        + (
            f" --srcdict {args.srcdict}"
            if getattr(args, "srcdict", None)
            else " (dictionary from train)"
        ),
        f"then manifest.json, and the corpus renamed to {out}",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    workers = args.workers or default_workers(os.environ, available_cores())
    if workers < 1:
        parser.error("--workers must be at least 1")
    try:
        if args.cmd == "bpe":
            encode_file(args.input, args.output, workers)
            return 0
        if not args.submit and (args.follow or args.partition or args.time):
            parser.error("--follow, --partition and --time go with --submit")
        source = None
        if args.cmd == "text":
            source = sources.find(args.raw, args.ratios, args.sha256)
            if args.dry_run or args.submit:
                source.sniff()
                if args.srcdict:
                    dictionary.check_srcdict(args.srcdict)
        if args.submit:
            return submit(args, argv)
        if args.dry_run:
            print("\n".join(plan_lines(args, source, workers)))
            return 0
        options = pipeline.Options(workers, getattr(args, "srcdict", None), args.force)
        if source is None:
            prepare_demo(args.out, args.lines, options)
        else:
            pipeline.prepare(source, args.out, options)
    except (DataError, slurm.SlurmError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)  # one line, as cli.Parser says usage errors
        return 2
    except KeyboardInterrupt:
        log("interrupted: rerun the same command to resume")
        return 130
    return 0


def submit(args: argparse.Namespace, argv: list[str]) -> int:
    command = job.command(argv)
    sbatch = job.sbatch_args(args.out, command, args.partition, args.time)
    if args.dry_run:
        print("sbatch " + shlex.join(sbatch))
        return 0
    slurm.ensure_reachable()
    job_id = slurm.sbatch(sbatch)
    log_file = str(job.log_pattern(args.out)).replace("%j", job_id)
    print(f"submitted job {job_id}: one exclusive node; log {log_file}")
    if args.follow:
        return job.follow(job_id, args.out.absolute())
    return 0
