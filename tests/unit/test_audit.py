"""consolerl.audit: an ActionTrail event to :class:`AuditEvent` and back, unchanged; its fields,
dotted paths and pickling. The samples are events as the local cloud writes them
(infra/console_sim/service.py) and as the real ActionTrail returns them (fields missing,
``eventVersion`` a number, a RAM user's identity)."""
from __future__ import annotations

import copy
import json
import pickle

import pytest

from consolerl.audit import AuditEvent, dotted

ACCOUNT = "1000000000000001"
# CreateSecurityGroup through the SDK, as the local cloud logs it.
SIM_CREATE = {
    "eventId": "8C1F5D2A-7E0B-4C36-9A41-2F8D5E6B7C10", "eventName": "CreateSecurityGroup",
    "eventSource": "ecs.cn-hangzhou.aliyuncs.com", "eventTime": "2026-11-28T15:20:05Z",
    "eventType": "ApiCall", "eventRW": "Write", "eventVersion": "1", "acsRegion": "cn-hangzhou",
    "serviceName": "Ecs", "apiVersion": "2014-05-26",
    "requestId": "5E1A2B3C-4D5E-6F70-8192-A3B4C5D6E7F8",
    "requestParameters": {"RegionId": "cn-hangzhou", "SecurityGroupName": "web",
                          "VpcId": "vpc-bp1abc"},
    "responseElements": {"RequestId": "5E1A2B3C-4D5E-6F70-8192-A3B4C5D6E7F8",
                         "SecurityGroupId": "sg-bp1xyz"},
    "referencedResources": {"ACS::ECS::SecurityGroup": ["sg-bp1xyz"],
                            "ACS::VPC::VPC": ["vpc-bp1abc"]},
    "resourceName": "sg-bp1xyz", "resourceType": "ACS::ECS::SecurityGroup",
    "errorCode": "", "errorMessage": "", "sourceIpAddress": "127.0.0.1",
    "userAgent": "AlibabaCloud (Linux; x86_64) Python/3.11.7 Core/1.0 TeaDSL/1",
    "isGlobal": False,
    "userIdentity": {"type": "root-account", "principalId": ACCOUNT, "accountId": ACCOUNT,
                     "accessKeyId": "LTAI5tExampleKey0001", "userName": "root"},
}
# A DeleteVpc the console refused, as the local cloud logs it.
SIM_REFUSED = {
    **SIM_CREATE, "eventId": "0D9E8F7A-6B5C-4D3E-2F1A-0B9C8D7E6F5A", "eventName": "DeleteVpc",
    "eventSource": "vpc.console.aliyun.com", "eventType": "ConsoleOperation",
    "serviceName": "Vpc", "apiVersion": "2016-04-28",
    "requestParameters": {"VpcId": "vpc-bp1abc", "RegionId": "cn-hangzhou"},
    "responseElements": None, "referencedResources": {"ACS::VPC::VPC": ["vpc-bp1abc"]},
    "resourceName": "vpc-bp1abc", "resourceType": "ACS::VPC::VPC",
    "errorCode": "DependencyViolation.VSwitch",
    "errorMessage": "The specified VPC still has vSwitches.",
    "userAgent": "vpc.console.aliyun.com Mozilla/5.0 consolerl-agent/1000000000000001/3",
}
# A real ActionTrail event: no errorCode or responseElements, several resources, a RAM user.
REAL_START = {
    "eventId": "A1B2C3D4-E5F6-4711-8899-AABBCCDDEEFF", "eventVersion": 1,
    "eventSource": "ecs-cn-hangzhou.aliyuncs.com", "sourceIpAddress": "203.0.113.7",
    "userAgent": "AlibabaCloud (Linux; amd64) Go/1.21 Core/1.63 TeaDSL/1", "eventRW": "Write",
    "eventType": "ApiCall", "isGlobal": False, "acsRegion": "cn-hangzhou",
    "eventName": "StartInstances", "serviceName": "Ecs", "eventTime": "2026-11-28T15:21:00Z",
    "requestId": "F0E1D2C3-B4A5-9687-7869-5A4B3C2D1E0F",
    "requestParameters": {"InstanceId": ["i-bp1one", "i-bp1two"], "RegionId": "cn-hangzhou"},
    "additionalEventData": {"isMFAChecked": "false"},
    "resourceName": "i-bp1one;i-bp1two", "resourceType": "ACS::ECS::Instance",
    "userIdentity": {"type": "ram-user", "principalId": "2030000000000001",
                     "accountId": ACCOUNT, "accessKeyId": "LTAI5tRamUserKey0002",
                     "userName": "ops", "sessionContext": {"attributes": {
                         "mfaAuthenticated": "false", "creationDate": "2026-11-28T15:00:00Z"}}},
}


@pytest.mark.parametrize("sample", [SIM_CREATE, SIM_REFUSED, REAL_START],
                         ids=["sim-create", "sim-refused", "real"])
def test_the_json_comes_back_unchanged(sample):
    before = copy.deepcopy(sample)
    event = AuditEvent.from_trail(sample)
    assert event.to_json() == sample
    assert json.dumps(event.to_json(), sort_keys=True) == json.dumps(sample, sort_keys=True)
    assert sample == before                      # the input is not touched...
    event.to_json()["requestParameters"]["X"] = 1
    assert event.to_json() == sample             # ...nor the event by what to_json gave


def test_fields_of_an_sdk_write():
    e = AuditEvent.from_trail(SIM_CREATE)
    assert (e.event_id, e.event_name, e.service_name) == (
        SIM_CREATE["eventId"], "CreateSecurityGroup", "Ecs")
    assert (e.event_time, e.event_type, e.event_rw, e.region) == (
        "2026-11-28T15:20:05Z", "ApiCall", "Write", "cn-hangzhou")
    assert dict(e.parameters) == SIM_CREATE["requestParameters"]
    assert e.response is not None and e.response["SecurityGroupId"] == "sg-bp1xyz"
    assert (e.error_code, e.error_message, e.refused) == ("", "", False)
    assert (e.resource_type, e.resource_names) == ("ACS::ECS::SecurityGroup", ("sg-bp1xyz",))
    assert (e.account_id, e.access_key_id) == (ACCOUNT, "LTAI5tExampleKey0001")
    assert e.user_agent.startswith("AlibabaCloud") and not e.by_console
    assert e.epoch == 1_795_879_205.0


def test_fields_of_a_refused_console_call():
    e = AuditEvent.from_trail(SIM_REFUSED)
    assert e.refused and e.error_code == "DependencyViolation.VSwitch"
    assert e.error_message == "The specified VPC still has vSwitches."
    assert e.response is None and e.by_console
    assert e.at("requestParameters.VpcId") == "vpc-bp1abc"


def test_a_real_event_with_fields_missing_reads_them_empty():
    e = AuditEvent.from_trail(REAL_START)
    assert (e.error_code, e.error_message, e.refused, e.response) == ("", "", False, None)
    assert e.resource_names == ("i-bp1one", "i-bp1two")
    assert e.at("requestParameters.InstanceId.1") == "i-bp1two"
    assert e.at("userIdentity.sessionContext.attributes.mfaAuthenticated") == "false"
    assert e.at("requestParameters.Missing.Deeper") is None and e.at("nothing") is None
    assert (e.account_id, e.access_key_id) == (ACCOUNT, "LTAI5tRamUserKey0002")
    bare = AuditEvent.from_trail({"eventId": "e1", "eventTime": "yesterday",
                                  "requestParameters": None, "userIdentity": "?"})
    assert (bare.event_name, bare.account_id, dict(bare.parameters)) == ("", "", {})
    assert bare.epoch == float("-inf")           # sorts first; episode windows drop it


def test_the_event_is_read_only_and_pickles_as_its_json():
    e = AuditEvent.from_trail(SIM_CREATE)
    with pytest.raises(AttributeError):
        e.event_name = "DeleteSecurityGroup"     # type: ignore[misc]
    with pytest.raises(TypeError):
        e.parameters["VpcId"] = "vpc-other"      # type: ignore[index]
    back = pickle.loads(pickle.dumps(e))
    assert back == e and back.to_json() == SIM_CREATE
    assert hash(back) == hash(e)


def test_brief_keeps_identity_and_outcome():
    b = AuditEvent.from_trail(SIM_REFUSED).brief()
    assert b.to_json() == {"eventId": SIM_REFUSED["eventId"], "eventName": "DeleteVpc",
                           "eventTime": "2026-11-28T15:20:05Z",
                           "errorCode": "DependencyViolation.VSwitch"}
    assert b.refused and b.parameters == {}


def test_dotted_walks_mappings_and_lists():
    data = {"Instances": {"Instance": [{"Status": "Running"}, {"Status": "Stopped"}]}}
    assert dotted(data, "Instances.Instance.1.Status") == "Stopped"
    assert dotted(data, "Instances.Instance.2.Status") is None
    assert dotted(data, "Instances.Instance.x") is None
