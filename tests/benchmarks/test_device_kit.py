"""The device kit (benchmarks.device_kit): its resolver's rules on small wheels written here
(faked: stand-ins with only a name, a tag and requirements, to test each rule without PyPI),
and the real kit built from PyPI, checked with no index and installed for CPython 3.12."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from benchmarks import device_kit

REPO = Path(__file__).resolve().parents[2]


def wheel(folder: Path, name: str, version: str, tag: str = "py3-none-any", *requires: str) -> Path:
    """A wheel with just its METADATA: enough for the resolver, never installed."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-{tag}.whl"
    meta = [f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")
    return path


IMAGE = {"torch": Version("2.11.0"), "numpy": Version("2.5.2"), "packaging": None}


def test_a_set_that_resolves_names_what_it_assumes_of_the_image(tmp_path):
    wheel(tmp_path, "fairseq_fixed", "0.12.3.1", "cp312-cp312-manylinux_2_28_x86_64",
          "torch>=1.13", "numpy", "packaging", "omegaconf==2.3.0", 'dataclasses; python_version == "3.6"')  # fmt: skip
    wheel(tmp_path, "omegaconf", "2.3.0")
    res = device_kit.resolve(tmp_path, IMAGE)
    assert res.problems == [] and res.assumed == ["packaging"]  # its version: unknown offline
    assert res.wheels == {"fairseq-fixed": Version("0.12.3.1"), "omegaconf": Version("2.3.0")}


@pytest.mark.parametrize(
    ("wheels", "problem"),
    [
        ([("a", "1", "cp311-cp311-manylinux_2_28_x86_64")], "not installable on CPython 3.12"),
        ([("a", "1", "cp312-cp312-macosx_11_0_arm64")], "not installable on CPython 3.12"),
        ([("a", "1"), ("a", "2")], "two versions of a"),
        ([("a", "1", "py3-none-any", "missing-lib")], "neither in the kit nor on the GPU image"),
        ([("a", "1", "py3-none-any", "torch>=2.12")], "torch 2.11.0 is there"),
        ([("a", "1", "py3-none-any", "b==2"), ("b", "1")], "b 1 is there"),
    ],
)
def test_each_rule_refuses_what_would_not_install(tmp_path, wheels, problem):
    for spec in wheels:
        wheel(tmp_path, *spec)
    assert any(problem in p for p in device_kit.resolve(tmp_path, IMAGE).problems)


def test_the_image_list_is_read_with_its_known_versions():
    image = device_kit.image_packages()
    assert image["torch"] == Version("2.11.0") and image["numpy"] == Version("2.5.2")
    assert "fairseq-fixed" not in image and "hydra-core" not in image  # what the kit carries
    assert image["pyyaml"] is None  # there, at a version not known offline


def test_check_refuses_a_kit_whose_files_differ_from_its_manifest(tmp_path):
    kit = tmp_path / "kit"
    wheel(kit / "wheels", "a", "1")
    (kit / "MANIFEST.json").write_text(json.dumps(device_kit.manifest(kit)))
    assert device_kit.check(kit).problems == []
    (kit / "wheels" / "a-1-py3-none-any.whl").write_bytes(b"changed")
    with pytest.raises(device_kit.KitError, match="not the file the manifest lists"):
        device_kit.check(kit)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.device_kit", "check", str(kit)],
                          capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # PyPI: ~21 MB the first time (pip's cache after)
def test_the_real_kit_builds_resolves_and_installs_for_python_312(corpus, tmp_path):
    kit = tmp_path / "device-kit"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.device_kit", "build", "--out", str(kit), "--data", str(corpus)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    info = json.loads((kit / "MANIFEST.json").read_text())
    assert (
        info["total_mib"] <= device_kit.KIT_LIMIT_MIB and f"{info['total_mib']} MiB" in proc.stdout
    )
    assert "resolve for CPython 3.12 with no index" in proc.stdout
    assert (kit / "data" / "demo-bin" / "dict.txt").is_file()
    assert not kit.with_name("device-kit.tmp").exists()  # built aside, renamed whole
    names = {w.name.split("-")[0] for w in (kit / "wheels").glob("*.whl")}
    assert {
        "fairseq_fixed",
        "hydra_core",
        "omegaconf",
        "antlr4_python3_runtime",
        "hpc_train",
    } <= names
    # what the GPU machine does with it, for its interpreter: no index, into a target folder
    target = tmp_path / "site"
    wheels = [str(w) for w in sorted((kit / "wheels").glob("*.whl"))]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
         str(target), "--python-version", "3.12", "--only-binary=:all:", *wheels],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert (target / "fairseq" / "__init__.py").is_file()
    assert list(target.glob("fairseq/data/data_utils_fast.cpython-312-x86_64-linux-gnu.so"))
