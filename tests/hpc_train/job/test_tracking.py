"""hpc_train.job.tracking: the W&B run id, the mode decided at submit, the refusals, and what
the dry run says; the W&B key never enters the spec or the dry run. Pure, and a few CLI runs."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_core.rundir import RunDir
from hpc_train import submit
from hpc_train.job import tracking
from hpc_train.job.tracking import Tracking, TrackingError

RUN = ["--preset", "tiny", "--gpus-per-node", "0", "--data", "/d", "--save-dir", "/runs/x"]
SECRET = "0123456789abcdef0123456789abcdef01234567"  # a made-up key (40 hex, W&B's form)


def test_the_run_id_is_the_save_dirs_and_w_and_b_takes_it():
    one = tracking.run_id(Path("/lustre/runs/large"))
    assert one == tracking.run_id(Path("/lustre/runs/large"))  # every start, every resubmission
    assert one != tracking.run_id(Path("/lustre/runs/large2"))
    assert re.fullmatch(r"[a-z0-9-]{1,64}", one)  # W&B: letters, digits, dashes; at most 64


@pytest.mark.parametrize(
    ("env", "netrc_text", "found"),
    [
        ({"WANDB_API_KEY": SECRET}, None, "WANDB_API_KEY"),
        ({}, "machine api.wandb.ai login user password " + SECRET, "netrc"),
        ({}, "machine example.org login user password x", None),
        ({"WANDB_BASE_URL": "https://wandb.lab.org"}, "machine wandb.lab.org password x", "netrc"),
        ({}, None, None),
    ],
)
def test_a_key_is_found_where_w_and_b_looks_for_one(tmp_path, env, netrc_text, found):
    if netrc_text is not None:
        (tmp_path / ".netrc").write_text(netrc_text + "\n")
        (tmp_path / ".netrc").chmod(0o600)
    said = tracking.key_source(env, tmp_path)
    assert said == (str(tmp_path / ".netrc") if found == "netrc" else found)
    mode = tracking.resolved(Tracking(wandb_project="p"), env, tmp_path).wandb_mode
    assert mode == ("offline" if found is None else "online")


def test_an_explicit_mode_is_kept():
    env = {"WANDB_API_KEY": SECRET}
    asked = Tracking(wandb_project="p", wandb_mode="offline")
    assert tracking.resolved(asked, env, Path("/nonexistent")) == asked


@pytest.mark.parametrize(
    ("asked", "extra", "said"),
    [
        (Tracking(), ["--tensorboard-logdir", "/tmp/tb"], "-- --tensorboard-logdir: fairseq's own"),
        (Tracking(), ["--wandb-project=x"], "use the toolkit's --wandb-project NAME"),
        (Tracking(), ["--wandb-pro", "x"], "-- --wandb-pro:"),  # fairseq takes prefixes
        (Tracking(wandb_entity="lab"), [], "need --wandb-project NAME"),
        (Tracking(wandb_project="a/b"), [], "--wandb-project 'a/b': 1-128 characters"),
        (Tracking(wandb_project="x" * 129), [], "1-128 characters"),
    ],
)
def test_what_cannot_work_is_refused_in_one_line(asked, extra, said):
    with pytest.raises(TrackingError, match=re.escape(said)):
        tracking.check(asked, extra)


def test_the_spec_and_the_dry_run_carry_no_key(monkeypatch, capsys):
    """A key in the environment makes ``auto`` online; the key itself is nowhere: not in the
    pickled spec submitit sends, not in the dry run."""
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setattr(submit, "grace_time_s", lambda partition, dry_run=False: None)
    spec = submit.with_tracking(submit.options.spec_from_options(
        submit.build_parser().parse_args([*RUN, "--wandb-project", "p", "--tensorboard"])
    ))  # fmt: skip
    assert spec.tracking.wandb_mode == "online"
    assert SECRET.encode() not in pickle.dumps(spec)
    assert submit.main([*RUN, "--wandb-project", "p", "--tensorboard", "--dry-run"]) == 0
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    assert "project p, run x (id hpc-" in out.out and "), online;" in out.out


def test_a_missing_package_is_one_line_and_exit_2():
    """Faked: wandb is blocked in this Python (``sys.modules["wandb"] = None``: Python's own way
    to make a module unimportable; ``import wandb`` raises, ``find_spec`` finds none), as on a
    host without the tracking extra."""
    code = "import sys; sys.modules['wandb'] = None\nfrom hpc_train import submit\n"
    code += "sys.exit(submit.main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, *RUN, "--wandb-project", "p", "--dry-run"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "python -m hpc_train.submit: error: --wandb-project needs the wandb package, not "
        f"installed: {tracking.INSTALL}"
    ]


def test_describe_says_where_the_curves_will_be():
    run = RunDir(Path("/lustre/runs/large"))
    asked = Tracking(tensorboard=True, wandb_project="roberta", wandb_mode="offline")
    assert tracking.describe(asked, run) == [
        "TensorBoard (rank 0): tensorboard --logdir /lustre/runs/large/tensorboard",
        f"W&B (rank 0): project roberta, run large (id {tracking.run_id(run.root)}), offline; "
        "every start resumes this run",
        "  later, from a machine online: wandb sync /lustre/runs/large/wandb/offline-run-*",
    ]
    assert tracking.describe(Tracking(), run) == []
