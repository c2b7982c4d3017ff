"""The device kit (issue 36): everything a GPU test machine lacks for the GPU session, in one
git-ignored folder that travels with the work tree (the device tool's ``carry``, 64 MiB with it).

    make device-kit                                      # build, check, print the size
    python -m benchmarks.device_kit build --out .local/device-kit --data .local/data/demo-bin
    python -m benchmarks.device_kit check .local/device-kit
    python -m benchmarks.device_kit install .local/device-kit --target /tmp/site   # on the GPU

What is in it (``KIT_LIMIT_MIB``, said at the end of a build):
- ``wheels/``: CPython 3.12 manylinux x86_64 wheels of what the GPU machine's image lacks
  (``gpu-image-packages.txt``): fairseq-fixed and its needs (``device-kit-cp312.txt``, each pinned
  by the sha256 PyPI served), antlr4-python3-runtime built here from its hash-pinned source
  archive (``device-kit-sdist.txt``: PyPI has no wheel of it), and the project's own wheel;
- ``data/demo-bin``: the demo corpus, binarized here (no fairseq-preprocess run there);
- ``MANIFEST.json``: every file's size and sha256, the commit it was built from.

``check`` proves, with no index, that the wheels resolve as a set on the GPU machine: each wheel
installable on CPython 3.12 manylinux x86_64, one version of each project, every requirement
(markers evaluated for that interpreter) met by a kit wheel or by the image. A requirement met
only by an image package whose version is not known offline is said by name ("assumed"), never
counted as proven. A build is written to ``OUT.tmp`` and renamed when complete: no half kit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from hpc_core.rundir import file_sha256
from hpc_train import cli

HERE = Path(__file__).parent
WHEELS_TXT, SDIST_TXT = HERE / "device-kit-cp312.txt", HERE / "device-kit-sdist.txt"
IMAGE_TXT = HERE / "gpu-image-packages.txt"
KIT_LIMIT_MIB = 60.0
PYTHON = (3, 12)
PYTHON_FULL = "3.12.3"  # the GPU machine's (device tool, KINDS.md)
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(35, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)
PIP_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
MARKERS = {
    "python_version": "3.12", "python_full_version": PYTHON_FULL,
    "implementation_name": "cpython", "platform_python_implementation": "CPython",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
    "os_name": "posix", "extra": "",
}  # fmt: skip


class KitError(RuntimeError):
    """A kit that cannot be built or does not resolve; the message is one line."""


def image_packages(path: Path = IMAGE_TXT) -> dict[str, Version | None]:
    """The GPU image's packages: canonical name -> version (None: not known offline)."""
    out: dict[str, Version | None] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition(" ")
            out[canonicalize_name(name)] = Version(version) if version else None
    return out


def supported_tags() -> set[Tag]:
    return {
        *cpython_tags(PYTHON, abis=["cp312"], platforms=PLATFORMS),
        *compatible_tags(PYTHON, interpreter="cp312", platforms=PLATFORMS),
    }


def wheel_metadata(wheel: Path) -> tuple[list[str], str | None]:
    """(Requires-Dist lines, Requires-Python) of ``wheel``."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(name).decode().splitlines()
    requires = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    python = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Python:")), None)  # fmt: skip
    return requires, python


@dataclass
class Resolution:
    wheels: dict[str, Version] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)  # met by the image at an unknown version


def resolve(wheel_dir: Path, image: dict[str, Version | None]) -> Resolution:
    """Whether ``wheel_dir``'s wheels install as a set on the GPU machine (module docstring)."""
    res, tags, files = Resolution(), supported_tags(), sorted(wheel_dir.glob("*.whl"))
    for wheel in files:
        name, version, _, wheel_tags = parse_wheel_filename(wheel.name)
        if name in res.wheels:
            res.problems.append(f"two versions of {name}: {res.wheels[name]} and {version}")
        res.wheels[name] = version
        if not wheel_tags & tags:
            res.problems.append(f"{wheel.name}: not installable on CPython 3.12 manylinux x86_64")
    for wheel in files:
        requires, python = wheel_metadata(wheel)
        if python and PYTHON_FULL not in Requirement(f"x{python}").specifier:
            res.problems.append(f"{wheel.name} needs Python {python}")
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(MARKERS):
                _meet(req, wheel.name, res, image)
    return res


def _meet(req: Requirement, who: str, res: Resolution, image: dict[str, Version | None]) -> None:
    name = canonicalize_name(req.name)
    have = res.wheels.get(name) if name in res.wheels else image.get(name)
    if name not in res.wheels and name not in image:
        res.problems.append(f"{req} (needed by {who}): neither in the kit nor on the GPU image")
    elif have is None:
        if str(req) not in res.assumed:
            res.assumed.append(str(req))
    elif not req.specifier.contains(have, prereleases=True):
        res.problems.append(f"{req} (needed by {who}): {name} {have} is there")


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise KitError(f"pip {args[0]} failed: {tail[0]}")


def download(dest: Path) -> None:
    """The hash-pinned wheels, the sdist built into a wheel, the project's own wheel."""
    platforms = [arg for p in PIP_PLATFORMS for arg in ("--platform", p)]
    pip("download", "-q", "--no-deps", "--require-hashes", "--only-binary=:all:",
        "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", *platforms,
        "-r", str(WHEELS_TXT), "-d", str(dest))  # fmt: skip
    sdist = dest.parent / "sdist"
    pip("download", "-q", "--no-deps", "--require-hashes", "--no-binary=:all:",
        "-r", str(SDIST_TXT), "-d", str(sdist))  # fmt: skip
    for archive in sorted(sdist.iterdir()):
        pip("wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(archive), "-w", str(dest))  # fmt: skip
    shutil.rmtree(sdist)
    pip("wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(HERE.parent), "-w", str(dest))  # fmt: skip


def manifest(kit: Path) -> dict[str, object]:
    files = sorted(p for p in kit.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    return {
        "built": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit or None,
        "files": {
            str(p.relative_to(kit)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
            for p in files
        },
        "total_mib": round(sum(p.stat().st_size for p in files) / 2**20, 2),
    }


def build(out: Path, data: Path) -> dict[str, object]:
    """Build the kit at ``out`` (through ``out.tmp``); KitError when it cannot, or is too big."""
    if not (data / "dict.txt").is_file():
        raise KitError(f"--data {data}: not a binarized corpus (make demo-data)")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "wheels").mkdir(parents=True)
    download(tmp / "wheels")
    shutil.copytree(data, tmp / "data" / "demo-bin")
    info = manifest(tmp)
    if float(info["total_mib"]) > KIT_LIMIT_MIB:  # type: ignore[arg-type]
        raise KitError(f"the kit is {info['total_mib']} MiB, over its {KIT_LIMIT_MIB:g} MiB")
    (tmp / "MANIFEST.json").write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return info


def check(kit: Path) -> Resolution:
    """The kit's files against its manifest, then ``resolve``; KitError on the first problem."""
    if not (kit / "MANIFEST.json").is_file():
        raise KitError(f"{kit}: no MANIFEST.json (not a kit; make device-kit)")
    listed = json.loads((kit / "MANIFEST.json").read_text())["files"]
    for rel, entry in listed.items():
        path = kit / rel
        if (
            not path.is_file()
            or path.stat().st_size != entry["bytes"]
            or file_sha256(path) != entry["sha256"]
        ):
            raise KitError(f"{path}: missing or not the file the manifest lists")
    res = resolve(kit / "wheels", image_packages())
    if res.problems:
        raise KitError(f"{kit}: {res.problems[0]}" + (f" (+{len(res.problems) - 1} more)" if len(res.problems) > 1 else ""))  # fmt: skip
    return res


def install(kit: Path, target: Path) -> None:
    """Install the kit's wheels into ``target`` with no index (the GPU machine: PYTHONPATH)."""
    wheels = [str(w) for w in sorted((kit / "wheels").glob("*.whl"))]
    if not wheels:
        raise KitError(f"{kit}/wheels: no wheels (make device-kit)")
    pip("install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade", "--target", str(target), *wheels)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(prog="python -m benchmarks.device_kit", description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("build", help="download, build and check the kit")
    b.add_argument("--out", type=Path, default=Path(".local/device-kit"))
    b.add_argument("--data", type=Path, default=Path(".local/data/demo-bin"))
    b.add_argument(
        "--dry-run", action="store_true", help="say what would be fetched; fetch nothing"
    )
    c = sub.add_parser("check", help="the kit's files and wheels, with no index")
    c.add_argument("kit", type=Path)
    i = sub.add_parser("install", help="install the kit's wheels into --target (no index)")
    i.add_argument("kit", type=Path)
    i.add_argument("--target", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        return _run(args)
    except KitError as err:
        print(f"device-kit: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.what == "build" and args.dry_run:
        pinned = [ln.split()[0] for f in (WHEELS_TXT, SDIST_TXT) for ln in f.read_text().splitlines()
                  if ln and not ln.startswith(("#", " "))]  # fmt: skip
        print(f"would fetch (hash-pinned): {', '.join(pinned)}; build the project's wheel; copy {args.data}; into {args.out}")  # fmt: skip
        return 0
    if args.what == "build":
        info = build(args.out, args.data)
        args.kit = args.out
        print(f"device-kit: {args.out}: {len(info['files'])} files, {info['total_mib']} MiB (limit {KIT_LIMIT_MIB:g})")  # type: ignore[arg-type]  # fmt: skip
    if args.what in ("build", "check"):
        res = check(args.kit)
        print(f"device-kit: {len(res.wheels)} wheels resolve for CPython 3.12 with no index; "
              f"assumed on the GPU image at a version not known offline: {', '.join(res.assumed) or 'none'}")  # fmt: skip
        return 0
    install(args.kit, args.target)
    print(f"device-kit: installed {args.kit}/wheels into {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
