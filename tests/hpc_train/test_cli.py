"""Shared CLI behaviour: help shows defaults and examples; internal steps stay out of help."""

from __future__ import annotations

import pytest

from hpc_train import chaos, cli


def test_help_shows_defaults_but_not_none_or_false():
    p = cli.Parser(prog="x")
    p.add_argument("--hold", type=int, default=20, help="seconds")
    p.add_argument("--node", help="node name")
    p.add_argument("--fast", action="store_true", help="go")
    text = p.format_help()
    assert "seconds (default: 20)" in text
    assert "node name\n" in text and "go\n" in text


def test_usage_errors_are_one_line_and_exit_2(capsys):
    p = cli.Parser(prog="x")
    p.add_argument("--n", type=int)
    with pytest.raises(SystemExit) as exit_:
        p.parse_args(["--n", "many"])
    assert exit_.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_chaos_help_lists_examples_and_hides_its_internal_step():
    text = chaos.build_parser().format_help()
    assert "examples:" in text and "JOBID kill-node --stop-slurmd" in text
    assert chaos.KILL_HERE not in text and "SUPPRESS" not in text


@pytest.mark.fairseq  # imports real fairseq in a fresh interpreter (about 4 s)
def test_importing_fairseq_through_hpc_train_says_nothing_about_tensorboardx():
    import subprocess
    import sys

    code = "import hpc_train.worker.checkpoints as c; c.allow_fairseq_globals()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "tensorboardX" not in proc.stderr + proc.stdout
