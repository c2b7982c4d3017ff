"""Reading the project's code as the vocabulary tests do (``ast``, never run): its modules, and
what a call calls. Used by tests/hpc_train/test_ledger_kinds.py, test_vocabulary.py and
test_names.py."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("hpc_core", "hpc_train", "nccl_checks")  # what a user installs
PACKAGES = (*PRODUCT, "benchmarks")


def sources(
    root: Path = ROOT, packages: Sequence[str] = PACKAGES
) -> Iterator[tuple[str, ast.Module]]:
    """(path relative to ``root``, its syntax tree) for every module of ``packages``."""
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            yield str(path.relative_to(root)), ast.parse(path.read_text(), str(path))


def name_of(func: ast.expr) -> str | None:
    """The called name: ``note``, ``here.note``, ``ledger.record`` -> note, note, record."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def callee_names(func: ast.expr) -> set[str]:
    """Every name a call may call: ``(here.deputy_note if deputy else here.note)(...)`` both."""
    if isinstance(func, ast.IfExp):
        return callee_names(func.body) | callee_names(func.orelse)
    name = name_of(func)
    return {name} if name else set()


def constants(node: ast.expr, values: set[str]) -> list[str]:
    """The strings of ``values`` a node spells: a constant, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and node.value in values:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [
            str(e.value) for e in node.elts if isinstance(e, ast.Constant) and e.value in values
        ]
    return []


def params(tree: ast.Module, name: str) -> dict[str, int]:
    """Functions and classes of a module that take a parameter ``name`` (callee -> its position
    among the call's arguments: a method's ``self`` is not one)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            names = [a.arg for a in node.args.args]
            if names[:1] in (["self"], ["cls"]):
                names = names[1:]
        elif isinstance(node, ast.ClassDef):  # a dataclass's fields, in order
            names = [s.target.id for s in node.body
                     if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]  # fmt: skip
        else:
            continue
        if name in names:
            out[node.name] = names.index(name)
    return out
