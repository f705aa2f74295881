"""The local cloud's fault settings (``<state_dir>/faults.json``, infra/console_sim/faults.py),
used by the fault-injection suite: a skewed clock (event times, the Date header, signature
time checks), a LookupEvents throttling storm and late audit delivery, set and cleared while
the server runs; and the reward side's ActionTrail client measuring the skew from the Date
header, so an episode's events are still found in its window."""
from __future__ import annotations

import json
import time
import uuid
from email.utils import parsedate_to_datetime

import httpx
import pytest

from consolerl.errors import CloudAPIError
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.console_sim.faults import parse_faults
from reward_service.actiontrail import BucketRegistry, TrailClient, TrailConfig
from tests.conftest import _server


@pytest.fixture(scope="module")
def faulty_cloud(tmp_path_factory):
    yield from _server(tmp_path_factory, "faulty-cloud", ["--lookup-qps", "0"])


def set_faults(server, **settings) -> None:
    path = server.state_dir / "faults.json"
    if settings:
        path.write_text(json.dumps(settings))
    else:
        path.unlink(missing_ok=True)
    time.sleep(0.3)                         # the server looks at the file every 0.2 s


def client_of(server, account) -> CloudClient:
    return CloudClient(CloudConfig(endpoint=server.endpoint),
                       Credentials(account.access_key_id, account.access_key_secret))


def create_sg(client: CloudClient) -> str:
    return client.rpc("Ecs", "CreateSecurityGroup", {
        "RegionId": "cn-hangzhou", "SecurityGroupName": f"f-{uuid.uuid4().hex[:8]}"}
    )["SecurityGroupId"]


def test_a_skewed_clock_moves_event_times_and_the_date_header(faulty_cloud, accounts):
    client = client_of(faulty_cloud, accounts[3])
    try:
        set_faults(faulty_cloud, clock_offset_s=600)
        date = parsedate_to_datetime(httpx.get(faulty_cloud.url + "/healthz")
                                     .headers["date"]).timestamp()
        assert date - time.time() == pytest.approx(600, abs=3)
        before = time.time()
        sg = create_sg(client)        # signed with this machine's time: within the allowance
        trail = TrailClient(client, TrailConfig(clock_skew_s=5),
                            account_id=accounts[3].account_id, buckets=BucketRegistry())
        # The window is this machine's; the client measured the offset and shifted it.
        events = trail.events(before - 1, time.time() + 1)
        assert trail.clock_offset_s == pytest.approx(600, abs=2)
        made = [e for e in events if e.event_name == "CreateSecurityGroup"
                and sg in json.dumps(e.to_json())]
        assert len(made) == 1
        assert made[0].epoch - before == pytest.approx(600, abs=3)
    finally:
        set_faults(faulty_cloud)
    date = parsedate_to_datetime(httpx.get(faulty_cloud.url + "/healthz")
                                 .headers["date"]).timestamp()
    assert abs(date - time.time()) < 3


def test_a_throttling_storm_and_late_delivery_come_and_go(faulty_cloud, accounts):
    client = client_of(faulty_cloud, accounts[4])
    trail = TrailClient(client, TrailConfig(max_retries=0, qps=100, burst=100),
                        account_id=accounts[4].account_id, buckets=BucketRegistry())
    try:
        set_faults(faulty_cloud, lookup_qps=0.5, delivery_delay_s=30)
        sg = create_sg(client)
        now = time.time()
        throttled = 0
        for _ in range(4):
            try:
                events = trail.events(now - 60, now + 1)
                assert not any(sg in json.dumps(e.to_json()) for e in events)  # not delivered
            except CloudAPIError as exc:
                assert exc.code.startswith("Throttling")
                throttled += 1
        assert throttled >= 2
    finally:
        set_faults(faulty_cloud)
    events = trail.events(now - 60, time.time() + 1)
    assert any(sg in json.dumps(e.to_json()) for e in events)           # the storm passed


def test_a_malformed_faults_file_is_ignored(faulty_cloud, accounts):
    (faulty_cloud.state_dir / "faults.json").write_text('{"clock_offset_s": "soon"}')
    time.sleep(0.3)
    try:
        date = parsedate_to_datetime(httpx.get(faulty_cloud.url + "/healthz")
                                     .headers["date"]).timestamp()
        assert abs(date - time.time()) < 3
    finally:
        set_faults(faulty_cloud)


@pytest.mark.parametrize(("data", "field"), [
    ([], "JSON object"), ({"clock": 1}, "unknown field"), ({"lookup_qps": -1}, "lookup_qps"),
    ({"clock_offset_s": float("nan")}, "clock_offset_s"),
    ({"delivery_delay_s": True}, "delivery_delay_s")])
def test_fault_settings_name_what_is_wrong(data, field):
    with pytest.raises(ValueError, match=field):
        parse_faults(data)
