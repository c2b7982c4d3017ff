"""The data pipeline end to end: real fairseq-preprocess on small made-up text in wikitext-103-raw's
layout (never downloaded), resumable steps, the manifest, one-line refusals."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hpc_core.wait import Backoff, wait_until
from hpc_train import data
from hpc_train.data import pipeline
from hpc_train.job.spec import is_binarized

CORPUS_FILES = ("dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx", "test.bin",
                "test.idx")  # fmt: skip


def write_wikitext(root: Path, articles: int = 1500) -> Path:
    sentences = data.demo_corpus(4000)
    raw = root / "wikitext-103-raw"
    raw.mkdir(parents=True)
    for split, n, seed in (("train", articles, 1), ("valid", 12, 2), ("test", 12, 3)):
        text = data.wikitext_layout(sentences, n, seed)
        if split == "train":  # unicode and odd whitespace where the real corpus has them
            text += " = Ærø 日本語 😀 = \n \n Café  naïve\t\tcafé \u00a0 x \r\n \n"
        (raw / f"wiki.{split}.raw").write_text(text, encoding="utf-8", newline="")
    return raw


def zip_of(raw: Path, dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(raw.iterdir()):
            zf.write(path, f"wikitext-103-raw/{path.name}")
    return dest


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpc_train.data", *args], capture_output=True, text=True, timeout=300
    )


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return write_wikitext(tmp_path_factory.mktemp("raw"))


@pytest.fixture(scope="module")
def prepared(raw, tmp_path_factory) -> Path:
    """The reference: prepared from the directory, uninterrupted, two workers."""
    out = tmp_path_factory.mktemp("ref") / "bin"
    proc = cli("text", "--raw", str(raw), "--out", str(out), "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    return out


def test_demo_corpus_is_deterministic_english_sentences():
    first = data.demo_corpus(300)
    assert first == data.demo_corpus(300)
    assert len(first) == 300
    assert all(len(s.split()) >= 5 and ">>>" not in s for s in first)


@pytest.mark.fairseq
def test_manifest_records_sources_counts_and_outputs(raw, prepared):
    assert is_binarized(prepared)
    assert sorted(p.name for p in prepared.iterdir()) == sorted(
        [*CORPUS_FILES, "manifest.json", "preprocess.log"]
    )
    assert [p.name for p in prepared.parent.iterdir()] == ["bin"]  # no staging left behind
    manifest = json.loads((prepared / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    source = raw / "wiki.train.raw"
    assert train["source"] == [
        {"file": str(source), "sha256": data.sha256(source), "size": source.stat().st_size}
    ]
    with source.open(encoding="utf-8") as fh:
        assert train["lines"] == len(list(fh))
    # fairseq counts one end-of-sentence per line on top of the BPE tokens
    assert train["binarized"]["sentences"] == train["lines"]
    assert train["binarized"]["tokens"] == train["tokens"] + train["lines"]
    assert train["binarized"]["unknown_percent"] == 0
    assert {f["file"] for f in train["binarized"]["files"]} == {"train.bin", "train.idx"}
    assert manifest["encoder"]["files"] == data.GPT2_SHA256
    assert manifest["dictionary"]["from"] == "train split"
    assert manifest["dictionary"]["dict.txt"]["sha256"] == data.sha256(prepared / "dict.txt")
    assert manifest["source"] == {"kind": "wikitext-dir", "path": str(raw)}
    assert set(manifest["tools"]) >= {"python", "tokenizers", "fairseq-fixed"}


@pytest.mark.fairseq
def test_bpe_file_equals_fairseqs_own_script(raw, prepared, tmp_path):
    """The BPE step against fairseq's multiprocessing_bpe_encoder.py, run as the seeds run it."""
    import fairseq

    script = Path(fairseq.__file__).parent / "examples/roberta/multiprocessing_bpe_encoder.py"
    files = data.gpt2_bpe_files()
    source = raw / "wiki.train.raw"
    subprocess.run(
        [sys.executable, str(script), "--encoder-json", str(files["encoder.json"]),
         "--vocab-bpe", str(files["vocab.bpe"]), "--inputs", str(source),
         "--outputs", str(tmp_path / "fairseq.bpe"), "--keep-empty", "--workers", "2"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert data.encode_file(source, tmp_path / "ours.bpe", workers=2) > 0
    assert (tmp_path / "ours.bpe").read_bytes() == (tmp_path / "fairseq.bpe").read_bytes()
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["splits"]["train"]["bpe"]["sha256"] == data.sha256(tmp_path / "ours.bpe")


@pytest.mark.fairseq
def test_the_zip_read_in_place_gives_the_same_corpus(raw, prepared, tmp_path):
    archive = zip_of(raw, tmp_path / "wikitext-103-raw-v1.zip")
    out = data.prepare_text(archive, tmp_path / "bin", data.Options(workers=1))  # any workers
    for name in CORPUS_FILES:
        assert (out / name).read_bytes() == (prepared / name).read_bytes(), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["kind"] == "wikitext-zip"
    assert manifest["splits"]["valid"]["source"][0]["member"] == "wikitext-103-raw/wiki.valid.raw"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "wikitext-103-raw-v1.zip"]


@pytest.mark.fairseq
def test_a_rerun_leaves_a_prepared_corpus_alone_and_other_input_needs_force(raw, prepared):
    before = files_of(prepared)
    proc = cli("text", "--raw", str(raw), "--out", str(prepared))
    assert proc.returncode == 0 and "already prepared from this input" in proc.stderr
    assert files_of(prepared) == before
    demo = cli("demo", "--out", str(prepared), "--lines", "300")
    assert demo.returncode == 2
    assert demo.stderr.count("\n") == 1 and "--force replaces it" in demo.stderr
    assert files_of(prepared) == before
    assert not pipeline.staging_dir(prepared).exists()


@pytest.mark.fairseq
@pytest.mark.parametrize("kill_when", ["encoding train", "binarizing"])
def test_killed_at_any_point_the_rerun_ends_byte_identical(raw, prepared, tmp_path, kill_when):
    out = prepared.parent / "bin"  # the reference's own path: preprocess.log names it
    reference = files_of(prepared)
    prepared.rename(tmp_path / "reference")
    try:
        stage = pipeline.staging_dir(out)
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpc_train.data", "text", "--raw", str(raw), "--out", str(out),
             "--workers", "2"],
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip

        def reached() -> bool:
            assert proc.poll() is None, f"finished before {kill_when}: {proc.communicate()}"
            if kill_when == "binarizing":
                return (stage / "bin").is_dir()
            return any(p.stat().st_size > 0 for p in stage.glob(".train.bpe.*.tmp"))

        wait_until(reached, kill_when, timeout=120, backoff=Backoff(0.01, 1, 0.01))
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: workers too, as Slurm would
        proc.wait(timeout=30)
        assert not out.exists()  # nothing half-written where --data would look
        resumed = cli("text", "--raw", str(raw), "--out", str(out), "--workers", "2")
        assert resumed.returncode == 0, resumed.stderr
        if kill_when == "binarizing":
            assert "train: BPE done before" in resumed.stderr
        else:
            assert "train BPE: " in resumed.stderr
        assert files_of(out) == reference  # preprocess.log and manifest.json included
        assert not stage.exists()
    finally:
        if out.exists():
            os.rename(out, tmp_path / "resumed")
        (tmp_path / "reference").rename(prepared)


def make_srcdict(path: Path, ids: range) -> Path:
    lines = [f"{i} {1000 - i % 1000}" for i in ids]
    lines += [f"madeupword{n:04d} 0" for n in range(3)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.fairseq
def test_srcdict_is_used_as_given(raw, tmp_path):
    srcdict = make_srcdict(tmp_path / "gpt2-dict.txt", range(50257))  # GPT-2's dict.txt's shape
    out = data.prepare_text(raw, tmp_path / "bin", data.Options(workers=2, srcdict=srcdict))
    assert (out / "dict.txt").read_text() == srcdict.read_text()
    dictionary = json.loads((out / "manifest.json").read_text())["dictionary"]
    assert dictionary["from"] == "--srcdict"
    assert dictionary["srcdict"]["sha256"] == data.sha256(srcdict)
    assert dictionary["dict.txt"]["symbols"] == 50260


@pytest.mark.fairseq
def test_a_srcdict_that_leaves_tokens_unknown_does_not_fit(raw, tmp_path):
    srcdict = make_srcdict(tmp_path / "small.txt", range(0, 50257, 2))
    proc = cli("text", "--raw", str(raw), "--out", str(tmp_path / "bin"), "--srcdict",
               str(srcdict))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "replaced by <unk>): it does not fit this BPE" in proc.stderr.splitlines()[-1]
    assert not (tmp_path / "bin").exists()


BAD_INPUTS = {
    "empty train": (lambda raw: (raw / "wiki.train.raw").write_text(""), "empty or only blank"),
    "binary valid": (
        lambda raw: (raw / "wiki.valid.raw").write_bytes(b"\x7fELF\x02\x01\x00\x00"),
        "wiki.valid.raw: not UTF-8 text (NUL byte",
    ),
    "latin-1 test": (
        lambda raw: (raw / "wiki.test.raw").write_bytes(b" caf\xe9 \n"),
        "wiki.test.raw: not UTF-8 text",
    ),
    "missing test": (lambda raw: (raw / "wiki.test.raw").unlink(), "no wiki.test.raw"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, case):
    raw = tmp_path / "wikitext-103-raw"
    raw.mkdir()
    for split in data.SPLITS:
        (raw / f"wiki.{split}.raw").write_text(" = T = \n \n Some text . \n")
    damage, message = BAD_INPUTS[case]
    damage(raw)
    before = sorted(tmp_path.iterdir())
    assert data.main(["text", "--raw", str(raw), "--out", str(tmp_path / "bin")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert sorted(tmp_path.iterdir()) == before  # no --out, no staging directory


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sha256"], "does not match the expected 91c00ae287f0"),
        (["--sha256", "0" * 64], "does not match the expected 0000"),
        (["--srcdict", "{tmp}/words.txt"], "'the' is not a GPT-2 BPE id"),
        (["--srcdict", "{tmp}/none.txt"], "no such file"),
        (["--ratios", "0.9,0.1,0"], "--ratios applies to a directory of .txt"),
    ],
)
def test_checksum_and_dictionary_refusals(tmp_path, capsys, args, message):
    raw = tmp_path / "wikitext-103-raw"
    raw.mkdir()
    for split in data.SPLITS:
        (raw / f"wiki.{split}.raw").write_text(" Some text . \n")
    archive = zip_of(raw, tmp_path / "wikitext-103-raw-v1.zip")
    (tmp_path / "words.txt").write_text("the 100\nof 50\n")
    argv = ["text", "--raw", str(archive), "--out", str(tmp_path / "bin")]
    argv += [a.format(tmp=tmp_path) for a in args]
    if "--srcdict" in args:
        argv += ["--submit", "--dry-run"]  # checked before anything is submitted, too
    assert data.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "bin").exists()
    assert not pipeline.staging_dir(tmp_path / "bin").exists()


def test_a_second_run_on_the_same_out_is_refused_while_one_works(tmp_path, raw):
    stage = pipeline.staging_dir(tmp_path / "bin")
    stage.mkdir()
    with (stage / ".lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(data.DataError, match="another run is preparing"):
            data.prepare_text(raw, tmp_path / "bin", data.Options(workers=1))


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, raw, capsys):
    out = tmp_path / "bin"
    assert data.main(["text", "--raw", str(raw), "--out", str(out), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "source: wikitext-dir" in plan and "wiki.train.raw (" in plan
    assert "BPE recorded for: none" in plan and f"renamed to {out}" in plan
    assert list(tmp_path.iterdir()) == []


def test_help_shows_defaults_and_examples(capsys):
    with pytest.raises(SystemExit) as done:
        data.main(["text", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "python -m hpc_train.data text --raw wikitext-103-raw-v1.zip --sha256" in text
    assert "(default: the cores available" in text and "--submit" in text


@pytest.mark.fairseq
def test_demo_corpus_is_prepared_then_left_alone(tmp_path, capsys):
    out = data.prepare_demo(tmp_path / "bin", lines=400)
    assert is_binarized(out) and (out / "valid.bin").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["bin"]
    assert data.main(["demo", "--out", str(out), "--lines", "400"]) == 0
    assert "already prepared from this input" in capsys.readouterr().err
    assert data.main(["demo", "--out", str(out), "--lines", "300", "--force"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["lines"] + manifest["splits"]["valid"]["lines"] == 300
    assert [p.name for p in tmp_path.iterdir()] == ["bin"]
