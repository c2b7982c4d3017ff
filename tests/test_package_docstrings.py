"""Each package's docstring names every module of the package (a module added is said there)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(
    init.parent
    for top in ("hpc_core", "hpc_train", "nccl_checks")
    for init in (ROOT / top).rglob("__init__.py")
)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_docstring_names_each_module(package: Path):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = [
        p.stem for p in sorted(package.glob("*.py")) if p.stem not in ("__init__", "__main__")
    ]
    unnamed = [m for m in modules if not re.search(rf"\b{m}\b", doc)]
    assert unnamed == []
