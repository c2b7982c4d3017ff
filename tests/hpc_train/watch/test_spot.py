"""The spot-notice watcher against a fake IMDSv2 server on 127.0.0.1 (no EC2 here)."""

import threading

from hpc_train.watch import spot


def test_token_then_404_until_a_notice_is_posted(fake_imds):
    token = spot.fetch_token(fake_imds.endpoint)
    assert spot.instance_action(fake_imds.endpoint, token) is None
    fake_imds.post({"action": "terminate", "time": "T"})
    assert spot.instance_action(fake_imds.endpoint, token) == {"action": "terminate", "time": "T"}


def test_watcher_calls_back_once_on_notice(fake_imds):
    got, lines = [], []
    done = threading.Event()
    watcher = spot.SpotWatcher(
        lambda a: (got.append(a), done.set()), lines.append, fake_imds.endpoint, interval_s=0.05
    )
    watcher.start()
    fake_imds.post({"action": "stop", "time": "T"})
    assert done.wait(10)
    watcher.join(5)
    assert got == [{"action": "stop", "time": "T"}] and not watcher.is_alive()
    assert any("spot watch on" in line for line in lines)


def test_no_metadata_service_turns_the_watch_off(tmp_path):
    lines = []
    watcher = spot.SpotWatcher(lambda a: None, lines.append, "http://127.0.0.1:9", interval_s=0.05)
    watcher.loop()  # returns at once
    assert "spot watch off" in lines[0]


def test_endpoint_is_polled_only_on_ec2_or_when_asked(tmp_path):
    vendor = tmp_path / "sys_vendor"
    vendor.write_text("QEMU\n")
    assert spot.endpoint_to_watch({}, vendor) is None  # off EC2: nothing is polled
    vendor.write_text("Amazon EC2\n")
    assert spot.endpoint_to_watch({}, vendor) == spot.DEFAULT_ENDPOINT
    assert spot.endpoint_to_watch({"HPC_TRAIN_IMDS_ENDPOINT": "http://x/"}, vendor) == "http://x"
