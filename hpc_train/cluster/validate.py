"""Check a cluster config with ParallelCluster's own schema and validators, offline.

    load   pcluster's ClusterSchema (ImageBuilderSchema for a `pcluster build-image` config):
           unknown keys, types, enums, required keys
    check  the ~110 validators `pcluster create-cluster` runs (MinCount <= MaxCount, queue names,
           EFA support per instance type, FSx capacity, the AMI's NVIDIA driver, public IPs on
           EFA subnets, capacity reservations, ...), against a fake AWS account no kinder than
           AWS (moto, see fake_aws.py) so no credentials or network are needed; skipped as
           `--suppress-validators` asks, with pcluster's syntax (ALL, type:NAME)
    warn   settings pcluster accepts but ignores (NO_EFFECT: GdrSupport); custom Slurm settings
           that would drop a setting ParallelCluster writes into slurm.conf itself, compared
           key by key for option lists (slurm_conf.py)
    update pcluster's ConfigPatch on two configs: may `pcluster update-cluster` go from one to
           the other (update_check)

Each finding carries the YAML path it belongs to (yaml_paths.py). What only the real account can
say is listed by name (Report.not_checked), and so is each validator whose AWS call the fake
account could not answer (fake_aws.Gap): its verdict is dropped, never shown as the config's.
What the caller states about the account is listed as assumed (Report.assumed). Needs the `aws`
extra.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import yaml

from hpc_train.cluster import slurm_conf, yaml_paths
from hpc_train.cluster.render import placeholders_in

if TYPE_CHECKING:
    from hpc_train.cluster.fake_aws import AccountFacts, Gap

INSTALL_HINT = "pip install -e '.[aws]'"
LEVELS = ("ERROR", "WARNING", "INFO")


# Settings ParallelCluster still accepts but ignores: `validate` warns, naming them.
NO_EFFECT = {
    "GdrSupport": (
        "GdrSupport has had no effect since ParallelCluster 3.0.2: GPUDirect RDMA is used wherever "
        "the instance type and OS support it (ParallelCluster user guide, Scheduling section, "
        "Efa/GdrSupport). Remove it"
    ),
}
_SUPPRESS = re.compile(r"ALL|type:[A-Za-z0-9]+")


class BadSuppression(ValueError):
    """A --suppress-validators expression pcluster would not take, or names no validator."""


class NotCheckableOffline(Exception):
    """The config names something whose checks need the real account (an existing file system)."""


class UnreadableConfig(Exception):
    """The file cannot be checked at all: missing, not YAML, not a mapping, or still a template."""


class MissingExtra(Exception):
    """aws-parallelcluster / moto are not installed."""


@dataclass(frozen=True)
class ConfigFinding:
    level: str  # ERROR, WARNING or INFO (ParallelCluster's FailureLevel names)
    path: str  # YAML path, e.g. Scheduling.SlurmQueues[0].ComputeResources[0].MinCount
    message: str
    validator: str  # ParallelCluster validator class, or ClusterSchema for schema errors
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.path} (line {self.line})" if self.line else self.path
        return f"{self.level:<7} {where}: {self.message} [{self.validator}]"


@dataclass
class Report:
    findings: list[ConfigFinding] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # validator -> why it did not run
    validators_run: int = 0
    ran: set[str] = field(default_factory=set)  # names of the validators that ran
    refused: list[str] = field(default_factory=list)  # network attempts the fake account stopped
    suppressed: list[str] = field(default_factory=list)  # validators skipped because asked to
    not_checked: list[str] = field(default_factory=list)  # only the real account can say
    assumed: list[str] = field(default_factory=list)  # facts the caller stated (AccountFacts)
    slurm_kept: list[str] = field(default_factory=list)  # ParallelCluster's settings kept
    slurm_replaced: list[str] = field(default_factory=list)  # its option lists given new values

    @property
    def errors(self) -> list[ConfigFinding]:
        return [f for f in self.findings if f.level == "ERROR"]


def require_extra() -> None:
    """Raise MissingExtra with the install command when pcluster or moto cannot be imported."""
    try:
        import moto  # noqa: F401
        import pcluster.schemas.cluster_schema  # noqa: F401
    except ImportError as err:
        raise MissingExtra(
            f"{err.name or err} is not installed: the aws extra is needed ({INSTALL_HINT})"
        ) from None


def read_config(path: Path) -> tuple[str, dict[str, Any]]:
    """The file's text and its YAML mapping; UnreadableConfig says why not."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UnreadableConfig(f"cannot read {path}: {err}") from None
    left = placeholders_in(text)
    if left:
        names = ", ".join("${" + n + "}" for n in left)
        raise UnreadableConfig(
            f"{path} is a template ({names} unfilled): render it first "
            "(python -m hpc_train.cluster render)"
        )
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise UnreadableConfig(f"{path} is not valid YAML: {_one_line(err)}") from None
    if not isinstance(data, dict):
        raise UnreadableConfig(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return text, data


def validator_names() -> set[str]:
    """Every ParallelCluster validator class name (what `type:NAME` may name)."""
    import importlib
    import pkgutil

    import pcluster.validators
    from pcluster.validators.common import Validator

    for module in pkgutil.iter_modules(pcluster.validators.__path__):
        importlib.import_module(f"pcluster.validators.{module.name}")
    names: set[str] = set()
    todo = [Validator]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            names.add(sub.__name__)
            todo.append(sub)
    return names


def parse_suppressions(expressions: list[str]) -> set[str]:
    """`pcluster create-cluster --suppress-validators` syntax: ALL or type:NAME, several allowed.

    Returns validator class names ("ALL" for all); BadSuppression for anything else.
    """
    names: set[str] = set()
    known: set[str] | None = None
    for expression in expressions:
        if not _SUPPRESS.fullmatch(expression):
            raise BadSuppression(
                f"--suppress-validators {expression!r}: use ALL or type:NAME "
                "(e.g. type:InstanceTypeBaseAMICompatibleValidator), as pcluster create-cluster does"
            )
        if expression == "ALL":
            names.add("ALL")
            continue
        name = expression[len("type:") :]
        known = known if known is not None else validator_names()
        if name not in known:
            raise BadSuppression(
                f"--suppress-validators {expression!r}: ParallelCluster has no validator {name}"
            )
        names.add(name)
    return names


def no_effect_findings(data: Any, text: str, path: yaml_paths.Path = ()) -> Iterator[ConfigFinding]:
    """A warning for each setting ParallelCluster accepts but ignores (NO_EFFECT), by YAML path."""
    if isinstance(data, Mapping):
        for key, value in data.items():
            here = (*path, key)
            if key in NO_EFFECT:
                yield ConfigFinding(
                    "WARNING",
                    yaml_paths.format_path(here),
                    NO_EFFECT[key],
                    "hpc-train",
                    yaml_paths.line_of(text, here),
                )
            yield from no_effect_findings(value, text, here)
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from no_effect_findings(value, text, (*path, index))


def dropped_slurm_findings(data: Mapping[str, Any], text: str) -> Iterator[ConfigFinding]:
    """A warning for each custom Slurm setting that would drop one ParallelCluster writes itself;
    a note for each of a deny-listed list (pcluster's own validator refuses it)."""
    for dropped in slurm_conf.dropped(data):
        yield ConfigFinding(
            dropped.level,
            yaml_paths.format_path(dropped.where),
            dropped.message,
            "hpc-train",
            yaml_paths.line_of(text, dropped.where),
        )


def is_image_config(data: Mapping[str, Any]) -> bool:
    """A `pcluster build-image` config (Build, Image.Name) rather than a cluster config."""
    return "Build" in data and "Scheduling" not in data


def validate_config(
    text: str,
    data: dict[str, Any],
    cluster_name: str = "hpc-train",
    suppress: set[str] | frozenset[str] = frozenset(),
    facts: AccountFacts | None = None,
) -> Report:
    """Schema, then validators, under a fake AWS account. Requires the aws extra.

    A cluster config, or a `pcluster build-image` config (one with a top-level `Build`).
    `suppress`: validator class names to skip ("ALL": every one), from parse_suppressions.
    `facts`: what the caller states about the account (fake_aws.BadFact where the config does
    not name what they name).
    """
    from marshmallow import ValidationError
    from pcluster.schemas.cluster_schema import ClusterSchema
    from pcluster.schemas.imagebuilder_schema import ImageBuilderSchema
    from pcluster.validators.common import ValidatorContext

    from hpc_train.cluster.fake_aws import (
        UNJUDGEABLE_VALIDATORS,
        AccountFacts,
        fake_aws_account,
        references,
    )

    report = Report(skipped=dict(UNJUDGEABLE_VALIDATORS))
    existing = references(data).file_systems
    with fake_aws_account(data, facts or AccountFacts()) as account:
        report.refused = account.refused
        report.not_checked = account.not_checked
        report.assumed = account.assumed
        try:
            if is_image_config(data):
                config = ImageBuilderSchema().load(data)
            else:
                config = ClusterSchema(cluster_name=cluster_name).load(data)
        except ValidationError as err:
            schema = "ImageBuilderSchema" if is_image_config(data) else "ClusterSchema"
            report.findings = list(schema_findings(err.messages, text, schema=schema))
            return report
        if existing:
            raise NotCheckableOffline(
                f"existing file system {', '.join(existing)}: ParallelCluster's validators read "
                "it and its network interfaces, which only your account holds (moto has none); "
                "check with pcluster create-cluster --dryrun true"
            )
        paths = yaml_paths.resource_paths(config, data)
        with _owners_recorded(account.gaps) as owners:
            suppressor = _Suppressor(set(UNJUDGEABLE_VALIDATORS), set(suppress))
            results = config.validate([suppressor], ValidatorContext())
        report.validators_run = owners.executed
        report.ran = owners.names
        report.suppressed = sorted(suppressor.asked_and_hit)
    _record_results(report, results, owners, account.gaps, text, data, paths)
    _add_own_findings(report, text, data)
    return report


GAP_MARK = "not checked offline: "  # how fake_aws words a call it could not answer


def _record_results(
    report: Report,
    results: Any,
    owners: _Owners,
    gaps: list[Gap],
    text: str,
    data: dict[str, Any],
    paths: Mapping[int, yaml_paths.Path],
) -> None:
    """pcluster's validator results into the report: each a finding at its YAML path, or, where
    the fake account could not answer the validator's call, a 'not checked offline' line."""
    for result in results:
        owner, args = owners.by_result.get(id(result), (None, {}))
        where, fields = yaml_paths.locate(data, paths.get(id(owner), ()), args, paths)
        if GAP_MARK in str(result.message):  # an async validator's: see _owners_recorded
            reason = _one_line(result.message).replace(GAP_MARK, "")
            at = yaml_paths.describe(where, fields)
            report.not_checked.append(f"{result.validator_type} at {at} ({reason})")
            continue
        line_path = (*where, *fields[0]) if fields else where
        report.findings.append(
            ConfigFinding(
                level=str(result.level),
                path=yaml_paths.describe(where, fields),
                message=_one_line(result.message),
                validator=result.validator_type,
                line=yaml_paths.line_of(text, line_path),
            )
        )
    report.not_checked += list(_gap_lines(owners, gaps, data, paths))


def _add_own_findings(report: Report, text: str, data: dict[str, Any]) -> None:
    """hpc-train's own checks (no-effect settings, dropped Slurm settings), then every finding
    sorted by level."""
    report.findings.extend(no_effect_findings(data, text))
    report.findings.extend(dropped_slurm_findings(data, text))
    report.slurm_kept = slurm_conf.kept(data)
    report.slurm_replaced = slurm_conf.replaced(data)
    report.findings.sort(key=lambda f: LEVELS.index(f.level) if f.level in LEVELS else 9)


def _gap_lines(
    owners: _Owners, gaps: list[Gap], data: Any, paths: Mapping[int, yaml_paths.Path]
) -> Iterator[str]:
    """'not checked offline' lines: each validator whose AWS calls the fake account could not
    answer (its verdict dropped), then any such call made outside a validator."""
    said: set[Gap] = set()
    for name, owner, args, hit in owners.gapped:
        where, fields = yaml_paths.locate(data, paths.get(id(owner), ()), args, paths)
        calls = "; ".join(dict.fromkeys(str(g) for g in hit))
        yield f"{name} at {yaml_paths.describe(where, fields)} (its verdict needs {calls})"
        said.update(hit)
    for gap in dict.fromkeys(g for g in gaps if g not in said):
        yield f"{gap} (asked outside a validator)"


@dataclass(frozen=True)
class UpdateChange:
    path: str  # e.g. HeadNode.CustomActions.OnNodeUpdated.Args
    policy: (
        str  # ParallelCluster's UpdatePolicy name: SUPPORTED, UNSUPPORTED, COMPUTE_FLEET_STOP...
    )
    check: str  # SUCCEEDED, ACTION NEEDED or FAILED
    reason: str
    action: str


NODE_STATES = ("running", "stopped")


@dataclass(frozen=True)
class LiveCluster:
    """What `pcluster update-cluster` asks the live cluster, which offline can only be assumed.

    ParallelCluster's update policies (pcluster/config/update_policy.py) ask the cluster object
    three things: has_running_capacity() (COMPUTE_FLEET_STOP, QUEUE_UPDATE_STRATEGY, the shared
    storage and placement group policies: MaxCount, ScaledownIdletime, an instance type, a new
    volume), has_running_login_nodes(pool_name=...) (LOGIN_NODES_*, SHARED_STORAGE_UPDATE_POLICY)
    and head_node_instance.state (HEAD_NODE_STOP). Each is a named assumption, "running" unless
    the caller says otherwise: the stricter answer, so a verdict is never kinder than AWS's.
    """

    compute_fleet: str = "running"  # pcluster update-compute-fleet --status STOP_REQUESTED stops it
    login_nodes: str = "running"  # LoginNodes Pools Count 0 + update-cluster stops them
    head_node: str = "running"

    def __post_init__(self) -> None:
        for name in ("compute_fleet", "login_nodes", "head_node"):
            if getattr(self, name) not in NODE_STATES:
                raise ValueError(
                    f"{name} must be one of {NODE_STATES}, got {getattr(self, name)!r}"
                )

    def login_nodes_running(self, old: Mapping[str, Any]) -> bool:
        """Running unless stopped, or the cluster has no login node pools (none can run then,
        and pcluster's own answer is False: no healthy or unhealthy login nodes)."""
        pools = _mapping(old.get("LoginNodes")).get("Pools")
        return self.login_nodes == "running" and bool(pools)

    def not_checked(self, old: Mapping[str, Any]) -> list[str]:
        """The assumptions, by name, for the report's 'not checked offline' lines."""
        lines = [
            f"whether the compute fleet is running (assumed {self.compute_fleet}: --fleet)",
            f"whether the head node is running (assumed {self.head_node}: --head-node)",
        ]
        if _mapping(old.get("LoginNodes")).get("Pools"):
            lines.append(
                f"whether login nodes are running (assumed {self.login_nodes}: --login-nodes)"
            )
        return lines


def update_check(
    old: dict[str, Any], new: dict[str, Any], live: LiveCluster | None = None
) -> tuple[bool, list[UpdateChange]]:
    """ParallelCluster's own update check (ConfigPatch, as `pcluster update-cluster` runs it):
    may the cluster created from `old` be updated to `new`? Offline; what pcluster reads from the
    running cluster (is the compute fleet stopped?) comes from `live` (LiveCluster: assumed
    running unless said otherwise), so each verdict is pcluster's own.
    """
    from pcluster.config.config_patch import ConfigPatch

    from hpc_train.cluster.fake_aws import fake_aws_account

    state = live or LiveCluster()
    login_running = state.login_nodes_running(old)

    class _Cluster:  # what ConfigPatch and the update policies read from the running cluster
        name = stack_name = "hpc-train"
        head_node_instance = _HeadNode(state.head_node)

        def has_running_capacity(self, updated_value: bool = False) -> bool:
            return state.compute_fleet == "running"

        def has_running_login_nodes(
            self, updated_value: bool = False, pool_name: str | None = None
        ) -> bool:
            # Any pool, whichever is named: pcluster caches its first answer for every pool.
            return login_running

    with fake_aws_account(new):
        patch = ConfigPatch(_Cluster(), old, new)
        allowed, rows = patch.check()
    changes = [
        UpdateChange(
            path=".".join([*map(str, row[0] or []), str(row[1])]),
            policy=str(row[7]),
            check=str(row[4]),
            reason=_one_line(row[5]),
            action=_one_line(row[6]) if row[6] else "",
        )
        for row in rows[1:]
    ]
    return allowed, changes


@dataclass(frozen=True)
class _HeadNode:
    state: str  # as EC2 says it: running, stopped


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def schema_findings(
    messages: Any, text: str, path: yaml_paths.Path = (), schema: str = "ClusterSchema"
) -> Iterator[ConfigFinding]:
    """Flatten marshmallow's nested error messages into findings with YAML paths."""
    if isinstance(messages, Mapping):
        for key, value in messages.items():
            child = path if key == "_schema" else (*path, key)
            yield from schema_findings(value, text, child, schema)
    elif isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        for message in messages:
            yield ConfigFinding(
                "ERROR",
                yaml_paths.format_path(path),
                _one_line(message),
                schema,
                yaml_paths.line_of(text, path),
            )
    elif isinstance(messages, list):
        for item in messages:
            yield from schema_findings(item, text, path, schema)
    else:
        yield ConfigFinding("ERROR", yaml_paths.format_path(path), _one_line(messages), schema)


class _Suppressor:
    """Skip validators by class name (pcluster's ValidatorSuppressor interface)."""

    def __init__(self, unjudgeable: set[str], asked: set[str]) -> None:
        self.unjudgeable = unjudgeable
        self.names = asked
        self.asked_and_hit: set[str] = set()

    def suppress_validator(self, validator: Any) -> bool:
        name = type(validator).__name__
        if name in self.unjudgeable:
            return True
        if "ALL" in self.names or name in self.names:
            self.asked_and_hit.add(name)
            return True
        return False


@dataclass
class _Owners:
    by_result: dict[int, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)  # keeps result ids stable while we map them
    executed: int = 0
    names: set[str] = field(default_factory=set)
    # (validator, owner, args, gaps) of each validator that made a call the fake could not answer
    gapped: list[tuple[str, Any, dict[str, Any], list[Gap]]] = field(default_factory=list)


@contextmanager
def _owners_recorded(gaps: list[Gap]) -> Iterator[_Owners]:
    """Note, for every validation result, the resource that registered its validator and args;
    drop the results of a validator that made a call the fake account could not answer (`gaps`
    grew while it ran: sync validators run one at a time; the async ones, pcluster's UrlValidator,
    are told by the gap's wording in their message). On exit, close the coroutines of async
    validators never awaited (a crash before pcluster awaits them), so no warning follows."""
    from pcluster.config.common import Resource

    owners = _Owners()
    current: list[Any] = []
    coroutines: list[Any] = []
    real_validate_self = Resource._validate_self
    real_execute = Resource._validator_execute

    def validate_self(resource: Any, context: Any, suppressors: Any) -> None:
        current.append(resource)
        try:
            real_validate_self(resource, context, suppressors)
        finally:
            current.pop()

    def note(results: Any, owner: Any, args: dict[str, Any]) -> Any:
        for result in results or []:
            owners.by_result[id(result)] = (owner, args)
            owners.keep.append(result)
        return results

    def execute(validator_class: Any, args: Any, suppressors: Any, executor: Callable) -> Any:
        before = len(gaps)
        result = real_execute(validator_class, args, suppressors, executor)
        if result is None:
            return None
        owners.executed += 1
        owners.names.add(validator_class.__name__)
        owner = current[-1] if current else None
        if hasattr(result, "__await__"):

            async def tagged() -> Any:
                return note(await result, owner, args)

            coroutines.extend((result, tagged()))
            return coroutines[-1]
        if len(gaps) > before:
            owners.gapped.append((validator_class.__name__, owner, args, gaps[before:]))
            return []
        return note(result, owner, args)

    try:
        with (
            mock.patch.object(Resource, "_validate_self", validate_self),
            mock.patch.object(Resource, "_validator_execute", staticmethod(execute)),
        ):
            yield owners
    finally:
        for coroutine in coroutines:
            if inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED:
                coroutine.close()


def _one_line(message: Any) -> str:
    return re.sub(r"\s+", " ", str(message)).strip()
