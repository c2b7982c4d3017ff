"""The size caps, as a lint step (``make lint``): no function over 60 lines, no class over 300.

    python tools/caps.py hpc_core hpc_train nccl_checks benchmarks

A function or class is counted from its ``def`` or ``class`` line to its last line (``ast``'s
``lineno`` to ``end_lineno``: docstring, comments and blank lines inside it included, decorators
not); nested functions and methods are checked on their own too. Prints one line per offender,
``path:line name length``, and exits 1 when there is one; 0 otherwise.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

FUNCTION_CAP = 60
CLASS_CAP = 300


def offenders(path: Path) -> Iterator[str]:
    """``path:line name length`` for each function over ``FUNCTION_CAP`` lines and each class
    over ``CLASS_CAP`` in one file, in the order they start."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0))
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            cap = FUNCTION_CAP
        elif isinstance(node, ast.ClassDef):
            cap = CLASS_CAP
        else:
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > cap:
            yield f"{path}:{node.lineno} {node.name} {length}"


def python_files(roots: Sequence[str]) -> list[Path]:
    """The ``.py`` files under each root (a file counts as itself), sorted."""
    files: set[Path] = set()
    for root in map(Path, roots):
        files.update([root] if root.is_file() else root.rglob("*.py"))
    return sorted(files)


def main(argv: Sequence[str] | None = None) -> int:
    roots = list(sys.argv[1:] if argv is None else argv)
    if not roots:
        print("usage: python tools/caps.py DIR|FILE ...", file=sys.stderr)
        return 2
    found = [line for path in python_files(roots) for line in offenders(path)]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
