"""Where in a cluster YAML a ParallelCluster finding belongs.

ParallelCluster's validators report a message and a level, not a location. We know which config
resource registered each validator (validate.py records it) and the arguments it was given; this
module turns that into a YAML path such as `Scheduling.SlurmQueues[0].ComputeResources[0].MinCount`:

1. the resource's own path, found by walking the loaded config next to the YAML document;
2. narrowed to the keys under it whose value is an argument of the validator (argument
   `efa_enabled=True` matches `...Efa.Enabled: true`; an argument that is itself a resource
   matches that resource's path).

Pure functions of the document and the loaded objects; no AWS, no pcluster import.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import yaml

Path = tuple[str | int, ...]

# Attribute names of pcluster resources that differ from their YAML keys.
_ALIASES = {"queues": "SlurmQueues", "settings": "SlurmSettings"}


def format_path(path: Path) -> str:
    """`('Scheduling', 'SlurmQueues', 0, 'Name')` -> `Scheduling.SlurmQueues[0].Name`."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(top level)"


def pascal(name: str) -> str:
    """`min_count` -> `MinCount` (how pcluster's schema names a YAML key after an attribute)."""
    return "".join(word[:1].upper() + word[1:] for word in name.split("_"))


def resolve(doc: Any, path: Path) -> Path:
    """The longest prefix of `path` present in `doc`.

    pcluster flattens `FsxLustreSettings`, `EbsSettings`, ... into the storage resource, so a key
    missing from a mapping is also looked for inside its one `*Settings` child.
    """
    node: Any = doc
    found: tuple[str | int, ...] = ()
    for part in path:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                break
            node, found = node[part], (*found, part)
            continue
        if not isinstance(node, Mapping):
            break
        if part not in node:
            settings = [k for k, v in node.items() if str(k).endswith("Settings") and part in v]
            if len(settings) != 1:
                break
            node, found = node[settings[0]], (*found, settings[0])
        node, found = node[part], (*found, part)
    return found


def resource_paths(config: Any, doc: Any) -> dict[int, Path]:
    """id(resource) -> YAML path, for every pcluster Resource reachable from `config`."""
    from pcluster.config.common import Resource  # only called with pcluster loaded

    paths: dict[int, Path] = {}

    def walk(resource: Any, path: Path) -> None:
        if id(resource) in paths:
            return
        paths[id(resource)] = resolve(doc, path)
        for attr, value in vars(resource).items():
            if attr.startswith("_"):
                continue
            key = _ALIASES.get(attr, pascal(attr))
            if isinstance(value, Resource):
                walk(value, (*path, key))
            elif isinstance(value, list):
                items = _node(doc, resolve(doc, (*path, key)))
                for index, item in enumerate(value):
                    if isinstance(item, Resource):
                        walk(item, (*path, key, _list_index(item, index, items)))

    walk(config, ())
    return paths


def locate(
    doc: Any, owner: Path, args: Mapping[str, Any], paths: Mapping[int, Path]
) -> tuple[Path, tuple[Path, ...]]:
    """(where, fields): the narrowest path holding the validator's arguments, and those keys.

    `owner` is the path of the resource that registered the validator; `fields` are relative to
    `where` (empty when `where` is the one matching key itself or nothing matched).
    """
    matched: list[Path] = []
    leaves = list(_leaves(_node(doc, owner), owner))
    for name, value in args.items():
        for path in _arg_paths(name, value, leaves, paths):
            if path not in matched:
                matched.append(path)
    if len(matched) > 1:  # a Name that only identifies the resource is not the culprit
        matched = [m for m in matched if m[-1] != "Name"] or matched
    if not matched:
        return owner, ()
    where = _common_prefix(matched)
    if len(matched) == 1:
        return where, ()
    return where, tuple(m[len(where) :] for m in matched)


def describe(where: Path, fields: Sequence[Path]) -> str:
    """`ComputeResources[0]` + (MinCount, MaxCount) -> `...ComputeResources[0].{MinCount, MaxCount}`."""
    if not fields:
        return format_path(where)
    inner = ", ".join(format_path(f) for f in fields)
    return f"{format_path(where)}.{{{inner}}}" if where else f"{{{inner}}}"


def line_of(text: str, path: Path) -> int | None:
    """1-based line of the YAML node at `path` (a mapping key's own line), None if absent."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in path:
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        elif isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if pair is None:
                return line
            line, node = pair[0].start_mark.line + 1, pair[1]
        else:
            return line
    return line


def _arg_paths(
    name: str, value: Any, leaves: Sequence[tuple[Path, Any]], paths: Mapping[int, Path]
) -> Iterator[Path]:
    if id(value) in paths:
        yield paths[id(value)]
        return
    if isinstance(value, list):
        for item in value:
            if id(item) in paths:
                yield paths[id(item)]
        return
    if value is None or not isinstance(value, str | int | float | bool):
        return
    key = pascal(name)
    for path, leaf in leaves:
        if type(leaf) is type(value) and leaf == value and key in _tails(path):
            yield path


def _tails(path: Path) -> set[str]:
    """Names a key could be given as an argument: `Efa.Enabled` -> {Enabled, EfaEnabled}."""
    keys = [p for p in path if isinstance(p, str)]
    return {"".join(keys[i:]) for i in range(len(keys))}


def _leaves(node: Any, path: Path) -> Iterator[tuple[Path, Any]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _leaves(value, (*path, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))
    else:
        yield path, node


def _node(doc: Any, path: Path) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _list_index(item: Any, index: int, items: Any) -> int:
    """A resource's index in the YAML list: by its Name (pcluster reorders storage), else as is."""
    name = getattr(item, "name", None)
    if isinstance(items, list) and name is not None:
        for yaml_index, entry in enumerate(items):
            if isinstance(entry, Mapping) and entry.get("Name") == name:
                return yaml_index
    return index


def _common_prefix(paths: Sequence[Path]) -> Path:
    prefix = paths[0]
    for path in paths[1:]:
        size = 0
        while size < min(len(prefix), len(path)) and prefix[size] == path[size]:
            size += 1
        prefix = prefix[:size]
    return prefix
