"""GPT-2 BPE: the same ids as fairseq's encoder, in order whatever the number of workers."""

# ruff: noqa: RUF001  (look-alike characters are the point of the tricky text)

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from hpc_train import data
from hpc_train.data import bpe


@pytest.fixture(scope="module")
def files():
    return data.gpt2_bpe_files()


@pytest.fixture(scope="module")
def fairseq_encoder(files):
    """fairseq's own GPT-2 encoder module, loaded from its file: the fairseq package would
    import torch (seconds) for nothing the encoder uses."""
    package = importlib.util.find_spec("fairseq")
    assert package is not None and package.origin is not None
    path = Path(package.origin).parent / "data" / "encoders" / "gpt2_bpe_utils.py"
    spec = importlib.util.spec_from_file_location("fairseq_gpt2_bpe_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_encoder(str(files["encoder.json"]), str(files["vocab.bpe"]))


@pytest.fixture(scope="module")
def ours(files):
    return bpe.Gpt2Bpe(files)


def fairseq_lines(encoder, lines):
    """What fairseq's multiprocessing_bpe_encoder.py --keep-empty writes for these lines."""
    return "".join(" ".join(map(str, encoder.encode(line.strip()))) + "\n" for line in lines)


WHITESPACE = [chr(c) for c in (0x9, 0xB, 0xC, 0x1C, 0x1F, 0x20, 0x85, 0xA0, 0x1680, 0x2000,
                               0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)]  # fmt: skip
TRICKY = [
    "",
    "   ",
    " = Valkyria Chronicles III = ",
    " = = Gameplay = = ",
    "The game 's 1 @,@ 000 units ( 2 @.@ 5 % ) sold ; it 's \" good \" .",
    "Café naïve façade Ærø Straße İstanbul ΣΊΣΥΦΟΣ ﬁne ℌ",
    "日本語のテキスト、中文文本。한국어 텍스트 ไทย العربية עברית हिन्दी",
    "emoji 😀👍🏽 👨‍👩‍👧 flags 🇫🇷 math 𝔘𝔫𝔦 ①②③ ⅫⅣ ١٢٣ ¾",
    "combining e\u0301 a\u0308 zero\u200bwidth joiner\u200d bidi \u202ex\u202c bom \ufeff",
    "whitespace runs:\t\t  \u00a0\u00a0 x\u3000\u3000y  \x0b\x0c z",
    "contractions don't I'm we'll they've you're she'd IT'S O'Neil rock'n'roll '' 'ss",
    "control \x01\x02\x7f chars \x1b[0m and a lone surrogate-free \ufffd replacement",
    "digits 3.14159 1,000,000 0x1F 1e-9 ½ and punctuation !!! ??? ... --- ___ ***",
    "x" * 5000,
    " ".join(["antidisestablishmentarianism"] * 400),
    "".join(chr(c) for c in range(0x20, 0x250)),
]


def test_the_pre_tokenizer_is_fairseqs_verbatim(fairseq_encoder):
    assert fairseq_encoder.pat.pattern == bpe.PRETOKENIZE


def test_tricky_lines_give_fairseqs_ids(ours, fairseq_encoder):
    for line in TRICKY:
        assert ours.ids(line) == fairseq_encoder.encode(line.strip()), repr(line[:60])
    assert ours.encode_lines(TRICKY).text == fairseq_lines(fairseq_encoder, TRICKY)


def test_whitespace_pairs_and_random_mixtures_give_fairseqs_ids(ours, fairseq_encoder):
    """Runs of every kind of whitespace around words (where regex engines disagree most), and
    random strings over letters, digits, apostrophes, unicode and whitespace."""
    lines = [f"a{x}{y}b{x}" for x in WHITESPACE for y in WHITESPACE]
    rnd = random.Random(13)
    alphabet = [*"aZé日'sltvmd 09!?.,-@ ’😀ßİ١Ⅻ\u0301\x00\x7f", *WHITESPACE]
    lines += ["".join(rnd.choices(alphabet, k=rnd.randint(0, 30))) for _ in range(3000)]
    assert ours.encode_lines(lines).text == fairseq_lines(fairseq_encoder, lines)


def test_a_sample_of_all_code_points_gives_fairseqs_ids(ours, fairseq_encoder):
    """Every 31st code point (all of them were checked once: ~1.1 M, 47 s; identical), each
    alone, after a letter and after a digit."""
    chars = [chr(c) for c in range(0, 0x110000, 31) if not 0xD800 <= c <= 0xDFFF]
    lines = [f"{c} a{c}1{c}{c} " for c in chars]
    assert ours.encode_lines(lines).text == fairseq_lines(fairseq_encoder, lines)


@pytest.mark.slow  # the whole corpus through both encoders: ~2 s; a sample stays fast
def test_the_whole_demo_corpus_gives_fairseqs_ids(ours, fairseq_encoder):
    lines = data.demo_corpus(data.command.DEMO_LINES)
    assert ours.encode_lines(lines).text == fairseq_lines(fairseq_encoder, lines)


def test_a_wikitext_layout_corpus_gives_fairseqs_ids_and_counts(ours, fairseq_encoder):
    text = data.wikitext_layout(data.demo_corpus(3000), articles=40, seed=5)
    lines = text.splitlines(keepends=True)
    encoded = ours.encode_lines(lines)
    expected = fairseq_lines(fairseq_encoder, lines)
    assert encoded.text == expected
    assert encoded.lines == len(lines) == expected.count("\n")
    assert encoded.tokens == len(expected.split())


def test_chunks_come_back_in_order_with_two_workers(files):
    lines = [f"line {i} " + "word " * (i % 7) for i in range(900)]
    chunks = [lines[i : i + 7] for i in range(0, len(lines), 7)]
    serial = [e.text for e in bpe.encode_chunks(chunks, files, workers=1)]
    parallel = [e.text for e in bpe.encode_chunks(chunks, files, workers=2)]
    assert parallel == serial
    assert "".join(serial).count("\n") == len(lines)


def test_the_cache_starting_over_changes_nothing(files, fairseq_encoder, monkeypatch):
    monkeypatch.setattr(bpe, "CACHE_WORDS", 5)
    small = bpe.Gpt2Bpe(files)
    lines = TRICKY[2:8] * 3
    assert small.encode_lines(lines).text == fairseq_lines(fairseq_encoder, lines)


@pytest.mark.parametrize(
    ("environ", "cores", "expected"),
    [
        ({}, 8, 8),
        ({"SLURM_CPUS_ON_NODE": "4"}, 8, 8),  # not inside a job: ignored
        ({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "4"}, 8, 4),
        ({"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "3", "SLURM_CPUS_ON_NODE": "96"}, 96, 3),
        ({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "96"}, 16, 16),  # affinity is smaller
        ({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "x"}, 2, 2),
        ({}, 0, 1),
    ],
)
def test_default_workers(environ, cores, expected):
    assert bpe.default_workers(environ, cores) == expected


def test_tampered_bpe_file_is_refused(monkeypatch):
    monkeypatch.setitem(bpe.GPT2_SHA256, "encoder.json", "0" * 64)
    with pytest.raises(data.DataError, match="sha256"):
        data.gpt2_bpe_files()
