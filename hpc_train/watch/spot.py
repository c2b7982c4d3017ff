"""Watch for the EC2 spot two-minute interruption notice (IMDSv2) on a node.

EC2 posts ``/latest/meta-data/spot/instance-action`` (``{"action": "terminate", "time": …}``)
about two minutes before it reclaims a spot instance; Slurm only sees the node vanish later
(NODE_FAIL). The launcher runs one watcher per node and turns the notice into the same USR2 a
preemption sends, so the job saves on notice and requeues. Off EC2 (no metadata service) the
watcher stops after its first failed call and says so.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from hpc_train.planning.costs import SPOT_POLL_S
from hpc_train.watch.watcher import Watcher

DEFAULT_ENDPOINT = "http://169.254.169.254"
DMI_VENDOR = Path("/sys/devices/virtual/dmi/id/sys_vendor")
TOKEN_TTL_S = 21600


class NoMetadataService(RuntimeError):
    pass


def _request(req: urllib.request.Request, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""
    except (urllib.error.URLError, OSError) as err:
        raise NoMetadataService(str(err)) from None


def fetch_token(endpoint: str, timeout: float = 1.0) -> str:
    """IMDSv2 session token (PUT /latest/api/token)."""
    req = urllib.request.Request(
        f"{endpoint}/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
    )
    status, body = _request(req, timeout)
    if status != 200 or not body:
        raise NoMetadataService(f"token request answered {status}")
    return body


def instance_action(endpoint: str, token: str, timeout: float = 1.0) -> dict[str, str] | None:
    """The pending interruption, or None (the path answers 404 until EC2 posts one)."""
    req = urllib.request.Request(
        f"{endpoint}/latest/meta-data/spot/instance-action",
        headers={"X-aws-ec2-metadata-token": token},
    )
    status, body = _request(req, timeout)
    if status == 404:
        return None
    if status == 401:
        raise PermissionError("token expired")
    if status != 200:
        raise NoMetadataService(f"instance-action answered {status}")
    return json.loads(body)


def endpoint_to_watch(
    env: dict[str, str] | None = None, vendor_file: Path = DMI_VENDOR
) -> str | None:
    """The metadata endpoint to poll: ``HPC_TRAIN_IMDS_ENDPOINT`` if set, the EC2 link-local
    address on an EC2 instance (DMI vendor "Amazon EC2"), else None: off EC2 nothing is polled."""
    env = dict(os.environ) if env is None else env
    if env.get("HPC_TRAIN_IMDS_ENDPOINT"):
        return env["HPC_TRAIN_IMDS_ENDPOINT"].rstrip("/")
    try:
        on_ec2 = vendor_file.read_text().strip().startswith("Amazon EC2")
    except OSError:
        on_ec2 = False
    return DEFAULT_ENDPOINT if on_ec2 else None


class SpotWatcher(Watcher[None]):
    """Polls the notice every ``interval_s``; calls ``on_notice(action)`` once, then stops."""

    def __init__(
        self,
        on_notice: Callable[[dict[str, str]], None],
        log: Callable[[str], None],
        endpoint: str = DEFAULT_ENDPOINT,
        interval_s: float = SPOT_POLL_S,
    ) -> None:
        super().__init__("spot-watcher", interval_s)
        self.on_notice = on_notice
        self.log = log
        self.endpoint = endpoint
        self.token = ""

    def begin(self) -> bool:
        try:
            self.token = fetch_token(self.endpoint)
        except NoMetadataService as err:
            self.log(f"spot watch off: no instance metadata service at {self.endpoint} ({err})")
            return False
        self.log(f"spot watch on: polling {self.endpoint} every {self.interval:g} s")
        return True

    def tick(self) -> bool:
        try:
            action = instance_action(self.endpoint, self.token)
        except PermissionError:
            self.token = fetch_token(self.endpoint)
            return False
        except (NoMetadataService, ValueError) as err:
            self.log(f"spot watch: metadata call failed ({err}); retrying")
            return False
        if not action:
            return False
        self.log(f"spot interruption notice: {action}")
        self.on_notice(action)
        return True

    def result(self) -> None:
        return None
