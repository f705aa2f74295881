"""ResourceCoder end to end: a model answer (served by a real OpenAI-compatible HTTP endpoint
with a canned reply) becomes a plan that the sdk provisioner creates in a real local cloud, and
the episode's destroy leaves nothing."""
from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry

from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.llm import OpenAIChatClient
from infra.provisioning.resource_coder import Plan, ResourceCoder
from infra.provisioning.sdk import SdkProvisioner
from tests.conftest import CloudServer, _server

REPLY = """You need a network with an instance to start, and a user to check it.
```json
{"resources": [
 {"id": "net", "type": "vpc", "properties": {"name": "net-{episode}", "cidr_block": "10.8.0.0/16"}},
 {"id": "sw", "type": "vswitch", "properties": {"vpc": "${net}", "zone": "cn-hangzhou-i",
                                                "cidr_block": "10.8.1.0/24"}},
 {"id": "sg", "type": "security_group", "properties": {"vpc": "${net}", "name": "web-{episode}"}},
 {"id": "https", "type": "security_group_rule", "properties": {"security_group": "${sg}",
                                                               "port_range": "443/443"}},
 {"id": "vm", "type": "instance", "properties": {"vswitch": "${sw}", "security_group": "${sg}",
                                                 "name": "web-{episode}", "status": "Stopped"}},
 {"id": "ops", "type": "ram_user", "properties": {"name": "ops-{episode}",
                                                  "policies": ["AliyunECSReadOnlyAccess"]}},
 {"id": "logs", "type": "oss_bucket", "properties": {"name": "logs-{episode}"}}
]}
```"""


@pytest.fixture(scope="module")
def coder_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "coder-cloud", ["--transition", "0.2",
                                                        "--network-ready", "0.1",
                                                        "--lookup-qps", "0"])


@pytest.fixture(scope="module")
def chat_endpoint() -> Iterator[tuple[str, list[dict]]]:
    """A minimal OpenAI-compatible server on loopback answering every chat with REPLY."""
    requests: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append({"path": self.path, "body": body})
            data = json.dumps({"choices": [{"index": 0, "message": {
                "role": "assistant", "content": REPLY}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()
    server.server_close()


@pytest.fixture
def provisioner(coder_cloud, accounts) -> SdkProvisioner:
    account = accounts[0]

    def client() -> CloudClient:
        return CloudClient(CloudConfig(endpoint=coder_cloud.endpoint),
                           Credentials(account.access_key_id, account.access_key_secret))
    return SdkProvisioner(client, ready_timeout_s=20, poll_s=0.05)


def test_an_accepted_plan_provisions_for_real_and_destroy_leaves_nothing(provisioner,
                                                                        chat_endpoint):
    url, requests = chat_endpoint
    chat = OpenAIChatClient(url, "consolerl-policy", api_key_env=None, timeout_s=10)
    coder = ResourceCoder(chat, provisioner, registry=CollectorRegistry())
    plan = coder.plan("Start the web server and grant ops read access",
                      "1. Open the ECS console.\n2. Start instance web-...\n3. ...")
    chat.close()
    assert isinstance(plan, Plan), plan
    assert requests[0]["path"] == "/v1/chat/completions"
    assert "Start the web server" in requests[0]["body"]["messages"][1]["content"]

    ep = secrets.token_hex(4)
    result = coder.provision(plan, ep)
    ids = result.values()
    assert sorted(ids) == sorted(s.id for s in plan.specs)
    c = provisioner.client
    inst = c.rpc("Ecs", "DescribeInstances", {"RegionId": "cn-hangzhou", "InstanceIds":
                                              f'["{ids["vm"]}"]'})["Instances"]["Instance"][0]
    assert (inst["Status"], inst["InstanceName"]) == ("Stopped", f"web-{ep}")
    assert inst["VpcAttributes"]["VSwitchId"] == ids["sw"]
    rules = c.rpc("Ecs", "DescribeSecurityGroupAttribute", {
        "RegionId": "cn-hangzhou", "SecurityGroupId": ids["sg"]})["Permissions"]["Permission"]
    assert [r["PortRange"] for r in rules] == ["443/443"]
    assert c.rpc("Ram", "ListPoliciesForUser", {"UserName": f"ops-{ep}"})["Policies"][
        "Policy"][0]["PolicyName"] == "AliyunECSReadOnlyAccess"
    assert c.oss_bucket(f"logs-{ep}").get_bucket_info().name == f"logs-{ep}"
    assert coder.registry.get_sample_value("consolerl_resource_coder_provisions_total",
                                           {"outcome": "ok"}) == 1

    report = provisioner.destroy(ep)
    assert report.errors == []
    assert provisioner.leftovers(ep) == []
