"""``manifest.json``: what a prepared corpus was made from and what it holds, written only once a
step is complete. A rerun trusts a step only when the manifest proves it: the same inputs (by
content: sha256 and size, never by path) and its output still there with the recorded sha256.

The staging directory keeps the manifest of the steps done so far (each split's BPE file); the
corpus gets the whole of it, with the binarized files, as it appears. Nothing in it depends on
the time or the machine, so an interrupted and resumed run writes the same bytes as an
uninterrupted one.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from hpc_core.rundir import atomic_write
from hpc_core.rundir import file_sha256 as sha256

NAME = "manifest.json"
FORMAT = "hpc-train corpus manifest 1"
CONTENT_KEYS = ("sha256", "size", "lines")  # what identifies a part of a source


def file_record(path: Path) -> dict[str, Any]:
    return {"file": path.name, "sha256": sha256(path), "size": path.stat().st_size}


def intact(record: Mapping[str, Any], directory: Path) -> bool:
    """The file a record names is in ``directory`` with the recorded size and sha256."""
    path = directory / str(record.get("file", ""))
    try:
        if not path.is_file() or path.stat().st_size != record.get("size"):
            return False
    except OSError:
        return False
    return sha256(path) == record.get("sha256")


def content(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A split's source by content only: the same bytes give the same output wherever they are."""
    return [{k: p[k] for k in CONTENT_KEYS if k in p} for p in parts]


def encoded_split(
    manifest: Mapping[str, Any], split: str, source: Sequence[Mapping[str, Any]], files: Any
) -> Mapping[str, Any] | None:
    """The manifest's record of ``split`` if it was encoded from this source with the encoder
    ``files`` (their sha256 by name)."""
    record = manifest.get("splits", {}).get(split)
    if not isinstance(record, Mapping) or manifest.get("encoder", {}).get("files") != files:
        return None
    return record if content(record.get("source", [])) == content(source) else None


def same_request(manifest: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    """Would preparing ``request`` (a manifest's inputs: encoder, dictionary, splits' sources)
    give the corpus ``manifest`` describes?"""
    if manifest.get("format") != FORMAT:
        return False
    if manifest.get("encoder", {}).get("files") != request["encoder"]["files"]:
        return False
    if _dictionary_input(manifest) != _dictionary_input(request):
        return False
    ours, theirs = request["splits"], manifest.get("splits", {})
    return set(ours) == set(theirs) and all(
        content(theirs[s].get("source", [])) == content(ours[s]["source"]) for s in ours
    )


def _dictionary_input(manifest: Mapping[str, Any]) -> Any:
    srcdict = manifest.get("dictionary", {}).get("srcdict")
    return None if srcdict is None else srcdict.get("sha256")


def corpus_intact(manifest: Mapping[str, Any], directory: Path) -> bool:
    files = [manifest.get("dictionary", {}).get("dict.txt", {})]
    for record in manifest.get("splits", {}).values():
        files += list(record.get("binarized", {}).get("files", []))
    return all(intact(f, directory) for f in files)


def load(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) and value.get("format") == FORMAT else None


def save(path: Path, manifest: Mapping[str, Any]) -> None:
    atomic_write(path, json.dumps(manifest, indent=2, sort_keys=False) + "\n")


def tools() -> dict[str, str]:
    """Versions of what made the corpus."""
    out = {"python": platform.python_version()}
    for dist in ("hpc-train", "tokenizers", "regex", "fairseq-fixed", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out
