"""Collected only by ``tests/test_workers.py`` (its name is not ``test_*.py``): three tests that
share a module-scoped fixture, and three that share nothing. Each setup and each test appends a
line to ``$PROBE_OUT``: which worker ran it."""

import os

import pytest


def _say(what: str) -> None:
    with open(os.environ["PROBE_OUT"], "a") as out:
        out.write(f"{what} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\n")


@pytest.fixture(scope="module")
def shared() -> int:
    _say("setup")
    return 1


@pytest.mark.parametrize("n", range(3))
def test_shares_the_module_fixture(shared: int, n: int) -> None:
    _say(f"shared-{n}")


@pytest.mark.parametrize("n", range(3))
def test_shares_nothing(n: int) -> None:
    _say(f"alone-{n}")
