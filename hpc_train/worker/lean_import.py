"""fairseq without scikit-learn and SciPy at a rank's start.

``import fairseq`` imports every criterion and task module it ships, and two of them import
scikit-learn and SciPy at module level for metrics only they use: ``sentence_prediction``
(fine-tuning: ``f1_score``, ``matthews_corrcoef``, ``pearsonr``, ``spearmanr``) and
``audio_classification`` (``sklearn.metrics``). Masked-LM pretraining never calls them, yet
every rank of every start paid for them: 2.6 of fairseq's 7.8 s of imports on this 2-core
machine (``python -X importtime``, 2026-11-27), about 1 s of CPU, read from the venv's files
(on FSx, on every node at once).

``deferred()`` imports fairseq with those two packages stood in for: a name fairseq takes from
them (``from sklearn.metrics import f1_score``) is a ``Deferred`` that imports the real package
when it is first called or looked into. The stand-ins live only while fairseq is imported: they
leave ``sys.modules`` after, so any later ``import scipy`` gets the real package.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

DEFERRED = ("sklearn", "scipy")  # what fairseq's fine-tuning criteria and tasks import


class Deferred:
    """A dotted name from a deferred package, imported at its first call or attribute."""

    def __init__(self, dotted: str) -> None:
        self._dotted = dotted

    def resolve(self) -> Any:
        """The real object: the longest importable module prefix, then attributes."""
        parts = self._dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found: Any = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                found = getattr(found, attr)
            return found
        raise ImportError(f"cannot import {self._dotted}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.resolve(), attr)

    def __repr__(self) -> str:
        return f"<deferred {self._dotted}>"


class StandIn(types.ModuleType):
    """A deferred package or module in ``sys.modules`` while fairseq is imported."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Deferred(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = frozenset(roots)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.partition(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandIn(spec.name)
        module.__path__ = []  # a package: its submodules come through this finder too
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing runs: the stand-in's names resolve at their first use."""


@contextlib.contextmanager
def deferred(roots: Sequence[str] = DEFERRED) -> Iterator[None]:
    """Within: ``roots`` (packages not yet imported) are stand-ins. After: gone again."""
    roots = [r for r in roots if r not in sys.modules]
    finder = _Finder(roots)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, StandIn)]:
            del sys.modules[name]


def import_fairseq() -> None:
    """``import fairseq`` (all its criteria and tasks) with scikit-learn and SciPy deferred."""
    with deferred():
        import fairseq  # noqa: F401
