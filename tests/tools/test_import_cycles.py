"""No import cycle in hpc_core, hpc_train and nccl_checks: ``make lint`` runs import-linter, whose
``acyclic_siblings`` contract in pyproject.toml covers every level of the three packages. Here the
same contract is run on a probe package, with a cycle through an import under TYPE_CHECKING (the
kind the spec's Sizing base was, sizing -> spec -> sizing) and without it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def cycle_contract() -> dict[str, Any]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "acyclic_siblings"]
    return contract


def lint(root: Path, modules: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """import-linter with the project's cycle contract, its ancestor the package ``probe``."""
    (root / "probe").mkdir()
    (root / "probe" / "__init__.py").write_text("")
    for name, code in modules.items():
        (root / "probe" / f"{name}.py").write_text(code)
    contract = cycle_contract()
    (root / "lint.toml").write_text(
        '[tool.importlinter]\nroot_packages = ["probe"]\n\n[[tool.importlinter.contracts]]\n'
        f'name = "{contract["name"]}"\ntype = "{contract["type"]}"\nancestors = ["probe"]\n'
        f"depth = {contract['depth']}\n"
    )
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", "lint.toml", "--no-cache"],
        cwd=root, env={"PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_contract_covers_the_three_packages_to_every_level():
    contract = cycle_contract()
    assert set(contract["ancestors"]) == {"hpc_core", "hpc_train", "nccl_checks"}
    assert contract["depth"] >= 5  # hpc_train.launch.launcher is 3 deep


def test_a_cycle_through_a_type_checking_import_breaks_the_contract(tmp_path):
    cycle = {
        "spec": "from probe.sizing import Sizing\nclass Spec(Sizing): ...\n",
        "sizing": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from probe.spec import Spec\nclass Sizing: ...\n",
    }
    broken = lint(tmp_path, cycle)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "BROKEN" in broken.stdout and ".spec -> .sizing" in broken.stdout


def test_one_way_imports_keep_it(tmp_path):
    one_way = {"spec": "from probe.sizing import Sizing\n", "sizing": "class Sizing: ...\n"}
    kept = lint(tmp_path, one_way)
    assert kept.returncode == 0 and "KEPT" in kept.stdout, kept.stdout + kept.stderr
