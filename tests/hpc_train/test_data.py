from pathlib import Path

import pytest

from hpc_train import data
from hpc_train.spec import is_binarized


def test_gpt2_bpe_files_are_verified_by_checksum():
    files = data.gpt2_bpe_files()
    for name, path in files.items():
        assert data.sha256(path) == data.GPT2_SHA256[name]


def test_demo_corpus_is_deterministic_english_sentences():
    first = data.demo_corpus(300)
    assert first == data.demo_corpus(300)
    assert len(first) == 300
    assert all(len(s.split()) >= 5 and ">>>" not in s for s in first)


def test_prepare_binarizes_atomically_and_cli_skips_a_ready_corpus(tmp_path, capsys):
    out = tmp_path / "bin"
    data.prepare({"train": data.demo_corpus(400)[50:], "valid": data.demo_corpus(50)}, out)
    assert is_binarized(out) and (out / "valid.bin").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["bin"]  # no temp dirs left behind
    assert data.main(["demo", "--out", str(out)]) == 0
    assert "already a binarized corpus" in capsys.readouterr().err


def test_text_pipeline_refuses_a_dir_without_wikitext_layout(tmp_path, capsys):
    assert data.main(["text", "--raw", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "wiki.train.raw" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_text_pipeline_on_wikitext_layout(tmp_path: Path):
    raw = tmp_path / "wikitext-103-raw"
    raw.mkdir()
    sentences = data.demo_corpus(260)
    (raw / "wiki.train.raw").write_text("\n".join(sentences[60:]) + "\n")
    (raw / "wiki.valid.raw").write_text("\n".join(sentences[:30]) + "\n")
    (raw / "wiki.test.raw").write_text("\n".join(sentences[30:60]) + "\n")
    out = data.prepare_text(raw, tmp_path / "bin", workers=1)
    assert all((out / f"{s}.bin").is_file() for s in ("train", "valid", "test"))


@pytest.mark.parametrize("missing", ["encoder.json"])
def test_tampered_bpe_file_is_refused(monkeypatch, tmp_path, missing):
    monkeypatch.setitem(data.GPT2_SHA256, missing, "0" * 64)
    with pytest.raises(data.DataError, match="sha256"):
        data.gpt2_bpe_files()
