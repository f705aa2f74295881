"""The sdk provisioner against the local cloud through the official SDKs: prerequisites exist
and are ready before an episode, nothing of the episode is left after destroy (also when the
agent renamed or deleted things), a failed provisioning cleans up and names what failed."""
from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from infra.cloud import CloudClient, CloudConfig, Credentials
from consolerl.resources import parse_resources
from infra.provisioning.sdk import EPISODE_TAG, ProvisionError, SdkProvisioner
from tests.conftest import CloudServer, _server

CHAIN = [
    {"id": "net", "type": "vpc", "properties": {"name": "net-{episode}"}},
    {"id": "sw", "type": "vswitch", "properties": {"vpc": "${net}", "zone": "cn-hangzhou-h",
                                                   "cidr_block": "192.168.1.0/24"}},
    {"id": "sg", "type": "security_group", "properties": {"vpc": "${net}", "name": "web"}},
    {"id": "ssh", "type": "security_group_rule", "properties": {"security_group": "${sg}"}},
    {"id": "vm", "type": "instance", "properties": {"vswitch": "${sw}", "security_group": "${sg}",
                                                    "name": "web-{episode}",
                                                    "status": "Stopped"}},
    {"id": "dev", "type": "ram_user", "properties": {"name": "dev-{episode}",
                                                     "policies": ["ReadOnlyAccess"]}},
    {"id": "assets", "type": "oss_bucket", "properties": {"name": "assets-{episode}",
                                                          "acl": "public-read"}},
]


@pytest.fixture(scope="module")
def prov_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "prov-cloud", ["--transition", "0.2",
                                                       "--network-ready", "0.1",
                                                       "--lookup-qps", "0"])


@pytest.fixture
def provisioner(prov_cloud, accounts) -> SdkProvisioner:
    account = accounts[0]

    def client() -> CloudClient:
        return CloudClient(CloudConfig(endpoint=prov_cloud.endpoint),
                           Credentials(account.access_key_id, account.access_key_secret))
    return SdkProvisioner(client, regions=("cn-shanghai",), ready_timeout_s=20, poll_s=0.05)


def episode() -> str:
    return secrets.token_hex(4)


def test_provision_creates_a_ready_tagged_chain_and_destroy_leaves_nothing(provisioner):
    ep = episode()
    result = provisioner.provision(parse_resources(CHAIN), ep)
    c = provisioner.client
    ids = result.values()
    inst = c.rpc("Ecs", "DescribeInstances", {"RegionId": "cn-hangzhou", "InstanceIds":
                                              f'["{ids["vm"]}"]'})["Instances"]["Instance"][0]
    assert (inst["Status"], inst["InstanceName"]) == ("Stopped", f"web-{ep}")
    assert {"TagKey": EPISODE_TAG, "TagValue": ep} in inst["Tags"]["Tag"]
    assert inst["SecurityGroupIds"]["SecurityGroupId"] == [ids["sg"]]
    vsw = c.rpc("Vpc", "DescribeVSwitches", {"RegionId": "cn-hangzhou", "VSwitchId": ids["sw"]})
    assert vsw["VSwitches"]["VSwitch"][0]["Status"] == "Available"
    rules = c.rpc("Ecs", "DescribeSecurityGroupAttribute", {
        "RegionId": "cn-hangzhou", "SecurityGroupId": ids["sg"]})["Permissions"]["Permission"]
    assert [(r["PortRange"], r["SourceCidrIp"]) for r in rules] == [("22/22", "0.0.0.0/0")]
    assert c.rpc("Ram", "ListPoliciesForUser", {"UserName": f"dev-{ep}"})["Policies"][
        "Policy"][0]["PolicyName"] == "ReadOnlyAccess"
    assert c.oss_bucket(f"assets-{ep}").get_bucket_acl().acl == "public-read"
    assert len(provisioner.leftovers(ep)) == 7 - 1          # the rule lives in its group

    # Provisioning again is idempotent: the same resources, nothing doubled.
    again = provisioner.provision(parse_resources(CHAIN), ep)
    assert again.values() == ids
    assert len(provisioner.leftovers(ep)) == 6

    report = provisioner.destroy(ep)
    assert report.errors == []
    assert provisioner.leftovers(ep) == []


def test_destroy_after_the_agent_renamed_and_deleted_things(provisioner):
    ep = episode()
    ids = provisioner.provision(parse_resources(CHAIN), ep).values()
    c = provisioner.client
    c.rpc("Ecs", "ModifyInstanceAttribute", {"InstanceId": ids["vm"],
                                             "InstanceName": "renamed-by-agent"})
    c.rpc("Ecs", "StartInstance", {"InstanceId": ids["vm"]})            # left running
    c.rpc("Ram", "DetachPolicyFromUser", {"UserName": f"dev-{ep}", "PolicyType": "System",
                                          "PolicyName": "ReadOnlyAccess"})
    c.oss_bucket(f"assets-{ep}").delete_bucket()                        # already gone
    report = provisioner.destroy(ep)
    assert report.errors == []
    assert provisioner.leftovers(ep) == []


def test_a_failed_provisioning_cleans_up_and_names_the_declaration(provisioner):
    ep = episode()
    broken = [*CHAIN[:1], {"id": "sw", "type": "vswitch", "properties": {
        "vpc": "${net}", "zone": "cn-hangzhou-h", "cidr_block": "10.9.0.0/24"}},   # not in VPC
        {"id": "dev", "type": "ram_user", "properties": {"name": "dev-{episode}"}}]
    with pytest.raises(ProvisionError) as err:
        provisioner.provision(parse_resources(broken), ep)
    assert err.value.spec_id == "sw" and "InvalidCidrBlock.Malformed" in str(err.value)
    assert provisioner.leftovers(ep) == []


def test_destroy_sweeps_all_configured_regions_and_a_crashed_half(provisioner):
    """A provisioning that died halfway (no result kept): destroy still finds it by tag."""
    ep = episode()
    c = provisioner.client
    vpc = c.rpc("Vpc", "CreateVpc", {"RegionId": "cn-shanghai", "Tag.1.Key": EPISODE_TAG,
                                     "Tag.1.Value": ep})["VpcId"]
    c.rpc("Ram", "CreateUser", {"UserName": f"half-{ep}"})
    assert sorted(provisioner.leftovers(ep)) == [f"ram_user half-{ep}", f"vpc {vpc}"]
    report = provisioner.destroy(ep)
    assert report.errors == [] and provisioner.leftovers(ep) == []


def test_episode_ids_are_checked(provisioner):
    from consolerl.errors import ConfigError
    for bad in ("", "UPPER1", "a", "x" * 17, "dev; rm"):
        with pytest.raises(ConfigError, match="episode id"):
            provisioner.leftovers(bad)


def test_a_failed_provisioning_makes_the_episode_an_env_error(prov_cloud, accounts,
                                                              redis_server):
    from consolerl.tasks import parse_task
    from env_workers.accounts import PoolConfig
    from env_workers.pool import LeasedEnvWorker
    from env_workers.worker import WorkerConfig
    from reward_service.service import RewardService
    from rollout_service.episode import EpisodeRunner, scripted_policy
    from datagen.oracle import run_oracle
    from tests.conftest import run_async

    task = parse_task({
        "schema": 1, "id": "broken-prereq", "product": "vpc", "title": "t",
        "procedure": "1. Nothing.\n", "start_page": "/console/vpc/vpcs", "split": "train",
        "difficulty": 1, "prerequisites": [
            {"id": "net", "type": "vpc", "properties": {}},
            {"id": "sw", "type": "vswitch", "properties": {"vpc": "${net}", "zone": "nowhere-1a",
                                                           "cidr_block": "192.168.1.0/24"}}],
        "success": {"required_events": [{"event": "DeleteVSwitch"}]},
        "oracle": {"family": "vpc_delete_vswitch", "args": {"vswitch": "{sw}"}}}, "inline")
    runner = EpisodeRunner(accounts, prov_cloud.endpoint,
                           RewardService([task], accounts, prov_cloud.endpoint).score)

    async def go():
        # The browser never starts: the episode stops before it.
        env = LeasedEnvWorker(WorkerConfig(console_url=prov_cloud.url),
                              PoolConfig(redis_url=redis_server.url,
                                         key_prefix="test:prov-episode"), "w0")
        try:
            return await runner.run(env, task, scripted_policy(run_oracle), max_steps=5)
        finally:
            await env.drain()
    outcome = run_async(go())
    assert outcome.status == "env_error" and outcome.env_error.kind == "provision_failed"
    assert "sw" in outcome.env_error.message
    assert "InvalidZoneId.NotFound" in outcome.env_error.message
    assert outcome.trajectory is None and outcome.reward is None
    leased = runner.accounts[outcome.account_id]
    assert outcome.leaked == [] and runner.provisioner(leased).leftovers(outcome.episode_id) == []
