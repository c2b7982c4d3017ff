"""PyPI wheels the bootstrap tests compile or link with, pinned by hash and cached on disk.

A requirements file here names exact versions with ``--hash`` lines; ``installed`` puts them into
~/.cache/hpc-train-tests/<name>-<first 16 hex of the file's sha256> with ``pip install --target
--require-hashes --no-deps --only-binary=:all:`` the first time (the only step that needs PyPI),
whole or not at all, and returns that folder. Another pin is another folder; a rerun costs nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

CACHE_ROOT = Path.home() / ".cache" / "hpc-train-tests"


def pins(requirements: Path) -> dict[str, str]:
    """{distribution name: version} of a hash-pinned requirements file."""
    found = {}
    for line in requirements.read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, _, rest = line.partition("==")
            found[name.strip()] = rest.split()[0]
    return found


def installed(requirements: Path, name: str) -> Path:
    """The folder holding ``requirements``' wheels, installed with their hashes checked."""
    key = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    target = CACHE_ROOT / f"{name}-{key}"
    if not (target / ".complete").is_file():
        CACHE_ROOT.mkdir(parents=True, exist_ok=True)
        partial = CACHE_ROOT / f"{name}-{key}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        pinned = ["--no-deps", "--only-binary=:all:", "--require-hashes", "-r", str(requirements)]
        subprocess.run([*pip, *pinned, "--target", str(partial)], check=True, timeout=600)
        (partial / ".complete").touch()
        try:
            partial.rename(target)  # whole or not at all
        except OSError:  # there already: another worker's, or one made before the marker existed
            shutil.rmtree(partial)
            (target / ".complete").touch()  # both were renamed into place whole
    return target
