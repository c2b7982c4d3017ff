"""fairseq imported without scikit-learn and SciPy (``worker.lean_import``): each check in a
fresh interpreter (what a rank is), since this process may have imported them already."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_stand_ins_resolve_at_first_use_and_leave_nothing_behind():
    """No fairseq: a package imported inside ``deferred`` is a stand-in there, its names resolve
    to the real objects when called or looked into, and the stand-ins are gone after."""
    out = _python("""
        import sys
        from hpc_train.worker import lean_import
        with lean_import.deferred(("colorsys",)):
            import colorsys
            from colorsys import rgb_to_hsv
            assert isinstance(colorsys, lean_import.StandIn), colorsys
        assert "colorsys" not in sys.modules
        assert rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)  # the real function, imported now
        import colorsys as real
        assert not isinstance(real, lean_import.StandIn) and real.hls_to_rgb(0, 0, 0)
        print("ok")
    """)
    assert out.strip() == "ok"


def test_an_already_imported_package_is_never_stood_in_for():
    out = _python("""
        import colorsys, sys
        from hpc_train.worker import lean_import
        with lean_import.deferred(("colorsys",)):
            from colorsys import rgb_to_hsv
        assert rgb_to_hsv is colorsys.rgb_to_hsv
        print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.fairseq
def test_fairseq_imports_without_sklearn_and_scipy_and_their_metrics_still_compute():
    out = _python("""
        import sys
        from hpc_train.worker import lean_import
        lean_import.import_fairseq()
        import fairseq_cli.train
        from fairseq.criterions import sentence_prediction as sp
        print(sorted(m for m in ("sklearn", "scipy") if m in sys.modules))
        print(round(sp.f1_score([0, 1, 1], [0, 1, 0]), 4), round(sp.pearsonr([1, 2, 3], [1, 2, 4])[0], 4))
    """)
    before, metrics = out.strip().splitlines()[-2:]
    assert before == "[]"  # fairseq and its training entry point, neither package
    assert metrics == "0.6667 0.982"  # called: the real scikit-learn and SciPy


@pytest.mark.fairseq
def test_a_ranks_whole_training_run_never_imports_them(corpus, tmp_path, tiny_run):
    """The worker trains 3 tiny updates (one CPU process) and saves; at its exit neither
    package was ever imported."""
    seen = tmp_path / "modules.txt"
    prelude = (
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(seen)!r}, 'w').write("
        "' '.join(m for m in ('sklearn', 'scipy') if m in sys.modules) or 'none'))"
    )
    tiny_run(corpus, tmp_path / "run", 3, prelude=prelude)
    assert (tmp_path / "run" / "checkpoint_last.pt").exists()
    assert seen.read_text() == "none"
