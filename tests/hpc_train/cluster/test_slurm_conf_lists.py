"""slurm_conf compares ParallelCluster's option lists with a custom line key by key, as Slurm reads
them (pure). The two rules it rests on are proven on the local Slurm by behaviour in
tests/slurm/test_slurm_option_lists.py: the last line of a keyword is kept whole, and inside one
line the first occurrence of a key wins."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hpc_core import slurm
from hpc_train.cluster import requeue_hold, slurm_conf

BASE: dict[str, Any] = {"Scheduling": {"SlurmSettings": {"CustomSlurmSettings": []}}}


def with_custom(*settings: dict[str, str]) -> dict[str, Any]:
    config = copy.deepcopy(BASE)
    config["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"] = list(settings)
    return config


def first_values(line: str) -> dict[str, str]:
    """Each key of an option list with the value Slurm reads for it: its first occurrence."""
    seen: dict[str, str] = {}
    for option in (o.strip() for o in line.split(",") if o.strip()):
        seen.setdefault(slurm_conf.option_key(option), option.partition("=")[2])
    return seen


def test_a_key_given_a_new_value_is_no_loss_and_is_said_to_be_in_force() -> None:
    """``AuthInfo: cred_expire=10`` alone gives 10 s: no finding (it used to be said to drop
    cred_expire=70, with advice that brought 70 s back); validate names it as replaced."""
    config = with_custom({"AuthInfo": "cred_expire=10"})
    assert list(slurm_conf.dropped(config)) == []
    assert slurm_conf.kept(config) == []
    [line] = slurm_conf.replaced(config)
    assert line.startswith("AuthInfo: cred_expire=10 in place of ParallelCluster's cred_expire=70")
    # the hold a 22.05 controller would show for it (requeue_delay is 25.11's)
    assert requeue_hold.of_config(config, slurm_version="22.05") == 10


def test_a_key_left_out_is_a_loss_and_the_advice_repeats_that_key_alone() -> None:
    config = with_custom({"AuthInfo": "socket=/run/munge/munge.socket.2"})
    [dropped] = slurm_conf.dropped(config)
    assert isinstance(dropped, slurm_conf.Dropped) and dropped.lost == ("cred_expire=70",)
    assert "drops cred_expire=70" in dropped.message
    assert dropped.message.endswith(
        "Repeat it: AuthInfo: cred_expire=70,socket=/run/munge/munge.socket.2"
    )
    assert dropped.level == "WARNING"


@pytest.mark.parametrize(
    "written", [w for w in slurm_conf.cluster_writes({}) if w.keyword in slurm_conf.LIST_KEYWORDS],
    ids=lambda w: w.keyword,
)  # fmt: skip
@pytest.mark.parametrize("new_value", [False, True], ids=["other key", "new value too"])
def test_the_advice_followed_literally_keeps_every_custom_value(
    written: slurm_conf.Written, new_value: bool
) -> None:
    """For every option list ParallelCluster writes (SchedulerParameters, AuthInfo, PrivateData,
    DebugFlags): a custom line with a key of its own (and, where the list has values, one of
    ParallelCluster's keys with a new value) is advised to add exactly the keys it left out;
    the advised line, followed literally, drops nothing, holds each of ParallelCluster's keys,
    and gives every custom key its custom value under Slurm's first-occurrence rule."""
    ours = [f"hpc_train_key={7 if new_value else 1}"]
    pc = dict(first_values(written.value))
    if new_value and any(pc.values()):
        key = next(k for k, v in pc.items() if v)
        ours.append(f"{key}=12345")
    custom = ",".join(ours)
    found = list(slurm_conf.dropped(with_custom({written.keyword: custom})))
    if set(pc) <= set(first_values(custom)):
        assert found == []
        return
    [dropped] = found
    assert isinstance(dropped, slurm_conf.Dropped)
    advised = dropped.message.rpartition(f"Repeat it: {written.keyword}: ")[2]
    assert list(slurm_conf.dropped(with_custom({written.keyword: advised}))) == []
    read = first_values(advised)
    assert set(pc) <= set(read)
    assert {k: read[k] for k in first_values(custom)} == first_values(custom)
    assert advised.count(",") + 1 == len(read)  # no key twice


def test_the_shipped_line_and_a_new_hold_are_no_finding() -> None:
    """The configs' own SchedulerParameters line keeps ParallelCluster's flag as it is, and a
    requeue_delay of another value is still no loss: both keys are there."""
    for line in (
        "nohold_on_prolog_fail,requeue_delay=10",
        "requeue_delay=30,nohold_on_prolog_fail",
    ):
        config = with_custom({"SchedulerParameters": line})
        assert list(slurm_conf.dropped(config)) == []
        [written] = [w for w in slurm_conf.CLUSTER_WRITES if w.keyword == "SchedulerParameters"]
        assert slurm_conf.kept(config) == [
            f"SchedulerParameters=nohold_on_prolog_fail ({written.source})"
        ]
        assert slurm_conf.replaced(config) == []
        shown = requeue_hold.shown_config(config)
        assert slurm.config_option(shown, "SchedulerParameters", "nohold_on_prolog_fail") == ""


def test_slurmctld_parameters_is_said_to_be_denied_never_advised_on() -> None:
    """ParallelCluster writes SlurmctldParameters itself and its validator refuses a custom one:
    a note, no advice (pcluster's own ERROR is the finding that counts)."""
    config = with_custom({"slurmctldparameters": "idle_on_node_suspend"})
    [denied] = slurm_conf.dropped(config)
    assert isinstance(denied, slurm_conf.Denied) and denied.level == "INFO"
    assert "deny list" in denied.message and "Repeat it" not in denied.message
    assert denied.where[-1] == "slurmctldparameters"


def test_communication_parameters_drops_nothing() -> None:
    """ParallelCluster has written no CommunicationParameters since 3.9.0, and 3.16.1 does not
    deny it: a custom line of it is no finding."""
    config = with_custom({"CommunicationParameters": "block_null_hash"})
    assert list(slurm_conf.dropped(config)) == []


def test_the_deny_list_named_is_pclusters_own() -> None:
    """What slurm_conf calls deny-listed is on pcluster 3.16.1's list; CommunicationParameters is
    not (what a session's brief assumed)."""
    validator = pytest.importorskip("pcluster.validators.slurm_settings_validator")
    denied = set(validator.SLURM_SETTINGS_DENY_LIST["SlurmConf"]["Global"])
    assert {w.keyword.lower() for w in slurm_conf.DENIED_WRITES} <= denied
    assert "communicationparameters" not in denied
