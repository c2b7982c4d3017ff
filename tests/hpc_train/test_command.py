"""`hpc-train VERB`: one command over the toolkit's command lines."""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from hpc_train import command


def test_every_verb_runs_a_module_with_a_main():
    for module, _ in command.VERBS.values():
        assert callable(importlib.import_module(module).main)


def test_help_lists_every_verb_and_examples(capsys):
    assert command.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {verb} " in out for verb in command.VERBS)
    assert "examples:" in out and "hpc-train submit --preset tiny" in out


def test_an_unknown_verb_is_one_line_and_exit_2(capsys):
    assert command.main(["trian"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_verb_passes_its_arguments_and_exit_status_through(capsys):
    assert command.main(["env", "--instance-type", "p5.48xlarge"]) == 0
    assert "FI_EFA_USE_DEVICE_RDMA=1" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        command.main(
            ["submit", "--preset", "tiny", "--nodes", "zero", "--data", "d", "--save-dir", "s"]
        )
    assert bad.value.code == 2


def test_installed_as_the_hpc_train_console_script():
    (script,) = entry_points(group="console_scripts", name="hpc-train")
    assert script.value == "hpc_train.command:main"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from hpc_train.command import main; raise SystemExit(main())",
            "--help",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "verbs:" in proc.stdout
