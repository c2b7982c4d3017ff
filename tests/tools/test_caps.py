"""``tools/caps.py``, the size caps ``make lint`` runs: a function over 60 lines or a class over
300 is one line ``path:line name length`` and exit 1; the project's packages hold them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools import caps

REPO = Path(__file__).resolve().parents[2]


def function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines (its def line included)."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}():\n{body}{indent}    return 0\n"


def long_class(name: str, lines: int) -> str:
    """A class of exactly ``lines`` lines, of short methods."""
    methods = "".join(function(f"m{i}", 10, "    ") for i in range((lines - 1) // 10))
    rest = "".join(f"    y{i} = {i}\n" for i in range(lines - 1 - (lines - 1) // 10 * 10))
    return f"class {name}:\n{methods}{rest}"


def test_a_long_function_and_a_long_class_are_flagged_one_line_each(tmp_path):
    (tmp_path / "pkg").mkdir()
    code = function("fits", 60) + function("too_long", 61) + long_class("Fits", 300)
    (tmp_path / "pkg" / "a.py").write_text(code)
    (tmp_path / "pkg" / "b.py").write_text(long_class("Big", 301) + function("ok", 3))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "caps.py"), "pkg"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == ["pkg/a.py:61 too_long 61", "pkg/b.py:1 Big 301"]


def test_a_method_is_a_function_too(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("class Small:\n" + function("long_method", 61, "    "))
    assert list(caps.offenders(path)) == [f"{path}:2 long_method 61"]


def test_nothing_over_the_caps_exits_0(tmp_path, capsys):
    (tmp_path / "ok.py").write_text(function("fits", 60) + long_class("Fits", 300))
    assert caps.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


def test_the_projects_packages_hold_the_caps():
    roots = [str(REPO / p) for p in ("hpc_core", "hpc_train", "nccl_checks", "benchmarks")]
    assert [line for path in caps.python_files(roots) for line in caps.offenders(path)] == []
