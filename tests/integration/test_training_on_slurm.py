"""Real Slurm, real fairseq: tiny RoBERTa across 2 emulated nodes as one 2-rank job."""

import os
import re
import subprocess
import sys

import pytest

from hpc_core import slurm
from hpc_core.rundir import RunDir
from hpc_train.runs import logparse
from hpc_train.worker import checkpoints

pytestmark = pytest.mark.slurm

MAX_UPDATE = 60  # crosses an epoch boundary of the test corpus


@pytest.fixture(scope="module")
def two_node_run(slurm_cluster, corpus, tmp_path_factory):
    save = tmp_path_factory.mktemp("run") / "tiny"
    proc = subprocess.run(
        [
            sys.executable, "-m", "hpc_train.submit", "--preset", "tiny", "--nodes", "2",
            "--gpus-per-node", "0", "--data", str(corpus), "--save-dir", str(save),
            "--max-update", str(MAX_UPDATE), "--time", "10", "--follow",
        ],
        capture_output=True, text=True, timeout=600, env=dict(os.environ),
    )  # fmt: skip
    return proc, save


def test_submit_follows_the_job_to_max_update(two_node_run):
    proc, _ = two_node_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"job COMPLETED: {MAX_UPDATE}/{MAX_UPDATE} updates" in proc.stdout
    job_id = re.search(r"submitted job (\d+)", proc.stdout).group(1)
    assert slurm.job_state(job_id).state in {"COMPLETED", "GONE"}


def test_one_job_of_two_ranks_on_two_distinct_nodes(two_node_run):
    _, save = two_node_run
    train_log = (save / "train.log").read_text()
    assert "training on 2 devices" in train_log  # one world of 2, not two runs of 1
    starts = [
        line for p in (save / "slurm").glob("*_log.out") for line in p.read_text().splitlines()
        if " start #1:" in line
    ]  # fmt: skip
    nodes = {re.search(r"hpc-train (\S+):", line).group(1) for line in starts}
    assert len(starts) == 2 and len(nodes) == 2, starts


def test_loss_decreases(two_node_run):
    _, save = two_node_run
    summary = logparse.summarize((save / "train.log").read_text().splitlines())
    assert summary.updates == MAX_UPDATE
    n_lines = [n for n, _ in summary.losses]
    assert n_lines == sorted(set(n_lines)), "a metrics line is repeated"
    assert summary.final_loss < summary.first_loss - 0.5, summary.losses


def test_checkpoint_last_loads_with_weights_only_and_is_at_max_update(two_node_run):
    _, save = two_node_run
    state = checkpoints.load(save / "checkpoint_last.pt")
    assert checkpoints.num_updates(state) == MAX_UPDATE
    assert any(k.endswith("embed_tokens.weight") for k in state["model"])


def test_preflight_checks_the_allocation_before_training(runs):
    import json

    job, save = runs.submit("preflight", 10, extra_cli=("--preflight",))
    assert runs.wait_done(job).state == "COMPLETED"
    result = json.loads((save / "preflight" / "result.json").read_text())
    assert result["healthy"] is True
    assert runs.summary(save).updates == 10


def test_truncated_last_resumes_from_the_newest_interval_checkpoint(two_node_run, runs):
    """Runs after the module's other tests: damages their finished run, then continues it."""
    _, save = two_node_run
    last = save / checkpoints.LAST
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 3])
    newest = RunDir(save).interval_checkpoints()[0]
    saved_at = checkpoints.num_updates(checkpoints.load(newest))
    job, _ = runs.submit("fallback", MAX_UPDATE + 10, save=save)
    assert runs.wait_done(job).state == "COMPLETED"
    summary = logparse.summarize((save / "train.log").read_text().splitlines())
    assert summary.resumed_at[-1] == saved_at  # not a crash, not a fresh start
    assert summary.updates == MAX_UPDATE + 10
    kept = list(save.glob("checkpoint_last.pt.bad-*"))
    assert len(kept) == 1 and kept[0].stat().st_size < last.stat().st_size
