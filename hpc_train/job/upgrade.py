"""The job spec across versions of the toolkit: what the launcher pickles, and how it reads a spec
an earlier version pickled.

submitit pickles the launcher with its spec when a job is submitted, and again at each requeue
on a notice; a job submitted before the toolkit was upgraded (on the shared file system its nodes
run it from) is unpickled by the upgraded code when Slurm starts it again. So:

- the launcher pickles the spec as plain values (``plain``: its sections as dicts, paths as
  paths), never as this version's classes, which a later version may rename;
- it reads back (``read``) plain values, or a ``JobSpec`` object an earlier version pickled:
  the previous version's had most fields flat (``PREVIOUS``: each and where it lives now), its
  levers a tuple of pairs, ``--no-drain`` and ``--evict-stragglers`` in ``watch``. Each
  section is built again from its values, so a field this version added takes its default;
- what it cannot read (a field this version does not know, a value its section refuses) is
  ``Unreadable``: one line the launcher says before it exits, never a traceback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hpc_train.job.container import Mount
from hpc_train.job.fields import SpecError
from hpc_train.job.levers import LeverName, Speed
from hpc_train.job.spec import JobSpec

Sections = dict[str, dict[str, Any]]  # a spec as plain values: section -> field -> value

# the previous version's top-level fields (before issue 43) -> where each lives now; its
# recovery, saves, notify, watch and container sections are this version's, less what moved
PREVIOUS: dict[str, str] = {
    **{name: f"training.{name}" for name in (
        "preset", "data", "save_dir", "max_update", "audit_samples", "extra_args")},
    **{name: f"sizing.{name}" for name in (
        "nodes_min", "nodes_max", "gpus_per_node", "instance_type", "global_batch",
        "batch_per_device", "precision")},
    **{name: f"slurm.{name}" for name in (
        "partition", "time_limit_min", "job_name", "cpus_per_task", "preflight")},
    "watch.no_drain": "recovery.no_drain",
    "watch.evict_stragglers": "recovery.evict_stragglers",
}  # fmt: skip
SECTIONS: dict[str, type] = {f.name: f.metadata["nested"] for f in dataclasses.fields(JobSpec)}
# fields that hold values of a class that is no section: built from their plain values
VALUES: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("container", "mounts"): lambda mounts: tuple(Mount(**values(m)) for m in mounts),
}


class Unreadable(ValueError):
    """A pickled spec this version cannot read; the message is one line for the job's log."""


def values(obj: Any) -> dict[str, Any]:
    """A section's (or a value's) fields as a dict: a dict as it is, an object's own values
    (what an earlier version pickled: its ``__dict__``, whatever its class says now)."""
    return dict(obj) if isinstance(obj, dict) else dict(vars(obj))


def plain(spec: JobSpec) -> Sections:
    """What the launcher pickles: every section as plain values (``dataclasses.asdict``)."""
    return dataclasses.asdict(spec)


def from_previous(flat: dict[str, Any]) -> Sections:
    """The previous version's spec (its top-level fields, some sections) as this version's
    sections. Its levers, ``(name, setting)`` pairs, are the ``speed`` section's fields."""
    out: Sections = {name: {} for name in SECTIONS}
    for name, value in flat.items():
        if name in SECTIONS and name != "speed":
            for field, inner in values(value).items():
                path = f"{name}.{field}"
                section, _, moved = PREVIOUS.get(path, path).partition(".")
                out[section][moved] = inner
        elif name == "speed":
            out["speed"] = dataclasses.asdict(Speed.of({LeverName(n): s for n, s in value}))
        elif name in PREVIOUS:
            section, _, moved = PREVIOUS[name].partition(".")
            out[section][moved] = value
        else:
            raise Unreadable(f"a field this version does not know: {name!r}")
    return out


def build(section: type, given: dict[str, Any], name: str) -> Any:
    """``section`` from plain values, each nested section built likewise (``VALUES``: fields of
    other classes); a field it lacks takes its default."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        if f.name not in given:
            continue
        value = given[f.name]
        if "nested" in f.metadata:
            value = build(f.metadata["nested"], values(value), f"{name}.{f.name}")
        elif (name, f.name) in VALUES:
            value = VALUES[(name, f.name)](value)
        kwargs[f.name] = value
    unknown = sorted(set(given) - {f.name for f in dataclasses.fields(section)})
    if unknown:
        raise Unreadable(f"fields this version does not know: {name}.{', '.join(unknown)}")
    return section(**kwargs)


def read(pickled: Any) -> JobSpec:
    """The spec the launcher was pickled with: plain values (``plain``), this version's
    ``JobSpec``, or an earlier version's (flat: no ``training`` section). ``Unreadable``
    (one line) when it cannot be read."""
    try:
        given = pickled if isinstance(pickled, dict) else values(pickled)
        sections = given if "training" in given else from_previous(given)
        if unknown := sorted(set(sections) - set(SECTIONS)):
            raise Unreadable(f"sections this version does not know: {', '.join(unknown)}")
        spec = JobSpec(**{name: build(SECTIONS[name], values(section), name)
                          for name, section in sections.items()})  # fmt: skip
    except Unreadable:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, SpecError) as err:
        raise Unreadable(f"{type(err).__name__}: {err}") from None
    return spec


def unreadable_line(why: str) -> str:
    """What the launcher says, and exits with, for a spec ``read`` refused."""
    return (
        f"hpc-train: this job's spec was pickled by a version of hpc-train this one cannot read "
        f"({why}); submit the run again with the same --save-dir: it resumes from its last "
        "checkpoint"
    )
