"""Data preparation as a Slurm job: the command it runs, and on the real local cluster a job
killed mid-way, resubmitted and followed to a corpus that tiny RoBERTa then trains on."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_core import slurm
from hpc_core.wait import Backoff, wait_until
from hpc_train.data import job, pipeline

WATCH = Backoff(0.01, 1, 0.01)


def test_the_job_runs_the_same_command_without_the_submit_options():
    argv = ["text", "--raw", "w.zip", "--sha256", "--submit", "--partition", "big",
            "--time=60", "--follow", "--out", "o", "--workers", "8"]  # fmt: skip
    assert job.job_argv(argv) == ["text", "--raw", "w.zip", "--sha256", "--out", "o",
                                  "--workers", "8"]  # fmt: skip
    assert job.command(["demo", "--out", "o", "--submit"])[1:] == [
        "-m", "hpc_train.data", "demo", "--out", "o",
    ]  # fmt: skip


def test_sbatch_asks_for_one_whole_node_and_logs_beside_the_corpus(tmp_path):
    args = job.sbatch_args(tmp_path / "bin", ["python", "-m", "x y"], "high", 90)
    text = shlex.join(args)
    assert "--nodes 1 --ntasks 1 --exclusive --mem 0" in text
    assert f"--output {tmp_path}/bin.prepare-%j.log" in text
    assert "--partition high --time 90" in text
    assert args[-2:] == ["--wrap", "python -m 'x y'"]
    assert "--partition" not in job.sbatch_args(tmp_path / "bin", ["x"], None, None)


def test_submit_dry_run_prints_sbatch_and_submits_nothing(tmp_path, capsys):
    from hpc_train import data

    argv = ["demo", "--out", str(tmp_path / "bin"), "--submit", "--partition", "low", "--dry-run"]
    assert data.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("sbatch --job-name hpc-train-data") and "--exclusive" in out
    assert out.rstrip().endswith(f"hpc_train.data demo --out {tmp_path / 'bin'}'")
    assert list(tmp_path.iterdir()) == []


def test_no_slurm_reachable_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    from hpc_train import data

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    assert data.main(["demo", "--out", str(tmp_path / "bin"), "--submit"]) == 2
    err = capsys.readouterr().err
    assert "no Slurm reachable" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_follow_without_submit_is_a_usage_error(tmp_path):
    from hpc_train import data

    with pytest.raises(SystemExit) as done:
        data.main(["demo", "--out", str(tmp_path / "bin"), "--follow"])
    assert done.value.code == 2


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ), cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip


@pytest.fixture(scope="module")
def wikitext(tmp_path_factory) -> Path:
    from hpc_train import data

    raw = tmp_path_factory.mktemp("raw") / "wikitext-103-raw"
    raw.mkdir()
    sentences = data.demo_corpus(4000)
    for split, articles, seed in (("train", 4000, 1), ("valid", 30, 2), ("test", 30, 3)):
        text = data.wikitext_layout(sentences, articles, seed)
        (raw / f"wiki.{split}.raw").write_text(text, encoding="utf-8")
    return raw


def test_a_job_cancelled_mid_way_is_resubmitted_and_ends_like_a_local_run(
    slurm_cluster, wikitext, tmp_path
):
    out = tmp_path / "bin"
    local = run(
        "-m", "hpc_train.data", "text", "--raw", str(wikitext), "--out", str(out), "--workers", "2"
    )  # fmt: skip  (a node of the local cluster has 2 CPUs)
    assert local.returncode == 0, local.stderr
    reference = {p.name: p.read_bytes() for p in out.iterdir()}
    out.rename(tmp_path / "reference")

    first = run("-m", "hpc_train.data", "text", "--raw", str(wikitext), "--out", str(out),
                "--submit")  # fmt: skip
    assert first.returncode == 0, first.stderr
    job_id = re.search(r"submitted job (\d+)", first.stdout).group(1)
    stage = pipeline.staging_dir(out)
    wait_until(lambda: any(stage.glob(".train.bpe.*.tmp")), "the job encoding train", 300, WATCH)
    slurm.cancel(job_id)  # mid-encode: SIGTERM to the job's processes, then SIGKILL
    assert slurm.wait_for_job(job_id, timeout=120).state in {"CANCELLED", "GONE"}
    assert not out.exists()

    again = run("-m", "hpc_train.data", "text", "--raw", str(wikitext), "--out", str(out),
                "--submit", "--follow")  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "COMPLETED: corpus ready in" in again.stdout
    assert "train BPE: " in again.stdout  # the job's progress lines, followed
    assert {p.name: p.read_bytes() for p in out.iterdir()} == reference
    assert not stage.exists()

    train = run("-m", "hpc_train.submit", "--preset", "tiny", "--nodes", "1",
                "--gpus-per-node", "0", "--data", str(out), "--save-dir", str(tmp_path / "run"),
                "--max-update", "10", "--time", "10", "--follow")  # fmt: skip
    assert train.returncode == 0, train.stdout + train.stderr
    assert "job COMPLETED: 10/10 updates" in train.stdout
