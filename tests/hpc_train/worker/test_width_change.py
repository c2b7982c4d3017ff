"""Real fairseq, no Slurm: the worker under torchrun (gloo, localhost) with ``--audit-samples``.
A run changes width mid-epoch 2 -> 1 -> 3 ranks, the global batch kept by ``--update-freq``, and
the audit shows every sample of the epoch trained exactly once; a resume at the same width is the
uninterrupted run, tensor for tensor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hpc_train.contract import WorkerEnv
from hpc_train.job.command_lines import TRAIN_MODULE, fairseq_args
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Saves, Training
from hpc_train.runs import audit

GLOBAL_BATCH = 48  # sequences per update: 8 per rank x 2 ranks x 3 = 8 x 1 x 6 = 8 x 3 x 2


def train(corpus: Path, save: Path, ranks: int, *extra: str) -> str:
    """The tiny preset on ``ranks`` ranks (torchrun, or one plain process), auditing samples;
    the batch plan is the toolkit's own for that width. Returns the ranks' output."""
    spec = JobSpec(
        Training("tiny", corpus, save, max_update=100),
        sizing=Sizing(gpus_per_node=0, global_batch=GLOBAL_BATCH),
        saves=Saves(keep_checkpoints=5),
    )
    args, plan = fairseq_args(spec, world_size=ranks, gpu=False)
    assert plan.effective == GLOBAL_BATCH
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_TRAIN_")}
    env.update(WorkerEnv(audit_samples=True).to_env(), OMP_NUM_THREADS="1")
    if ranks == 1:
        cmd = [sys.executable, "-m", TRAIN_MODULE]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc_per_node={ranks}", "-m", TRAIN_MODULE]
    proc = subprocess.run(
        [*cmd, *args, "--disable-validation", *extra],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return out


def test_width_changes_mid_epoch_train_each_sample_once(corpus, tmp_path):
    save = tmp_path / "run"
    train(corpus, save, 2, "--max-update", "3")
    shrunk = train(corpus, save, 1, "--max-update", "6")
    grown = train(corpus, save, 3, "--max-epoch", "1")

    (epoch,) = audit.audit(save)
    assert epoch.complete and epoch.planned > 100
    assert (epoch.repeated, epoch.missing) == ({}, [])
    assert epoch.seen == epoch.planned and epoch.exact, epoch.describe()
    assert sorted(p.name for p in (save / ".hpc-train" / "audit").glob("local-*")) == [
        "local-w1-u3", "local-w2-u0", "local-w3-u6",
    ]  # fmt: skip
    assert audit.main([str(save)]) == 0
    # the positions converted (2 ranks x 3 batches an update; 1 x 6; 3 x 2)
    assert "2 shards x 9 batches = 18 batches of the epoch consumed -> 1 shards skip 18" in shrunk
    assert "1 shards x 36 batches = 36 batches of the epoch consumed -> 3 shards skip 12" in grown


def test_a_position_the_new_width_does_not_divide_is_exact_too(corpus, tmp_path):
    """1 rank x 5 batches, then 2 ranks (5 = 2 x 2 + 1): rank 0 starts with fairseq's empty
    batch; then 22 batches over 3 ranks: the same. No rank waits on another, none repeats."""
    save = tmp_path / "run"
    train(corpus, save, 1, "--max-update", "1", "--update-freq", "5")
    two = train(corpus, save, 2, "--max-update", "4")
    assert "-> 2 shards skip 2 each; the first 1 shard(s) start with an empty batch" in two
    three = train(corpus, save, 3, "--max-epoch", "1")
    assert "22 batches of the epoch consumed -> 3 shards skip 7 each; the first 1" in three
    (epoch,) = audit.audit(save)
    assert epoch.complete and epoch.exact and epoch.seen == epoch.planned, epoch.describe()


def test_a_resume_at_the_same_width_is_the_uninterrupted_run(corpus, tmp_path, same_training_state):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(corpus, straight, 1, "--max-update", "8")
    train(corpus, resumed, 1, "--max-update", "4")
    out = train(corpus, resumed, 1, "--max-update", "8")
    assert "data position (epoch 1): same width: fairseq's offset as saved" in out
    same_training_state(straight / "checkpoint_last.pt", resumed / "checkpoint_last.pt")
    (epoch,) = audit.audit(resumed)
    assert not epoch.complete and epoch.exact and epoch.seen == 8 * GLOBAL_BATCH
