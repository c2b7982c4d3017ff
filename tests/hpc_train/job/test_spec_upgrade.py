"""A job submitted before an upgrade of the toolkit and started again after it: submitit pickled
the launcher with its spec (``DelayedSubmission``, cloudpickle) and the upgraded code unpickles
it on every node. It loads as the same run, or the task ends with one line, never a traceback.

The previous version's pickle is a golden file, ``tests/golden/upgrade/spec-7911bf5.pkl``: made
by ``tools/old_spec_pickle.py`` from the code of main's 7911bf5 (the last commit before the spec
was nested), with that version's own parser and submitit's own dump, from a submit command line
that sets every option away from its default (``ARGV``). A golden file rather than a pickle made
at test time from ``git show``: it is exactly what a submitted job's folder holds, and the suite
runs where the old commit is not (a fresh shallow clone, no git history)."""

from __future__ import annotations

import copyreg
import dataclasses
import os
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from submitit.core.utils import DelayedSubmission, JobPaths

from hpc_train import submit
from hpc_train.job import options, upgrade
from hpc_train.job.levers import Speed
from hpc_train.job.spec import JobSpec, Recovery, Training
from hpc_train.launch.launcher import Launcher
from tools.old_spec_pickle import ARGV

PREVIOUS = Path(__file__).resolve().parents[2] / "golden" / "upgrade" / "spec-7911bf5.pkl"


def parsed(argv: tuple[str, ...]) -> JobSpec:
    """The spec today's submit builds from ``argv`` (fairseq's arguments after ``--``)."""
    cut = argv.index("--")
    args = submit.build_parser().parse_args(list(argv[:cut]))
    return options.spec_from_options(args, argv[cut + 1 :])


class AsPickled:
    """Pickles as a ``Launcher`` unpickled with ``state`` (its ``__setstate__`` runs on load):
    what an unknown version of the toolkit could have written."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def __reduce__(self) -> tuple[Any, ...]:
        return copyreg._reconstructor, (Launcher, object, None), self.state


def test_a_job_pickled_by_the_previous_version_loads_as_the_same_run():
    """Every option of the previous version's spec lands where this version keeps it: the
    loaded spec equals the one today's submit builds from the same command line."""
    launcher = DelayedSubmission.load(PREVIOUS).function
    assert isinstance(launcher, Launcher) and launcher._unreadable is None
    assert launcher.spec == parsed(ARGV)
    spec = launcher.spec
    assert (spec.recovery.no_drain, spec.recovery.evict_stragglers) == (True, True)  # were watch's
    assert spec.speed == Speed(compile="on", pack="off")  # were ("compile", "on"), ("pack", "off")
    assert spec.sizing.nodes_arg == "2-4" and spec.training.extra_args == ("--seed", "3")


def test_the_launcher_pickles_the_spec_as_plain_values_and_reads_it_back(tmp_path):
    """What submitit pickles names no class of the job package (a later version may rename
    them): the spec's sections are dicts, its paths paths; read back, the same spec."""
    spec = parsed(ARGV)
    blob = pickle.dumps(Launcher(spec))
    names = {arg for op, arg, _pos in pickletools.genops(blob) if op.name == "SHORT_BINUNICODE"}
    assert "hpc_train.launch.launcher" in names and "Launcher" in names
    assert not {n for n in names if n.startswith("hpc_train.job")}
    assert pickle.loads(blob).spec == spec
    DelayedSubmission(Launcher(spec)).dump(tmp_path / "job.pkl")  # submitit's own dump
    assert DelayedSubmission.load(tmp_path / "job.pkl").function.spec == spec


def test_a_field_or_a_section_the_pickle_lacks_takes_its_default():
    """A spec pickled before a field (or a section) existed: the field takes its default."""
    plain = upgrade.plain(parsed(ARGV))
    del plain["recovery"]["no_drain"], plain["speed"]
    spec = pickle.loads(pickle.dumps(AsPickled({"spec": plain}))).spec
    assert spec.recovery.no_drain is Recovery().no_drain and spec.speed == Speed()
    assert spec.recovery.max_restarts == 5  # the rest as pickled


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda p: p["recovery"].update(warp_drive=True), "recovery.warp_drive"),
        (lambda p: p.update(telemetry={"x": "y"}), "sections this version does not know"),
        (lambda p: p["training"].pop("preset"), "missing 1 required positional argument"),
        (lambda p: p.update(training="not a section"), "TypeError: vars()"),
        (lambda p: p["saves"].update(interval="often"), "SpecError: --save-interval 'often'"),
    ],
)
def test_a_spec_this_version_cannot_read_is_unreadable_in_one_line(change, said):
    plain = upgrade.plain(parsed(ARGV))
    change(plain)
    with pytest.raises(upgrade.Unreadable, match=said) as refused:
        upgrade.read(plain)
    assert "\n" not in str(refused.value)


def test_a_job_it_cannot_read_ends_its_task_with_one_line_never_a_traceback(tmp_path):
    """submitit's own entry point (what srun runs on each node) on a job folder whose pickle
    holds a spec this version cannot read: the task exits 1 with the one line on stderr and
    no traceback; nothing is trained or requeued (no Slurm here: the task never asks it)."""
    training = dataclasses.asdict(parsed(ARGV).training)  # as the previous version had it, flat
    flat = {**{k: v for k, v in training.items() if k in upgrade.PREVIOUS}, "warp_drive": True}
    folder = tmp_path / "slurm"
    folder.mkdir()
    DelayedSubmission(AsPickled({"spec": flat})).dump(JobPaths(folder, "41", 0).submitted_pickle)
    env = {
        **os.environ, "SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "41", "SLURM_NTASKS": "1",
        "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n1",
        "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
    }  # fmt: skip
    done = subprocess.run([sys.executable, "-u", "-m", "submitit.core._submit", str(folder)],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    line = upgrade.unreadable_line("a field this version does not know: 'warp_drive'")
    assert done.stderr.strip().splitlines()[-1] == line
    assert not JobPaths(folder, "41", 0).result_pickle.exists()  # it never ran


def test_training_is_the_one_section_without_defaults():
    """The pickle's required values: what to train, on what, where it is saved."""
    required = [f.name for f in dataclasses.fields(Training) if f.default is dataclasses.MISSING]
    assert required == ["preset", "data", "save_dir"]
