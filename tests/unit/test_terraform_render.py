"""The terraform provisioner, offline: rendering to alicloud Terraform JSON (resource types,
argument names per the provider docs, interpolations, tags, determinism) and the apply/destroy
driver against a fake ``terraform`` executable."""
from __future__ import annotations

import json
import os
import random
import stat
import sys
from pathlib import Path

import pytest

from consolerl.errors import ConfigError
from consolerl.resources import ResourceSpec, parse_resources
from infra.provisioning.sdk import EPISODE_TAG, ProvisionError
from infra.provisioning.terraform import (ENDPOINT_PRODUCTS, META_ARGUMENTS, PROVIDER_ARGUMENTS,
                                          RESOURCE_ARGUMENTS, TerraformProvisioner, dumps,
                                          render)

EP = "ep12345a"
CHAIN = [
    {"id": "net", "type": "vpc", "properties": {"name": "net-{episode}",
                                                "description": "costs ${price}"}},
    {"id": "sw", "type": "vswitch", "properties": {"vpc": "${net}", "zone": "cn-hangzhou-h",
                                                   "cidr_block": "192.168.1.0/24"}},
    {"id": "sg", "type": "security_group", "properties": {"vpc": "${net}",
                                                          "name": "sg-{episode}"}},
    {"id": "ssh", "type": "security_group_rule", "properties": {"security_group": "${sg}"}},
    {"id": "ping", "type": "security_group_rule", "properties": {
        "security_group": "${sg}", "direction": "egress", "protocol": "ICMP",
        "cidr": "10.0.0.0/8", "policy": "drop", "priority": 5, "description": "no ping"}},
    {"id": "vm", "type": "instance", "properties": {"vswitch": "${sw}", "security_group": "${sg}",
                                                    "name": "vm-{episode}", "status": "Stopped"}},
    {"id": "dev", "type": "ram_user", "properties": {
        "name": "dev-{episode}", "display_name": "Dev {owner}",
        "policies": ["ReadOnlyAccess", "AliyunOSSFullAccess"]}},
    {"id": "logs", "type": "oss_bucket", "properties": {"name": "logs-{episode}",
                                                        "acl": "public-read"}},
]
TAG = {EPISODE_TAG: EP}


@pytest.fixture
def specs() -> list[ResourceSpec]:
    return parse_resources(CHAIN, "tasks/chain.yaml")


def _doc(specs: list[ResourceSpec], **kw) -> dict:
    return render(specs, EP, {"owner": "alice"}, **kw)


def test_the_full_chain_renders_to_alicloud_resources_and_arguments(specs):
    res = _doc(specs)["resource"]
    assert sorted(res) == ["alicloud_instance", "alicloud_oss_bucket", "alicloud_oss_bucket_acl",
                           "alicloud_ram_user", "alicloud_ram_user_policy_attachment",
                           "alicloud_security_group", "alicloud_security_group_rule",
                           "alicloud_vpc", "alicloud_vswitch"]
    assert res["alicloud_vpc"] == {"net": {"vpc_name": f"net-{EP}", "cidr_block": "192.168.0.0/16",
                                           "description": "costs $${price}", "tags": TAG}}
    assert res["alicloud_vswitch"] == {"sw": {
        "vpc_id": "${alicloud_vpc.net.id}", "zone_id": "cn-hangzhou-h",
        "cidr_block": "192.168.1.0/24", "tags": TAG}}
    assert res["alicloud_security_group"] == {"sg": {
        "vpc_id": "${alicloud_vpc.net.id}", "security_group_name": f"sg-{EP}",
        "security_group_type": "normal", "tags": TAG}}
    assert res["alicloud_security_group_rule"] == {
        "ssh": {"security_group_id": "${alicloud_security_group.sg.id}", "type": "ingress",
                "ip_protocol": "tcp", "port_range": "22/22", "cidr_ip": "0.0.0.0/0",
                "policy": "accept", "priority": 1, "nic_type": "intranet"},
        "ping": {"security_group_id": "${alicloud_security_group.sg.id}", "type": "egress",
                 "ip_protocol": "icmp", "port_range": "-1/-1", "cidr_ip": "10.0.0.0/8",
                 "policy": "drop", "priority": 5, "nic_type": "intranet",
                 "description": "no ping"}}
    assert res["alicloud_instance"] == {"vm": {
        "instance_type": "ecs.t6-c1m1.large", "image_id": "aliyun_3_x64_20G_alibase_20240819.vhd",
        "vswitch_id": "${alicloud_vswitch.sw.id}",
        "security_groups": ["${alicloud_security_group.sg.id}"],
        "instance_name": f"vm-{EP}", "status": "Stopped", "tags": TAG}}
    assert res["alicloud_ram_user"] == {"dev": {"name": f"dev-{EP}", "display_name": "Dev alice",
                                                "force": True}}
    assert res["alicloud_ram_user_policy_attachment"] == {
        "dev_0": {"user_name": "${alicloud_ram_user.dev.name}", "policy_name": "ReadOnlyAccess",
                  "policy_type": "System"},
        "dev_1": {"user_name": "${alicloud_ram_user.dev.name}",
                  "policy_name": "AliyunOSSFullAccess", "policy_type": "System"}}
    assert res["alicloud_oss_bucket"] == {"logs": {
        "bucket": f"logs-{EP}", "storage_class": "Standard", "force_destroy": True,
        "lifecycle": {"ignore_changes": ["acl"]}}}
    assert res["alicloud_oss_bucket_acl"] == {"logs": {
        "bucket": "${alicloud_oss_bucket.logs.bucket}", "acl": "public-read"}}


def test_every_argument_is_in_the_provider_allow_list(specs):
    doc = _doc(specs, endpoint="127.0.0.1:18080")
    for tf_type, blocks in doc["resource"].items():
        assert tf_type in RESOURCE_ARGUMENTS, tf_type
        for name, block in blocks.items():
            unknown = set(block) - RESOURCE_ARGUMENTS[tf_type] - META_ARGUMENTS
            assert not unknown, f"{tf_type}.{name}: {sorted(unknown)} not in RESOURCE_ARGUMENTS"
    provider = doc["provider"]["alicloud"]
    assert set(provider) <= PROVIDER_ARGUMENTS
    assert set(provider["endpoints"]) <= set(ENDPOINT_PRODUCTS)


def test_taggable_resources_carry_the_episode_tag_and_named_ones_the_episode_id(specs):
    res = _doc(specs)["resource"]
    for tf_type in ("alicloud_vpc", "alicloud_vswitch", "alicloud_security_group",
                    "alicloud_instance"):
        assert all(block["tags"] == TAG for block in res[tf_type].values()), tf_type
    assert EP in res["alicloud_ram_user"]["dev"]["name"]
    assert EP in res["alicloud_oss_bucket"]["logs"]["bucket"]


def test_the_document_is_deterministic_whatever_the_declaration_order(specs):
    first = dumps(_doc(specs))
    shuffled = list(specs)
    random.Random(7).shuffle(shuffled)
    assert dumps(_doc(shuffled)) == first == dumps(_doc(specs))
    assert json.loads(first)["terraform"]["required_providers"]["alicloud"]["source"] == \
        "aliyun/alicloud"


def test_endpoints_block_only_for_a_local_endpoint(specs):
    assert _doc(specs)["provider"] == {"alicloud": {"region": "cn-hangzhou"}}
    local = _doc(specs, region="cn-shanghai", endpoint="http://127.0.0.1:18080")
    assert local["provider"]["alicloud"] == {
        "region": "cn-shanghai", "protocol": "HTTP",
        "endpoints": {p: "127.0.0.1:18080" for p in ("ecs", "vpc", "ram", "oss")}}
    bare = _doc(specs, region="cn-shanghai", endpoint="127.0.0.1:18080")
    assert bare["provider"] == local["provider"]      # no scheme means the local cloud's http
    with pytest.raises(ConfigError, match="endpoint must be host"):
        _doc(specs, endpoint="ftp://127.0.0.1/x")


def test_unknown_types_and_references_are_clear_errors(specs):
    with pytest.raises(ConfigError, match=r"'db'\.type: no terraform rendering for 'database'; "
                                          r"allowed: vpc"):
        render([ResourceSpec("db", "database", {})], EP, None)
    bad = ResourceSpec("sw", "vswitch", {"vpc": "${nope}", "zone": "z",
                                         "cidr_block": "10.0.0.0/24"})
    with pytest.raises(ConfigError, match=r"'sw'\.vpc: '\$\{nope\}' does not refer"):
        render([bad], EP, None)
    with pytest.raises(ConfigError, match="episode id"):
        render(specs, "Bad-Id", None)
    with pytest.raises(ConfigError, match=r"placeholder \{owner\}"):
        render(specs, EP, None)


def test_no_secret_reaches_the_document(specs, monkeypatch):
    monkeypatch.setenv("ALICLOUD_ACCESS_KEY", "AKIDnotinthefile")
    monkeypatch.setenv("ALICLOUD_SECRET_KEY", "s3cretnotinthefile")
    text = dumps(_doc(specs, endpoint="127.0.0.1:18080"))
    assert "notinthefile" not in text
    assert "access_key" not in text and "secret_key" not in text


def test_without_a_binary_it_is_unavailable_and_provision_names_it(tmp_path, specs):
    empty = tmp_path / "bin"
    empty.mkdir()
    tp = TerraformProvisioner(tmp_path / "work", env={"PATH": str(empty)})
    assert tp.available() is False
    with pytest.raises(ConfigError, match="terraform binary 'terraform' not found"):
        tp.provision(specs, EP, {"owner": "alice"})
    missing = TerraformProvisioner(tmp_path / "work", terraform_bin="/nowhere/tf-1.9")
    assert missing.available() is False
    with pytest.raises(ConfigError, match="'/nowhere/tf-1.9'"):
        missing.provision(specs, EP, {"owner": "alice"})


# ---- the driver, against a fake terraform ------------------------------------------------------
FAKE = r'''
import json, os, re, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_TF_LOG"], "a") as log:
    creds = bool(os.environ.get("ALICLOUD_ACCESS_KEY") and os.environ.get("ALICLOUD_SECRET_KEY"))
    log.write(" ".join(args) + (" creds" if creds else "") + "\n")
mode = os.environ.get("FAKE_TF_MODE", "ok")
if args[0] in ("version", "init", "destroy"):
    sys.exit(0)
if args[0] == "apply":
    Path("terraform.tfstate").write_text("{}")
    if mode == "fail_apply":
        sys.stderr.write("Error: InvalidInstanceType\n\n  with alicloud_instance.vm,\n")
        sys.exit(1)
    sys.exit(0)
doc = json.loads(Path("main.tf.json").read_text())["resource"]
prefix = {"alicloud_vpc": "vpc", "alicloud_vswitch": "vsw", "alicloud_security_group": "sg",
          "alicloud_instance": "i"}
ids = {(t, n): f"{prefix.get(t, 'id')}-{n}" for t, blocks in doc.items() for n in blocks}
def resolve(v):
    def sub(m):
        t, n, attr = m.groups()
        return ids[(t, n)] if attr == "id" else doc[t][n][attr]
    return re.sub(r"\$\{(\w+)\.(\w+)\.(\w+)\}", sub, v) if isinstance(v, str) else v
resources = [{"address": f"{t}.{n}", "mode": "managed", "type": t, "name": n,
              "values": {"id": ids[(t, n)], **{k: resolve(v) for k, v in b.items()}}}
             for t, blocks in doc.items() for n, b in blocks.items()
             if mode == "ok" or t == "alicloud_vpc"]
print(json.dumps({"values": {"root_module": {"resources": resources}}}))
'''


@pytest.fixture
def fake(tmp_path, monkeypatch) -> TerraformProvisioner:
    tool = tmp_path / "bin" / "terraform"
    tool.parent.mkdir()
    tool.write_text(f"#!{sys.executable}\n{FAKE}")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.delenv("ALICLOUD_ACCESS_KEY", raising=False)
    monkeypatch.delenv("ALICLOUD_SECRET_KEY", raising=False)
    return TerraformProvisioner(tmp_path / "work", env={
        "PATH": f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "FAKE_TF_LOG": str(tmp_path / "calls.log"),
        "ALIBABA_CLOUD_ACCESS_KEY_ID": "AKIDproject", "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "shh"})


def _calls(tp: TerraformProvisioner) -> list[str]:
    return Path(tp._env["FAKE_TF_LOG"]).read_text().splitlines()


def test_provision_applies_and_maps_ids_like_the_sdk_backend(fake, specs):
    assert fake.available()
    result = fake.provision(specs, EP, {"owner": "alice"})
    assert result.values() == {
        "net": "vpc-net", "sw": "vsw-sw", "sg": "sg-sg", "vm": "i-vm", "dev": f"dev-{EP}",
        "logs": f"logs-{EP}", "ssh": "sg-sg:ingress:TCP:22/22:0.0.0.0/0",
        "ping": "sg-sg:egress:ICMP:-1/-1:10.0.0.0/8"}
    assert [r.spec_id for r in result.resources] == [s.id for s in specs]
    assert {r.region for r in result.resources if r.type != "ram_user"} == {"cn-hangzhou"}
    written = (fake.workdir(EP) / "main.tf.json").read_text()
    assert written == dumps(_doc(specs)) and "shh" not in written and "AKIDproject" not in written
    assert _calls(fake) == ["version creds", "init -input=false -no-color creds",
                            "apply -auto-approve -input=false -no-color creds",
                            "show -json -no-color creds"]
    report = fake.destroy(EP)
    assert report.errors == [] and "alicloud_instance.vm" in report.deleted
    assert _calls(fake)[-1] == "destroy -auto-approve -input=false -no-color creds"


def test_a_failed_apply_destroys_and_blames_the_declaration(fake, specs):
    fake._env["FAKE_TF_MODE"] = "fail_apply"
    with pytest.raises(ProvisionError) as info:
        fake.provision(specs, EP, {"owner": "alice"})
    assert info.value.spec_id == "vm" and "InvalidInstanceType" in info.value.message
    assert info.value.episode_id == EP
    assert _calls(fake)[-1].startswith("destroy -auto-approve")


def test_destroy_without_state_does_nothing(fake):
    assert fake.destroy(EP).deleted == []
    assert not Path(fake._env["FAKE_TF_LOG"]).exists()
