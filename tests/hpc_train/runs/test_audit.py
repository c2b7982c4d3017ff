"""The check of ``--audit-samples`` (``hpc_train.runs.audit``) on lines written here: what a
start trained after the save the next one resumed from does not count; samples trained 0 or 2+
times in an epoch are named. Pure: no fairseq."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from hpc_core.rundir import RunDir
from hpc_train import contract, submit
from hpc_train.contract import AuditLine, WorkerEnv
from hpc_train.job import options
from hpc_train.job.sizing import Sizing
from hpc_train.job.spec import JobSpec, Training
from hpc_train.launch import launcher
from hpc_train.runs import audit


def step(update: int, ids: list[int], t: float, epoch: int = 1) -> AuditLine:
    return AuditLine(epoch, update, position=update, t=t, ids=ids)


def resumed(update: int, t: float, epoch: int = 1) -> AuditLine:
    return AuditLine(epoch, update, position=update, t=t, resumed=True)


def end(update: int, t: float, epoch: int = 1) -> AuditLine:
    return AuditLine(epoch, update, position=update, t=t, end=True)


def test_a_resume_undoes_what_the_start_before_trained_after_its_save():
    lines = [
        resumed(0, 0.0),
        step(1, [0, 1], 1.0),
        step(2, [2, 3], 2.0),
        step(3, [4, 5], 3.0),  # lost: the next start resumed from update 2
        resumed(2, 4.0),
        step(3, [4, 5], 5.0),
        end(3, 5.5),
    ]
    (epoch,) = audit.audit_epochs(lines, {1: list(range(6))})
    assert epoch.exact and epoch.complete and (epoch.seen, epoch.planned) == (6, 6)


def test_samples_twice_or_never_are_named():
    lines = [resumed(0, 0.0), step(1, [0, 1], 1.0), resumed(1, 2.0), step(2, [1, 2], 3.0)]
    lines += [end(2, 4.0)]
    (epoch,) = audit.audit_epochs(lines, {1: [0, 1, 2, 3]})
    assert (epoch.repeated, epoch.missing, epoch.exact) == ({1: 2}, [3], False)
    assert "1 never: 3" in epoch.describe() and "NOT EXACTLY ONCE" in epoch.describe()


def test_an_epoch_in_progress_misses_nothing_yet():
    lines = [resumed(0, 0.0), step(1, [0, 1], 1.0), end(1, 2.0), step(2, [5], 3.0, epoch=2)]
    first, second = audit.audit_epochs(lines, {1: [0, 1], 2: [4, 5]})
    assert first.exact and first.complete
    assert second.exact and not second.complete and second.missing == []


def test_the_files_of_every_rank_and_start_read_back(tmp_path):
    run = RunDir(tmp_path)
    files = {
        run.audit_file("41-0", 0): [resumed(0, 0.0), step(1, [0], 1.0), step(2, [2], 3.0)],
        run.audit_file("41-0", 1): [resumed(0, 0.1), step(1, [1], 1.1), step(2, [3], 3.1)],
        run.audit_file("41-1", 0): [resumed(1, 5.0), step(2, [2, 3], 6.0), end(2, 7.0)],
    }
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(asdict(line)) + "\n" for line in lines) + '{"cut')
    run.audit_plan(1).write_text(json.dumps([0, 1, 2, 3]))
    (epoch,) = audit.audit(tmp_path)
    assert epoch.exact and epoch.complete and epoch.seen == 4
    assert audit.main([str(tmp_path)]) == 0
    assert audit.main([str(tmp_path / "nothing")]) == 1


def test_the_flag_reaches_the_ranks():
    assert WorkerEnv.from_env(WorkerEnv(audit_samples=True).to_env()).audit_samples
    assert not WorkerEnv.from_env(WorkerEnv().to_env()).audit_samples
    parser = submit.build_parser()
    argv = ["--data", "d", "--save-dir", "s", "--preset", "tiny"]
    assert options.spec_from_options(
        parser.parse_args([*argv, "--audit-samples"])
    ).training.audit_samples
    assert not options.spec_from_options(parser.parse_args(argv)).training.audit_samples


class EnvTorchrun(launcher.Launcher):
    """torchrun replaced by ``python -c`` (a fake: only the environment the launcher passes is
    under test) that writes the audit flag it was given to a file."""

    def torchrun_command(self, start: launcher.Start, nproc: int, args: list[str]) -> list[str]:
        out = self.spec.training.save_dir / "env.txt"
        name = contract.AUDIT_SAMPLES
        body = f"import os; open({str(out)!r}, 'w').write(os.environ.get({name!r}, ''))"
        return [sys.executable, "-c", body]


@pytest.mark.parametrize("asked", [False, True])
def test_the_launcher_passes_the_flag(tmp_path, fake_slurm, asked):
    spec = JobSpec(
        Training("tiny", Path("/d"), tmp_path, audit_samples=asked), sizing=Sizing(gpus_per_node=0)
    )
    EnvTorchrun(spec).run(launcher.Start("41", 0, 1, "n1", 0), gpus=0)
    assert (tmp_path / "env.txt").read_text() == ("1" if asked else "")
