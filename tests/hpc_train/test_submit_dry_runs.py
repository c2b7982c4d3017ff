"""``hpc-train submit --help`` and the dry runs of many option sets, byte for byte against golden
files (``tests/golden/submit-help.txt``, ``tests/golden/dry-run/``): what the user sees stays the
same whatever the spec's fields look like inside. Regenerate with UPDATE_GOLDEN=1 and review."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from hpc_train import submit
from tests.hpc_train.conftest import oci_image

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
DRY_RUNS = GOLDEN / "dry-run"
RUN = ["--data", "/lustre/data-bin/wikitext-103", "--save-dir", "/lustre/runs/x"]
IMAGE = "docker://nvcr.io#nvidia/pytorch:24.12-py3"

# name: the options (shell words; after them the data and save dirs, then --dry-run)
CASES: dict[str, str] = {
    "tiny": "--preset tiny --gpus-per-node 0",
    "roberta-base": "--preset roberta-base",
    "roberta-large": "--preset roberta-large --nodes 2 --partition gpu",
    "elastic": "--preset roberta-base --nodes 1-4",
    "spares": "--preset roberta-large --nodes 2 --spares 1",
    "restart-in-job": "--preset tiny --gpus-per-node 0 --nodes 2 --restart-in-job",
    "hollow": "--preset tiny --gpus-per-node 0 --nodes 64 --global-batch 512 --hollow --spares 1",
    "pyxis": f"--preset roberta-large --container '{IMAGE}' "
    "--container-mounts /lustre/tok:/tok:ro,/lustre/more:/more --local-save-dir /scratch/hpc-train",
    "p5-compile": "--preset roberta-large --gpus-per-node 8 --instance-type p5.48xlarge "
    "--compile on",
    "levers": "--preset roberta-base --instance-type p4d.24xlarge --gelu on --pad-check on "
    "--host-sizes on --lazy-stats on --foreach-grads on --pack on --flash off --fused-adamw off",
    "levers-cpu": "--preset tiny --gpus-per-node 0 --fused-adamw on",
    "watch": "--preset tiny --gpus-per-node 0 --no-watchdog --hang-factor 4 "
    "--hang-timeout-floor 60 --hang-save-timeout 120 --hang-startup-timeout 240 --no-drain "
    "--straggler-threshold 0.3 --straggler-window 90 --evict-stragglers",
    "saves": "--preset roberta-base --local-save-dir /scratch/hpc-train --keep-checkpoints 5 "
    "--save-interval auto --mtbf-hours 500",
    "sync-save": "--preset tiny --gpus-per-node 0 --sync-save --save-interval 7 --audit-samples",
    "mail": "--preset tiny --gpus-per-node 0 --mail-user me@lab.org --mail-type end,fail,requeue "
    "--notify 'cat >> /tmp/events'",
    "recovery": "--preset roberta-large --nodes 1-2 --max-restarts 3 --grow-after 0 "
    "--nodes-replaced no --max-no-progress-restarts 1",
    "sizes": "--preset roberta-base --nodes 4 --global-batch 512 --max-update 1000 "
    "--batch-per-device 16 --precision fp16 --cpus-per-task 48 --time 2:00:00 --job-name sized "
    "--instance-type p3dn.24xlarge",
    "preflight": "--preset roberta-base --nodes 2 --preflight",
    "node-check": "--preset roberta-base --instance-type p4d.24xlarge --node-check on",
    "fairseq-args": "--preset tiny --gpus-per-node 0 -- --validate-interval-updates 7 --seed 3",
    # auto: offline, as no W&B key is here (fixed_terminal)
    "tracking": "--preset roberta-large --nodes 2 --tensorboard --wandb-project roberta "
    "--wandb-entity lab",
    # refused: one line and exit 2
    "bad-spares": "--preset tiny --nodes 1-2 --spares 1",
    "bad-local-save": "--preset tiny --local-save-dir /scratch --sync-save",
    "bad-hang": "--preset tiny --hang-factor 0.5",
    "bad-mounts": "--preset tiny --gpus-per-node 0 --container-mounts /a:/b",
    "bad-stragglers": "--preset tiny --gpus-per-node 0 --straggler-window 0",
    "bad-preflight": f"--preset tiny --gpus-per-node 0 --container '{IMAGE}' --preflight",
    "bad-mail": "--preset tiny --gpus-per-node 0 --mail-type sometimes",
    "bad-restarts": "--preset tiny --gpus-per-node 0 --keep-checkpoints 0",
    "bad-save-interval": "--preset tiny --save-interval often",
    "bad-lever": "--preset tiny --gpus-per-node 0 --flash on",
    "bad-fairseq-tensorboard": "--preset tiny --gpus-per-node 0 -- --tensorboard-logdir /tmp/tb",
    "bad-wandb-mode": "--preset tiny --gpus-per-node 0 --wandb-mode online",
    "missing-preset": "",
}


def golden(path: Path, text: str) -> None:
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"regenerate with UPDATE_GOLDEN=1 and review {path}"


def run_main(argv: list[str], capsys) -> str:
    """The exit code, stdout and stderr of ``submit.main`` as one text."""
    try:
        code = submit.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return f"exit {code}\n--- stdout\n{out}--- stderr\n{err}"


@pytest.fixture(autouse=True)
def fixed_terminal(monkeypatch):
    """argparse wraps help to $COLUMNS; the dry run asks no Slurm for a GraceTime, nor this
    machine's disks for the save dir's room (/lustre is not here: its nearest directory, /, has
    this machine's free space; the warning's own tests: test_submit_space.py); no W&B key
    (``--wandb-mode auto`` decides offline)."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent/.netrc")
    monkeypatch.setattr(submit, "grace_time_s", lambda partition, dry_run=False: None)
    monkeypatch.setattr(submit, "save_dir_room", lambda save_dir: None)


def test_help_is_unchanged(capsys):
    golden(GOLDEN / "submit-help.txt", run_main(["--help"], capsys))


@pytest.mark.parametrize("name", list(CASES))
def test_dry_run_is_unchanged(name, capsys):
    options = shlex.split(CASES[name])
    extra = options[options.index("--") :] if "--" in options else []
    options = options[: len(options) - len(extra)]
    text = run_main([*options, *RUN, "--dry-run", *extra], capsys)
    golden(DRY_RUNS / f"{name}.txt", text.replace(sys.executable, "PYTHON"))


def test_dry_run_with_an_oci_image_is_unchanged(tmp_path, capsys, slurm_with_oci):
    image = oci_image(tmp_path)
    argv = ["--preset", "tiny", "--gpus-per-node", "0", "--data", str(tmp_path / "d"),
            "--save-dir", str(tmp_path / "run"), "--container", str(image), "--dry-run"]  # fmt: skip
    text = run_main(argv, capsys).replace(str(tmp_path), "TMP")
    golden(DRY_RUNS / "oci.txt", text.replace(sys.executable, "PYTHON"))
