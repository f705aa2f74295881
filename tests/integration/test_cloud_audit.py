"""ActionTrail LookupEvents over the audit log, through the official ActionTrail SDK."""
from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from alibabacloud_actiontrail20200706 import models as at

from consolerl.audit import AuditEvent
from consolerl.errors import CloudAPIError
from tests.conftest import CloudServer, wait_for

EVENT_FIELDS = {"eventId", "eventName", "eventSource", "eventTime", "eventType", "eventRW",
                "eventVersion", "acsRegion", "serviceName", "apiVersion", "requestId",
                "requestParameters", "responseElements", "referencedResources", "resourceName",
                "resourceType", "errorCode", "errorMessage", "sourceIpAddress", "userAgent",
                "userIdentity"}
IDENTITY_FIELDS = {"type", "principalId", "accountId", "accessKeyId", "userName"}


def lookup(c, *attrs: tuple[str, str], **kw):
    req = at.LookupEventsRequest(
        lookup_attribute=[at.LookupEventsRequestLookupAttribute(key=k, value=v) for k, v in attrs],
        **kw)
    return c.call(c.actiontrail.lookup_events_with_options, req)


@pytest.mark.parametrize("sig", ["v3", "v2"])
def test_events_have_the_real_field_set(make_client, accounts, sig):
    c = make_client(4, sig)
    name = f"audit-{uuid.uuid4().hex[:6]}"
    sg_id = c.rpc("Ecs", "CreateSecurityGroup", {"RegionId": "cn-hangzhou",
                                                 "SecurityGroupName": name})["SecurityGroupId"]
    events = lookup(c, ("ResourceName", sg_id)).events
    assert len(events) == 1
    event = events[0]
    assert EVENT_FIELDS <= event.keys()
    assert IDENTITY_FIELDS <= event["userIdentity"].keys()
    assert event["eventName"] == "CreateSecurityGroup"
    assert event["serviceName"] == "Ecs" and event["apiVersion"] == "2014-05-26"
    assert event["eventRW"] == "Write" and event["eventType"] == "ApiCall"
    assert event["acsRegion"] == "cn-hangzhou" and event["eventVersion"] == "1"
    assert event["resourceType"] == "ACS::ECS::SecurityGroup" and event["resourceName"] == sg_id
    assert event["referencedResources"] == {"ACS::ECS::SecurityGroup": [sg_id]}
    assert event["requestParameters"]["SecurityGroupName"] == name
    assert event["responseElements"]["SecurityGroupId"] == sg_id
    assert event["errorCode"] == "" and event["sourceIpAddress"] == "127.0.0.1"
    assert event["userAgent"].startswith("AlibabaCloud")
    account = accounts[4]
    assert event["userIdentity"] == {"type": "root-account", "principalId": account.account_id,
                                     "accountId": account.account_id,
                                     "accessKeyId": account.access_key_id, "userName": "root"}
    # No signing material in the logged parameters.
    assert not {"Signature", "SignatureNonce", "AccessKeyId"} & event["requestParameters"].keys()
    datetime.strptime(event["eventTime"], "%Y-%m-%dT%H:%M:%SZ")
    # The typed event reads the same fields and gives the JSON back unchanged.
    typed = AuditEvent.from_trail(event)
    assert typed.to_json() == event
    assert (typed.event_id, typed.event_name, typed.service_name, typed.event_time) == (
        event["eventId"], "CreateSecurityGroup", "Ecs", event["eventTime"])
    assert (typed.event_type, typed.event_rw, typed.region) == ("ApiCall", "Write", "cn-hangzhou")
    assert typed.parameters["SecurityGroupName"] == name and typed.response is not None
    assert typed.response["SecurityGroupId"] == sg_id
    assert typed.at("responseElements.SecurityGroupId") == sg_id
    assert (typed.resource_type, typed.resource_names) == ("ACS::ECS::SecurityGroup", (sg_id,))
    assert (typed.account_id, typed.access_key_id) == (account.account_id, account.access_key_id)
    assert typed.user_agent == event["userAgent"] and not typed.refused and not typed.by_console


def test_failed_calls_are_logged_with_error_code(make_client):
    c = make_client(4)
    with pytest.raises(CloudAPIError):
        c.rpc("Vpc", "DeleteVpc", {"VpcId": "vpc-bpdoesnotexist00000"})
    events = lookup(c, ("ResourceName", "vpc-bpdoesnotexist00000")).events
    assert [(e["eventName"], e["errorCode"]) for e in events] == [("DeleteVpc", "InvalidVpcId.NotFound")]
    assert "does not exist" in events[0]["errorMessage"]
    assert events[0]["responseElements"] is None
    typed = AuditEvent.from_trail(events[0])
    assert typed.refused and typed.error_code == "InvalidVpcId.NotFound"
    assert typed.error_message == events[0]["errorMessage"] and typed.response is None
    assert typed.to_json() == events[0]


def test_secrets_never_reach_the_audit_log(make_client, cloud):
    c = make_client(5)
    with pytest.raises(CloudAPIError):
        c.rpc("Ecs", "RunInstances", {"RegionId": "cn-hangzhou", "InstanceType": "ecs.g7.large",
                                      "ImageId": "ubuntu_22_04_x64_20G_alibase_20240710.vhd",
                                      "VSwitchId": "vsw-bpmissing", "Password": "Sup3r$ecretPw"})
    events = lookup(c, ("EventName", "RunInstances")).events
    assert events[0]["requestParameters"]["Password"] == "******"
    dump = json.dumps(lookup(c, max_results="50").events)
    assert "Sup3r$ecretPw" not in dump and "LocalSecret" not in dump
    assert "Sup3r$ecretPw".encode() not in (cloud.state_dir / "cloud.db").read_bytes()


def test_filters_and_and_of_two_attributes(make_client):
    c = make_client(6)
    user = f"filter-{uuid.uuid4().hex[:6]}"
    c.rpc("Ram", "CreateUser", {"UserName": user})
    c.rpc("Ram", "GetUser", {"UserName": user})
    c.rpc("Ecs", "DescribeSecurityGroups", {"RegionId": "cn-hangzhou"})
    assert [e["eventName"] for e in lookup(c, ("ResourceName", user)).events] == ["GetUser", "CreateUser"]
    both = lookup(c, ("ResourceName", user), ("EventRW", "Write")).events
    assert [e["eventName"] for e in both] == ["CreateUser"]
    assert all(e["serviceName"] == "Ram" for e in lookup(c, ("ServiceName", "Ram")).events)
    assert lookup(c, ("ServiceName", "ram")).events == []  # exact and case-sensitive
    created = lookup(c, ("EventName", "CreateUser"), ("ResourceType", "ACS::RAM::User")).events
    assert created and created[0]["resourceName"] == user
    assert created[0]["isGlobal"] is True
    event_id = created[0]["eventId"]
    assert [e["eventId"] for e in lookup(c, ("EventId", event_id)).events] == [event_id]
    key = created[0]["userIdentity"]["accessKeyId"]
    assert len(lookup(c, ("EventAccessKeyId", key), max_results="50").events) >= 3
    assert len(lookup(c, ("User", "root"), max_results="5").events) == 5
    with pytest.raises(CloudAPIError) as info:
        lookup(c, ("EventName", "A"), ("EventRW", "Write"), ("ServiceName", "Ram"))
    assert info.value.code == "InvalidParameter"
    with pytest.raises(CloudAPIError) as info:
        lookup(c, ("Colour", "blue"))
    assert info.value.code == "InvalidParameter" and "EventName" in info.value.message


def test_paging_ordering_and_time_range(make_client):
    c = make_client(7)
    marker = f"page-{uuid.uuid4().hex[:6]}"
    for i in range(7):
        c.rpc("Ram", "CreateUser", {"UserName": f"{marker}-{i}"})
    names = []
    token = None
    while True:
        page = lookup(c, ("EventName", "CreateUser"), max_results="3", next_token=token)
        assert len(page.events) <= 3
        names += [e["resourceName"] for e in page.events if e["resourceName"].startswith(marker)]
        token = page.next_token
        if not token:
            break
    assert names == [f"{marker}-{i}" for i in reversed(range(7))]   # BACKWARD (newest first)
    forward = lookup(c, ("EventName", "CreateUser"), max_results="50", direction="FORWARD").events
    assert [e["resourceName"] for e in forward if e["resourceName"].startswith(marker)] == \
        [f"{marker}-{i}" for i in range(7)]
    times = [e["eventTime"] for e in forward]
    assert times == sorted(times)
    future = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    later = (datetime.now(timezone.utc) + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert lookup(c, ("EventName", "CreateUser"), start_time=future, end_time=later).events == []
    with pytest.raises(CloudAPIError) as info:
        lookup(c, start_time=later, end_time=future)
    assert info.value.code == "InvalidParameter"
    with pytest.raises(CloudAPIError) as info:
        lookup(c, ("EventName", "CreateUser"), next_token="garbage!!")
    assert info.value.code == "InvalidParameter" and "NextToken" in info.value.message
    with pytest.raises(CloudAPIError) as info:
        lookup(c, ("EventName", "CreateUser"), max_results="0")
    assert info.value.code == "InvalidParameter"


def test_delivery_delay_holds_events_back(tmp_path, make_client):
    server = CloudServer(tmp_path, ["--delivery-delay", "1.5", "--lookup-qps", "0"])
    server.start()
    try:
        c = make_client(0, server=server)
        c.rpc("Ram", "CreateUser", {"UserName": "late"})
        assert lookup(c, ("EventName", "CreateUser")).events == []
        started = time.monotonic()
        events = wait_for(lambda: lookup(c, ("EventName", "CreateUser")).events, timeout=10)
        assert events[0]["resourceName"] == "late"
        assert time.monotonic() - started > 0.5
    finally:
        server.stop()
