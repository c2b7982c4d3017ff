"""Data preparation: raw text -> GPT-2 BPE (fairseq's ids) -> fairseq-binarized masked-LM corpus.

    python -m hpc_train.data demo --out DIR                       # offline demo corpus
    python -m hpc_train.data text --raw wikitext-103-raw-v1.zip --out DIR [--submit --follow]

Modules: ``sources`` (zip, directories, checks), ``bpe`` (the encoder, parallel), ``pipeline``
(resumable steps), ``manifest`` (what proves a step done), ``dictionary`` (``--srcdict``),
``progress``, ``job`` (as a Slurm job), ``demo`` (offline text), ``command`` (the CLI), ``base``
(the error users see, the log line, the splits).
"""

from hpc_core.rundir import file_sha256 as sha256
from hpc_train.data.base import SPLITS, DataError
from hpc_train.data.bpe import GPT2_SHA256, Gpt2Bpe, gpt2_bpe_files
from hpc_train.data.command import encode_file, main, prepare_demo, prepare_text
from hpc_train.data.demo import demo_corpus, wikitext_layout
from hpc_train.data.pipeline import Options, prepare, prepare_lines

__all__ = [
    "GPT2_SHA256",
    "SPLITS",
    "DataError",
    "Gpt2Bpe",
    "Options",
    "demo_corpus",
    "encode_file",
    "gpt2_bpe_files",
    "main",
    "prepare",
    "prepare_demo",
    "prepare_lines",
    "prepare_text",
    "sha256",
    "wikitext_layout",
]
