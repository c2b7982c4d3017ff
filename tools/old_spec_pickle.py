"""A job as an earlier version of the toolkit pickled it: the golden file of the upgrade test.

    python tools/old_spec_pickle.py COMMIT OUT

submitit pickles the ``Launcher`` with its ``JobSpec`` when a job is submitted, and again at each
requeue on a notice; a job submitted before an upgrade is loaded by the upgraded code when Slurm
starts it again. This takes the code of ``COMMIT`` (``git archive``: ``hpc_core``, ``hpc_train``,
``nccl_checks``) into a temporary directory, builds the spec there from ``ARGV`` (a submit command
line that sets every option away from its default) with that version's own parser, and dumps it
as submitit does (``DelayedSubmission(Launcher(spec)).dump``, cloudpickle) to ``OUT``.
``tests/hpc_train/job/test_spec_upgrade.py`` loads the file with today's code.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("hpc_core", "hpc_train", "nccl_checks")

# every submit option away from its default (not validated: only built and pickled), and
# fairseq's own arguments after ``--``
ARGV: tuple[str, ...] = (
    "--preset", "roberta-base", "--data", "/lustre/data-bin/old", "--save-dir", "/lustre/runs/old",
    "--nodes", "2-4", "--gpus-per-node", "4", "--partition", "gpu", "--time", "2:00:00",
    "--global-batch", "512", "--max-update", "1000", "--instance-type", "p4d.24xlarge",
    "--job-name", "old", "--max-restarts", "5", "--grow-after", "60", "--restart-in-job",
    "--spares", "1", "--nodes-replaced", "no", "--max-no-progress-restarts", "2",
    "--keep-checkpoints", "4", "--save-interval", "100", "--mtbf-hours", "500", "--sync-save",
    "--local-save-dir", "/scratch/old", "--cpus-per-task", "12", "--preflight",
    "--mail-user", "me@lab.org", "--mail-type", "END,FAIL", "--notify", "cat >> /tmp/events",
    "--precision", "fp16", "--batch-per-device", "16", "--compile", "on", "--pack", "off",
    "--no-watchdog", "--hang-factor", "4", "--hang-timeout-floor", "60",
    "--hang-save-timeout", "120", "--hang-startup-timeout", "240", "--no-drain",
    "--straggler-threshold", "0.3", "--straggler-window", "90", "--evict-stragglers",
    "--audit-samples", "--container", "docker://nvcr.io#nvidia/pytorch:24.12-py3",
    "--container-mounts", "/lustre/tok:/tok:ro", "--", "--seed", "3",
)  # fmt: skip

# run by that version's Python path: its parser, its spec, its Launcher, submitit's dump
DUMP = """
import json, sys
from submitit.core.utils import DelayedSubmission
from hpc_train import submit
from hpc_train.job import options
from hpc_train.launch.launcher import Launcher
argv = json.loads(sys.argv[1])
cut = argv.index("--")
spec = options.spec_from_options(submit.build_parser().parse_args(argv[:cut]), argv[cut + 1:])
assert submit.__file__.startswith(sys.argv[3]), submit.__file__  # that version's, not this one
DelayedSubmission(Launcher(spec)).dump(sys.argv[2])
"""


def extract(commit: str, into: Path) -> None:
    """The packages of ``commit`` under ``into``."""
    tar = subprocess.run(["git", "-C", str(REPO), "archive", commit, *PACKAGES],
                         check=True, capture_output=True).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")


def dump(commit: str, out: Path) -> None:
    """Pickle ``ARGV``'s spec with ``commit``'s code to ``out``."""
    with tempfile.TemporaryDirectory() as tmp:
        extract(commit, Path(tmp))
        subprocess.run([sys.executable, "-c", DUMP, json.dumps(ARGV), str(out.resolve()), tmp],
                       check=True, cwd=tmp, env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin"})  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1].strip())
    dump(sys.argv[1], Path(sys.argv[2]))
    print(f"wrote {sys.argv[2]} from {sys.argv[1]}")
