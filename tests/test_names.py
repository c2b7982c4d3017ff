"""One meaning per name in what a user installs (``hpc_core``, ``hpc_train``, ``nccl_checks``):
no class name defined twice (before: ``Recovery`` the options and the decision, read two lines
apart; ``Watch``, ``Start``, ``Finding`` x3, ``Verdict`` x3, ``Resume`` x3, ``Window`` x3 ...),
and no function called by a bare verb that says nothing of its object (``plan`` x3, ``decide``
x4 before). The code is read, not run (``ast``)."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict

from tests import code_scan

ROOT = code_scan.ROOT
# verbs that name no object: a function called so says neither what it plans nor what it decides
VAGUE = {"plan", "decide"}


def classes() -> dict[str, list[str]]:
    """Every class name of the product (nested ones too) and where each is defined."""
    found: dict[str, list[str]] = defaultdict(list)
    for path, tree in code_scan.sources(ROOT, code_scan.PRODUCT):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{path}:{node.lineno}")
    return dict(found)


def vague_functions() -> list[str]:
    """Every function of the product named by a verb of ``VAGUE``."""
    return sorted(
        f"{path}:{node.lineno} {node.name}"
        for path, tree in code_scan.sources(ROOT, code_scan.PRODUCT)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in VAGUE
    )


def test_no_class_name_is_defined_twice():
    found = classes()
    assert len(found) > 150  # the scan reads the product (a scan of nothing would pass)
    assert {name: places for name, places in found.items() if len(places) > 1} == {}


def test_no_function_is_called_by_a_verb_that_names_no_object():
    assert vague_functions() == []


def test_the_scans_would_find_a_name_twice_and_a_vague_verb(tmp_path, monkeypatch):
    for package, code in (("hpc_core", "class Verdict: ...\n"),
                          ("hpc_train", "def f():\n    class Verdict: ...\n\ndef plan(): ...\n"),
                          ("nccl_checks", "class Other:\n    def decide(self): ...\n")):  # fmt: skip
        (tmp_path / package).mkdir()
        (tmp_path / package / "probe.py").write_text(code)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert classes()["Verdict"] == ["hpc_core/probe.py:1", "hpc_train/probe.py:2"]
    assert vague_functions() == ["hpc_train/probe.py:4 plan", "nccl_checks/probe.py:2 decide"]
