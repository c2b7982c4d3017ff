"""``submit --container``: the pyxis job script (golden), what submitit submits, the dry run, and
bad input refused in one line with exit 2 before Slurm is asked anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpc_core import slurm
from hpc_train import submit
from hpc_train.job import container, presets
from hpc_train.job.container import Mount
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import Container, JobSpec, Saves, SlurmJob, Training, validate
from tests.hpc_train.conftest import oci_image

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PYTHON = "/lustre/hpc-train/venv/bin/python"  # as in test_submit.py: the host's, never used here
IMAGE = "/lustre/images/hpc-train.sqsh"


def pyxis_spec(save_dir: Path = Path("/lustre/runs/roberta-large")) -> JobSpec:
    return JobSpec(
        Training("roberta-large", Path("/lustre/data-bin/wikitext-103"), save_dir),
        sizing=Sizing(nodes_min=2, nodes_max=2, gpus_per_node=8),
        slurm=SlurmJob(partition="gpu"),
        saves=Saves(local_dir=Path("/scratch/hpc-train")),
        container=Container(
            IMAGE, mounts=(Mount(Path("/lustre/tokenizers"), Path("/tokenizers"), "ro"),)
        ),
    )


def test_pyxis_job_script_matches_golden_file():
    spec = pyxis_spec()
    line, plan = submit.training_command(spec, validate(spec, check_paths=False))
    text = f"{submit.render_sbatch(spec, python=PYTHON)}\n# {plan}\n{line}\n"
    path = GOLDEN / "roberta-large-pyxis.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"regenerate with UPDATE_GOLDEN=1 and review {path}"
    srun = next(row for row in text.splitlines() if row.startswith("srun "))
    assert f"--container-image={IMAGE}" in srun and "--container-workdir=/lustre/runs/" in srun
    mounts = srun.split("--container-mounts=")[1].split()[0].split(",")
    assert mounts[:3] == [
        "/lustre/runs/roberta-large:/lustre/runs/roberta-large",
        "/lustre/data-bin/wikitext-103:/lustre/data-bin/wikitext-103",
        "/scratch/hpc-train:/scratch/hpc-train",
    ]
    assert mounts[-1] == "/lustre/tokenizers:/tokenizers:ro"
    # the image's interpreter runs submitit, not the submit host's
    assert srun.endswith(f"{container.IMAGE_PYTHON} -u -m submitit.core._submit "
                         "/lustre/runs/roberta-large/slurm")  # fmt: skip
    assert PYTHON not in text


@pytest.mark.parametrize("preset", list(presets.PRESETS))
def test_the_plain_form_has_no_container_flags_and_runs_the_hosts_python(preset):
    spec = JobSpec(Training(preset, Path("/d"), Path("/s")), sizing=Sizing(gpus_per_node=0))
    script = submit.render_sbatch(spec, python=PYTHON)
    assert "container" not in script
    assert f"{PYTHON} -u -m submitit.core._submit /s/slurm" in script
    assert "srun_args" not in submit.sbatch_parameters(spec)


def test_dry_run_renders_exactly_what_submitit_submits_in_the_image(tmp_path):
    spec = pyxis_spec(save_dir=tmp_path / "run")
    executor = submit.make_executor(spec)
    real = executor._make_submission_file_text(executor._submitit_command_str, "uid")
    assert submit.render_sbatch(spec) == real
    assert "--container-image=" in real and container.IMAGE_PYTHON in real


def test_dry_run_shows_the_container_flags(capsys, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    code = submit.main([
        "--preset", "tiny", "--gpus-per-node", "0", "--data", "/lustre/d", "--save-dir",
        "/lustre/s", "--container", "docker://nvcr.io#nvidia/pytorch:24.12-py3",
        "--container-mounts", "/lustre/tok:/tok:ro", "--dry-run",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "'--container-image=docker://nvcr.io#nvidia/pytorch:24.12-py3'" in out  # quoted: '#'
    assert "/lustre/tok:/tok:ro" in out and "--container-workdir=/lustre/s" in out
    assert "inside the image docker://nvcr.io#nvidia/pytorch:24.12-py3" in out


def test_help_says_how_with_an_example():
    text = " ".join(submit.build_parser().format_help().split())
    assert "--container IMAGE" in text and "--container-mounts SRC:DST[,...]" in text
    assert "--container /lustre/images/hpc-train.sqsh" in text  # the epilog's example
    assert "docker://[USER@][REGISTRY#]IMAGE[:TAG]" in text


@pytest.fixture
def never_submitted(monkeypatch):
    """Fails the test if the CLI gets as far as asking Slurm or submitting."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("bad input reached Slurm")

    monkeypatch.setattr(slurm, "ensure_reachable", refuse)
    monkeypatch.setattr(submit, "submit", refuse)


@pytest.fixture
def corpus_dir(tmp_path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    for name in ("dict.txt", "train.bin", "train.idx"):
        (data / name).write_text("")
    return data


def bad_input(tmp_path, corpus_dir, capsys, *args: str) -> str:
    argv = ["--preset", "tiny", "--gpus-per-node", "0", "--data", str(corpus_dir),
            "--save-dir", str(tmp_path / "run"), *args]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        submit.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2
    assert len(err.splitlines()) == 1 and ": error: " in err, err
    assert not (tmp_path / "run").exists()  # nothing written, nothing submitted
    return err


@pytest.mark.usefixtures("never_submitted")
def test_bad_container_input_is_one_line_and_exit_2_before_anything_is_submitted(
    tmp_path, corpus_dir, capsys
):
    not_sqsh = tmp_path / "zip.sqsh"
    not_sqsh.write_bytes(b"PK\x03\x04")
    sqsh = tmp_path / "ok.sqsh"
    sqsh.write_bytes(b"hsqs" + bytes(92))
    cases = [
        (["--container", "https://example.com/x"], "only docker://"),
        (["--container", "docker://nvcr.io/nvidia/pytorch:24.12-py3"], "'#', not '/'"),
        (["--container", str(tmp_path / "missing.sqsh")], "no such file"),
        (["--container", str(not_sqsh)], "not a squashfs image"),
        (["--container", str(sqsh), "--container-mounts", f"{tmp_path}/nope:/x"],
         "no such source"),
        (["--container", str(sqsh), "--container-mounts", f"{tmp_path}:relative"],
         "must be an absolute path"),
        (["--container-mounts", f"{tmp_path}:/x"], "needs --container"),
        (["--container", str(sqsh), "--preflight"], "--preflight with --container"),
    ]  # fmt: skip
    for args, needle in cases:
        line = bad_input(tmp_path, corpus_dir, capsys, *args)
        assert needle in line, (args, line)


def test_a_good_squashfs_and_mounts_pass_validation(tmp_path, corpus_dir):
    sqsh = tmp_path / "ok.sqsh"
    sqsh.write_bytes(b"hsqs" + bytes(92))
    spec = JobSpec(
        Training("tiny", corpus_dir, tmp_path / "run"),
        sizing=Sizing(gpus_per_node=0),
        container=Container(str(sqsh), mounts=(Mount(tmp_path, Path("/extra")),)),
    )
    validate(spec)


# --- an OCI image directory: Slurm's own --container, the run's bundle written at submit ---------


def test_dry_run_with_an_oci_image_shows_slurms_container_flag_and_the_bundle(
    tmp_path, capsys, slurm_with_oci
):
    image = oci_image(tmp_path)
    save = tmp_path / "run"
    code = submit.main([
        "--preset", "tiny", "--gpus-per-node", "0", "--data", str(tmp_path / "d"),
        "--save-dir", str(save), "--container", str(image), "--dry-run",
    ])  # fmt: skip
    out = capsys.readouterr().out
    bundle = save / ".hpc-train" / "oci"
    assert code == 0
    srun = next(row for row in out.splitlines() if row.startswith("srun "))
    assert f"--container={bundle} {container.IMAGE_PYTHON} -u -m submitit.core._submit" in srun
    assert "--container-image" not in out  # not pyxis's
    assert f"its OCI bundle {bundle}, written at submit" in out
    assert f"{slurm_with_oci.parent}:{slurm_with_oci.parent}" in out  # this cluster's client
    assert not bundle.exists()  # a dry run writes nothing


def test_submit_writes_the_runs_bundle_before_sbatch(tmp_path, corpus_dir, slurm_with_oci,
                                                      monkeypatch):  # fmt: skip
    """submitit's executor is replaced (no Slurm here): what it would submit is recorded."""
    image = oci_image(tmp_path)
    spec = JobSpec(
        Training("tiny", corpus_dir, tmp_path / "run"),
        sizing=Sizing(gpus_per_node=0),
        container=Container(str(image)),
    )
    validate(spec)
    seen = {}

    class Executor:
        def submit(self, _launcher):
            seen["bundle"] = json.loads((spec.run_dir.oci_bundle / "config.json").read_text())
            return "job"

    monkeypatch.setattr(submit, "make_executor", lambda _spec: Executor())
    assert submit.submit(spec) == "job"
    destinations = [m["destination"] for m in seen["bundle"]["mounts"]]
    assert destinations[-4:] == [
        str(spec.training.save_dir), str(corpus_dir), str(slurm_with_oci.parent), str(tmp_path / "munge")
    ]  # fmt: skip
    assert "/opt" in destinations and seen["bundle"]["process"]["cwd"] == str(
        spec.training.save_dir
    )


@pytest.mark.usefixtures("never_submitted")
def test_an_oci_image_slurm_cannot_run_is_one_line_and_exit_2(
    tmp_path, corpus_dir, capsys, slurm_with_oci
):
    image = oci_image(tmp_path)
    (slurm_with_oci.parent / "oci.conf").unlink()
    line = bad_input(tmp_path, corpus_dir, capsys, "--container", str(image))
    assert "Slurm's OCI support is not configured" in line
    (image / "config.json").unlink()
    line = bad_input(tmp_path, corpus_dir, capsys, "--container", str(image))
    assert "not an OCI image" in line
