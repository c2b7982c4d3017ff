"""``make test``'s scheduling (``tests/conftest.py``: ``spread_over_workers``), run for real:
pytest-xdist with 2 workers and ``--dist loadgroup`` over a probe file. Tests that share a
module-scoped fixture stay on one worker, so the fixture runs once (a real-Slurm fixture is
minutes of training). pytest 9.2 keeps a node's id where pytest-xdist 3.8's loadgroup does not
write it, and the groups vanished without a word: this test failed then (the pin in
pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).parent / "data" / "xdist_probe" / "probe_groups.py"


def test_a_module_fixture_runs_once_and_its_tests_share_a_worker(tmp_path):
    out = tmp_path / "probe.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", str(PROBE)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PROBE_OUT": str(out)}, cwd=PROBE.parents[3],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line.split() for line in out.read_text().splitlines()]
    setups = [worker for what, worker in lines if what == "setup"]
    shared = {worker for what, worker in lines if what.startswith("shared-")}
    assert len(setups) == 1 and shared == set(setups), lines
    assert len([what for what, _ in lines if what.startswith("alone-")]) == 3
