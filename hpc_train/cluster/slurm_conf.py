"""What ParallelCluster writes into slurm.conf itself, and what a config's custom Slurm settings
would drop of it (pure: config dicts in, findings out).

ParallelCluster's head node renders slurm.conf from the cookbook (aws-parallelcluster-cookbook,
cookbooks/aws-parallelcluster-slurm): ``templates/default/slurm/slurm.conf.erb`` (the settings
below, then ``include slurm_parallelcluster.conf`` (line 83), rendered from
``files/default/head_node_slurm/slurm/templates/slurm_parallelcluster.conf``, whose
``SelectTypeParameters`` follows the config's ``EnableMemoryBasedScheduling``, then, last,
``include pcluster/custom_slurm_settings_include_file_slurm.conf`` (line 87), where the
cluster-level ``Scheduling.SlurmSettings.CustomSlurmSettings`` go), and each queue's partition
line in
``files/default/head_node_slurm/slurm/config_renderer.py`` (``QueueRenderer._render_partition``:
ParallelCluster's attributes first, the queue's ``CustomSlurmSettings`` appended after them).
Slurm keeps the last value of a keyword, so a custom setting of a keyword ParallelCluster writes
replaces ParallelCluster's value whole: for a list of options (``SchedulerParameters``), every
option ParallelCluster wrote and the custom line does not repeat is gone.

Read at the cookbook's tag v3.11.1 (ff6dc03d), the newest tag reachable here; its develop branch
at f75d84c3 (cookbook 3.12.0, 2024-10-21) has the same three files, line for line. The 3.16.1 tag
was not reachable: the user guide ("Slurm prolog and epilog") says the ``SchedulerParameters``
line has been written since 3.6.0 (tag v3.6.0: slurm.conf.erb line 48), unconditionally.
Settings on ParallelCluster's deny list (pcluster's ``SLURM_SETTINGS_DENY_LIST``:
``SlurmctldParameters``, ``TaskPlugin``, ``Prolog``, ``PartitionName``'s ``State``, ...) are left
out: its own validator already refuses a config that sets them. Of those, ``SlurmctldParameters``
is an option list ParallelCluster writes itself: a custom line of it is said to be refused
(``Denied``), never advised on. Lines written only under a condition of the cluster's
(``LaunchParameters`` with nss_slurm, accounting with a database) are left out too; they are all
on the deny list. ``CommunicationParameters`` is on no deny list (pcluster 3.16.1) and
ParallelCluster has written none since 3.9.0 (``NoAddrCache`` was removed by cookbook commit
fab5e2dc, 2023-12-06): a custom line of it drops nothing.

Option lists are compared by key (``option_key``): Slurm reads one option of a list by its key,
and the first occurrence of the key in the line wins (22.05: ``cred_expire=`` by ``xstrstr`` in
src/common/slurm_cred.c; 25.11: src/interfaces/cred.c, and ``conf_get_opt_str`` in
src/common/read_config.c for ``requeue_delay=``). So a custom line that gives one of
ParallelCluster's keys a new value loses nothing (``AuthInfo: cred_expire=10`` alone gives 10 s);
a key of ParallelCluster's line that the custom line leaves out is lost, and the advice repeats
that key with ParallelCluster's value, never a key the custom line sets (which, first in the
line, would bring ParallelCluster's value back). tests/slurm/test_slurm_option_lists.py proves
both rules on the local Slurm 22.05 by the requeue hold and by a failing prolog.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

SLURM_CONF_ERB = "cookbooks/aws-parallelcluster-slurm/templates/default/slurm/slurm.conf.erb"
CONFIG_RENDERER = (
    "cookbooks/aws-parallelcluster-slurm/files/default/head_node_slurm/slurm/config_renderer.py"
)
SLURM_PARALLELCLUSTER_CONF = (
    "cookbooks/aws-parallelcluster-slurm/files/default/head_node_slurm/slurm/templates/"
    "slurm_parallelcluster.conf"
)
COOKBOOK_TAG = "v3.11.1"

# Keywords whose value is a comma-separated list of options (slurm.conf(5)): a custom line keeps
# ParallelCluster's options only where it repeats them.
LIST_KEYWORDS = frozenset(
    {"SchedulerParameters", "PrivateData", "DebugFlags", "AuthInfo", "CommunicationParameters"}
)


@dataclass(frozen=True)
class Written:
    """One setting ParallelCluster writes itself: keyword, value and where (file, line)."""

    keyword: str
    value: str
    file: str
    line: int
    why: str = ""  # what replacing it does, where that is more than a changed value

    @property
    def source(self) -> str:
        return f"aws-parallelcluster-cookbook {COOKBOOK_TAG} {self.file.rpartition('/')[2]}:{self.line}"

    def options(self) -> tuple[str, ...]:
        return _options(self.keyword, self.value)


def _erb(keyword: str, value: str, line: int, why: str = "") -> Written:
    return Written(keyword, value, SLURM_CONF_ERB, line, why)


CLUSTER_NAME = "<the cluster's name>"  # node['cluster']['stack_name']: pcluster's --cluster-name

# slurm.conf.erb, unconditional lines not on the deny list (file line numbers at COOKBOOK_TAG).
CLUSTER_WRITES: tuple[Written, ...] = (
    _erb(
        "ClusterName",
        CLUSTER_NAME,
        12,
        "slurmctld stops at its next start when the name differs from the one in its "
        "StateSaveLocation (CLUSTER NAME MISMATCH, slurmctld's controller.c)",
    ),
    _erb("SlurmctldPort", "6820-6829", 14),
    _erb("SlurmdPort", "6818", 15),
    _erb("AuthType", "auth/munge", 16),
    _erb("StateSaveLocation", "/var/spool/slurm.state", 17),
    _erb("SlurmdSpoolDir", "/var/spool/slurmd", 18),
    _erb("SwitchType", "switch/none", 19),
    _erb("SlurmctldPidFile", "/var/run/slurmctld.pid", 20),
    _erb("SlurmdPidFile", "/var/run/slurmd.pid", 21),
    _erb("RebootProgram", "/sbin/reboot", 38),
    _erb("SuspendTimeout", "120", 39),
    _erb("PrivateData", "cloud", 40),
    _erb("ResumeRate", "0", 41),
    _erb("SuspendRate", "0", 42),
    # a job whose prolog fails (the GPU health check) is requeued, not requeued and held
    _erb("SchedulerParameters", "nohold_on_prolog_fail", 47),
    _erb("BatchStartTimeout", "180", 48),
    _erb("SlurmctldTimeout", "300", 51),
    _erb("SlurmdTimeout", "180", 52),
    _erb("UnkillableStepTimeout", "180", 53),
    _erb("InactiveLimit", "0", 54),
    _erb("MinJobAge", "300", 55),
    _erb("KillWait", "30", 56),
    _erb("Waittime", "0", 57),
    _erb("MessageTimeout", "60", 58),
    _erb("AuthInfo", "cred_expire=70", 59),
    _erb("EnforcePartLimits", "ALL", 62),
    _erb("SchedulerType", "sched/backfill", 63),
    _erb("ProctrackType", "proctrack/cgroup", 64),
    _erb("MpiDefault", "none", 65),
    _erb("ReturnToService", "1", 66),
    _erb("SelectType", "select/cons_tres", 71),
    _erb("SlurmctldDebug", "verbose", 74),
    _erb("SlurmdDebug", "info", 76),
    _erb("DebugFlags", "Power", 78),
    _erb("JobCompType", "jobcomp/none", 79),
)


def cluster_writes(config: Mapping[str, Any]) -> tuple[Written, ...]:
    """Every cluster-wide setting ParallelCluster writes for ``config``: slurm.conf.erb's, and
    slurm_parallelcluster.conf's SelectTypeParameters (CR_CPU_Memory with
    Scheduling.SlurmSettings.EnableMemoryBasedScheduling true, else CR_CPU)."""
    slurm = _mapping(_mapping(config.get("Scheduling")).get("SlurmSettings"))
    memory = slurm.get("EnableMemoryBasedScheduling") is True
    why = "ParallelCluster sets it from Scheduling.SlurmSettings.EnableMemoryBasedScheduling"
    value, line = ("CR_CPU_Memory", 12) if memory else ("CR_CPU", 14)
    select = Written("SelectTypeParameters", value, SLURM_PARALLELCLUSTER_CONF, line, why)
    return (*CLUSTER_WRITES, select)


# config_renderer.py QueueRenderer._render_partition: the attributes of every queue's partition
# line not on the deny list (Nodes, State, OverSubscribe are). Default=YES (line 189) goes on the
# first queue only.
PARTITION_WRITES: tuple[Written, ...] = (Written("MaxTime", "INFINITE", CONFIG_RENDERER, 187),)
DEFAULT_PARTITION = Written("Default", "YES", CONFIG_RENDERER, 189)


@dataclass(frozen=True)
class Dropped:
    """A custom setting that replaces one ParallelCluster writes, losing some of it."""

    written: Written
    custom: str  # the custom setting's value
    where: tuple[str | int, ...]  # YAML path of the custom setting
    lost: tuple[str, ...]  # options of ParallelCluster's value whose key the custom value lacks
    level = "WARNING"

    @property
    def message(self) -> str:
        kept = f"{self.written.keyword}={self.written.value}"
        if self.written.keyword in LIST_KEYWORDS:
            repeat = ",".join([*self.lost, self.custom])
            return (
                f"drops {', '.join(self.lost)}, which ParallelCluster writes itself ({kept}, "
                f"{self.written.source}): Slurm keeps the last {self.written.keyword} line whole. "
                f"Repeat it: {self.written.keyword}: {repeat}"
            )
        why = f" ({self.written.why})" if self.written.why else ""
        return (
            f"replaces ParallelCluster's own {kept} ({self.written.source}) with "
            f"{self.custom}: Slurm keeps the last value{why}"
        )


@dataclass(frozen=True)
class Denied:
    """A custom setting of an option list ParallelCluster writes and refuses to let a config
    set: said, never advised on."""

    written: Written
    where: tuple[str | int, ...]
    level = "INFO"

    @property
    def message(self) -> str:
        return (
            f"{self.written.keyword} is on ParallelCluster's deny list (pcluster's "
            f"SLURM_SETTINGS_DENY_LIST, {DENY_LIST_SOURCE}): pcluster refuses the config "
            f"(CustomSlurmSettingsValidator) and writes its own line "
            f"({self.written.keyword}={self.written.value}, {self.written.source}); no advice"
        )


DENY_LIST_SOURCE = "pcluster/validators/slurm_settings_validator.py, 3.16.1"
# slurm.conf.erb's SlurmctldParameters line (one of two, by the cluster's DNS setting; the
# percentage is node['cluster']['slurm_node_reg_mem_percent']): on the deny list
DENIED_WRITES: tuple[Written, ...] = (
    _erb(
        "SlurmctldParameters",
        "idle_on_node_suspend,power_save_min_interval=30,node_reg_mem_percent=<percent>",
        29,
    ),
)


def option_key(option: str) -> str:
    """The key Slurm finds an option of a list by: ``cred_expire`` of ``cred_expire=70``; a
    flag (``nohold_on_prolog_fail``) is its own key."""
    return option.partition("=")[0].strip()


def effective(keyword: str, config: Mapping[str, Any]) -> str | None:
    """The cluster-wide value of ``keyword`` in the slurm.conf made from ``config``: the last
    cluster-level custom setting of it, else ParallelCluster's own, else None."""
    value = next((w.value for w in cluster_writes(config) if w.keyword == keyword), None)
    for _, key, custom in _cluster_settings(config):
        if key.lower() == keyword.lower():  # Slurm's keywords are case-insensitive
            value = custom
    return value


def dropped(config: Mapping[str, Any]) -> Iterator[Dropped | Denied]:
    """Every custom Slurm setting (cluster or queue level) that would drop a setting ParallelCluster
    writes itself into slurm.conf, and each that sets a deny-listed list of ParallelCluster's."""
    writes = cluster_writes(config)
    for where, key, value in _cluster_settings(config):
        yield from (Denied(w, where) for w in DENIED_WRITES if w.keyword.lower() == key.lower())
        yield from _against(writes, where, key, value)
    queues = _mapping(config.get("Scheduling")).get("SlurmQueues")
    for index, queue in enumerate(queues if isinstance(queues, list) else []):
        writes = (*PARTITION_WRITES, DEFAULT_PARTITION) if index == 0 else PARTITION_WRITES
        settings = _mapping(_mapping(queue).get("CustomSlurmSettings"))
        for key, value in settings.items():
            where = ("Scheduling", "SlurmQueues", index, "CustomSlurmSettings", str(key))
            yield from _against(writes, where, str(key), str(value))


def kept(config: Mapping[str, Any]) -> list[str]:
    """ParallelCluster's settings that the config's cluster-level custom settings name and keep
    as they are, as 'KEYWORD=VALUE (source)' (what `validate` says it checked)."""
    return [f"{w.keyword}={w.value} ({w.source})" for w, same in _named(config) if same]


def replaced(config: Mapping[str, Any]) -> list[str]:
    """ParallelCluster's option lists whose every key the config's custom line sets, some with
    a new value: no loss, the custom value is the one in force. As 'KEYWORD: the custom value
    in place of ParallelCluster's (source)'."""
    return [
        f"{w.keyword}: {effective(w.keyword, config)} in place of ParallelCluster's {w.value} "
        f"({w.source}): Slurm reads each key's first occurrence in the last {w.keyword} line"
        for w, same in _named(config)
        if not same and w.keyword in LIST_KEYWORDS
    ]


def _named(config: Mapping[str, Any]) -> Iterator[tuple[Written, bool]]:
    """ParallelCluster's settings that the config's cluster-level custom settings name and do
    not lose, each with whether the custom value repeats ParallelCluster's options as they are."""
    lost = {d.written for d in dropped(config) if isinstance(d, Dropped)}
    named = {key.lower() for _, key, _ in _cluster_settings(config)}
    for w in cluster_writes(config):
        value = effective(w.keyword, config)
        if w.keyword.lower() in named and w not in lost and value is not None:
            yield w, set(w.options()) <= set(_options(w.keyword, value))


def _against(
    writes: tuple[Written, ...], where: tuple[str | int, ...], key: str, value: str
) -> Iterator[Dropped]:
    for written in writes:
        if written.keyword.lower() != key.lower():  # Slurm's keywords are case-insensitive
            continue
        have = {option_key(o) for o in _options(written.keyword, value)}
        lost = tuple(o for o in written.options() if option_key(o) not in have)
        if lost:
            yield Dropped(written, value, where, lost)


def _cluster_settings(
    config: Mapping[str, Any],
) -> Iterator[tuple[tuple[str | int, ...], str, str]]:
    """(YAML path, keyword, value) of each cluster-level custom setting of one keyword, in order
    (a NodeName/PartitionName/NodeSet entry, several keys in one item, is no global setting)."""
    slurm = _mapping(_mapping(config.get("Scheduling")).get("SlurmSettings"))
    items = slurm.get("CustomSlurmSettings")
    for index, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, Mapping) and len(item) == 1:
            [(key, value)] = item.items()
            where = ("Scheduling", "SlurmSettings", "CustomSlurmSettings", index, str(key))
            yield where, str(key), str(value)


def _options(keyword: str, value: str) -> tuple[str, ...]:
    if keyword in LIST_KEYWORDS:
        return tuple(o.strip() for o in value.split(",") if o.strip())
    return (value.strip(),)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
