"""The ``terraform`` provisioner: renders Resource META declarations to alicloud Terraform JSON
(``main.tf.json``) and runs ``terraform apply`` / ``destroy`` with the aliyun/alicloud provider.

- :func:`render` is pure and deterministic: the same declarations give the same document
  (dump it with ``sort_keys=True``). Resource types and argument names are those of the
  provider's documentation (``website/docs/r/*.html.markdown`` of
  aliyun/terraform-provider-alicloud), kept in :data:`RESOURCE_ARGUMENTS` so a typo in the
  renderer fails a unit test.
- Taggable resources (VPC, vSwitch, security group, instance) carry the tag
  ``consolerl-episode=<episode id>`` exactly as the ``sdk`` backend does; RAM users and buckets
  carry the episode id in their names (checked by Resource META).
- Credentials never enter the document: the provider reads ``ALICLOUD_ACCESS_KEY`` /
  ``ALICLOUD_SECRET_KEY`` from the environment of the ``terraform`` process.
- :meth:`TerraformProvisioner.destroy` removes what the Terraform state holds. What the agent made
  outside the state is not in it; the ``sdk`` backend's tag/name sweep stays the authority for
  leftovers.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from consolerl.errors import ConfigError

from consolerl.resources import ResourceSpec, fill
from .sdk import (EPISODE_TAG, DestroyReport, Provisioned, ProvisionError, ProvisionResult,
                  check_episode_id)

PROVIDER_SOURCE = "aliyun/alicloud"
# security_group_name needs 1.239.0 and alicloud_oss_bucket_acl needs 1.220.0 (provider docs).
PROVIDER_VERSION = ">= 1.239.0"

# Resource META type -> the alicloud resource that creates it.
RESOURCE_TYPES: Mapping[str, str] = {
    "vpc": "alicloud_vpc",
    "vswitch": "alicloud_vswitch",
    "security_group": "alicloud_security_group",
    "security_group_rule": "alicloud_security_group_rule",
    "instance": "alicloud_instance",
    "ram_user": "alicloud_ram_user",
    "oss_bucket": "alicloud_oss_bucket",
}
# Argument names per the provider docs (only those this renderer may emit, plus close relatives
# documented on the same page). Every emitted key must be in here; a unit test checks it.
RESOURCE_ARGUMENTS: Mapping[str, frozenset[str]] = {
    "alicloud_vpc": frozenset({"vpc_name", "cidr_block", "description", "tags",
                               "resource_group_id", "enable_ipv6"}),
    "alicloud_vswitch": frozenset({"vpc_id", "cidr_block", "zone_id", "vswitch_name",
                                   "description", "tags"}),
    "alicloud_security_group": frozenset({"security_group_name", "vpc_id", "description",
                                          "security_group_type", "inner_access_policy",
                                          "resource_group_id", "tags"}),
    "alicloud_security_group_rule": frozenset({"type", "ip_protocol", "port_range", "cidr_ip",
                                               "policy", "priority", "security_group_id",
                                               "nic_type", "description",
                                               "source_security_group_id", "ipv6_cidr_ip"}),
    # `status` (Running/Stopped) is documented "Optional 1.85.0+".
    "alicloud_instance": frozenset({"instance_type", "image_id", "vswitch_id", "security_groups",
                                    "instance_name", "status", "description", "tags",
                                    "instance_charge_type", "internet_max_bandwidth_out"}),
    "alicloud_ram_user": frozenset({"name", "display_name", "comments", "force"}),
    "alicloud_ram_user_policy_attachment": frozenset({"policy_name", "policy_type",
                                                      "user_name"}),
    # `acl` on the bucket itself still exists but is superseded by alicloud_oss_bucket_acl.
    "alicloud_oss_bucket": frozenset({"bucket", "storage_class", "force_destroy", "tags",
                                      "acl"}),
    "alicloud_oss_bucket_acl": frozenset({"bucket", "acl"}),
}
# Terraform meta-arguments, valid in any resource block.
META_ARGUMENTS = frozenset({"lifecycle", "depends_on"})
PROVIDER_ARGUMENTS = frozenset({"region", "endpoints", "protocol"})
ENDPOINT_PRODUCTS = ("ecs", "vpc", "ram", "oss")
TAGGABLE = frozenset({"vpc", "vswitch", "security_group", "instance"})

_REF = re.compile(r"\$\{([a-z][a-z0-9_]{0,31})\}")
_TF_ADDRESS = re.compile(r"\bwith (alicloud_[a-z0-9_]+\.[a-z][a-z0-9_]*)")


def render(specs: list[ResourceSpec], episode_id: str, values: Mapping[str, str] | None = None,
           region: str = "cn-hangzhou", endpoint: str | None = None) -> dict[str, Any]:
    """The Terraform JSON document (``main.tf.json``) that creates ``specs`` for the episode.

    ``values`` fill ``{name}`` placeholders (``{episode}`` is always ``episode_id``);
    ``endpoint`` (``host:port`` or ``http://host:port``, the local cloud) points the provider's
    ECS, VPC, RAM and OSS endpoints at one host. Raises :class:`ConfigError` for an unknown
    resource type or a reference to an undeclared id.
    """
    return _render(specs, episode_id, values, region, endpoint)[0]


def _render(specs: list[ResourceSpec], episode_id: str, values: Mapping[str, str] | None,
            region: str, endpoint: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The document and ``owners``: Terraform address -> the spec id that declared it."""
    check_episode_id(episode_id)
    filled_values = {**(values or {}), "episode": episode_id}
    types = {s.id: s.type for s in specs}
    resources: dict[str, dict[str, Any]] = {}
    owners: dict[str, str] = {}

    def ref(spec: ResourceSpec, prop: str, attribute: str = "id") -> str:
        target = _REF.fullmatch(spec.properties[prop])
        if target is None or target[1] not in types:
            raise ConfigError(f"resource {spec.id!r}.{prop}: {spec.properties[prop]!r} does not "
                              f"refer to a declared resource; declared: {', '.join(sorted(types))}")
        return f"${{{RESOURCE_TYPES[types[target[1]]]}.{target[1]}.{attribute}}}"

    def add(tf_type: str, name: str, spec_id: str, block: dict[str, Any]) -> None:
        resources.setdefault(tf_type, {})[name] = {k: v for k, v in block.items()
                                                  if v is not None}
        owners[f"{tf_type}.{name}"] = spec_id

    for spec in specs:
        if spec.type not in RESOURCE_TYPES:
            raise ConfigError(f"resource {spec.id!r}.type: no terraform rendering for "
                              f"{spec.type!r}; allowed: {', '.join(RESOURCE_TYPES)}")
        refs = spec.refs()
        p = {k: _literal(fill(v, filled_values)) for k, v in spec.properties.items()
             if k not in refs}
        tags = {EPISODE_TAG: episode_id} if spec.type in TAGGABLE else None
        tf_type = RESOURCE_TYPES[spec.type]
        if spec.type == "vpc":
            block = {"vpc_name": p.get("name"), "cidr_block": p["cidr_block"],
                     "description": p.get("description"), "tags": tags}
        elif spec.type == "vswitch":
            block = {"vpc_id": ref(spec, "vpc"), "zone_id": p["zone"],
                     "cidr_block": p["cidr_block"], "vswitch_name": p.get("name"),
                     "description": p.get("description"), "tags": tags}
        elif spec.type == "security_group":
            block = {"vpc_id": ref(spec, "vpc"), "security_group_name": p.get("name"),
                     "security_group_type": p["group_type"],
                     "description": p.get("description"), "tags": tags}
        elif spec.type == "security_group_rule":
            protocol = p["protocol"].lower()
            block = {"security_group_id": ref(spec, "security_group"), "type": p["direction"],
                     "ip_protocol": protocol,
                     # The provider accepts only -1/-1 for protocols without ports.
                     "port_range": p["port_range"] if protocol in ("tcp", "udp") else "-1/-1",
                     "cidr_ip": p["cidr"], "policy": p["policy"], "priority": p["priority"],
                     # VPC security groups do not tell intranet from internet; the provider
                     # docs require intranet for them.
                     "nic_type": "intranet", "description": p.get("description")}
        elif spec.type == "instance":
            block = {"instance_type": p["instance_type"], "image_id": p["image"],
                     "vswitch_id": ref(spec, "vswitch"),
                     "security_groups": [ref(spec, "security_group")],
                     "instance_name": p.get("name"), "status": p["status"], "tags": tags}
        elif spec.type == "ram_user":
            # force: destroy must also remove access keys and policies the agent attached.
            block = {"name": p["name"], "display_name": p.get("display_name"), "force": True}
            for i, policy in enumerate(spec.properties.get("policies", ())):
                add("alicloud_ram_user_policy_attachment", f"{spec.id}_{i}", spec.id, {
                    "user_name": f"${{alicloud_ram_user.{spec.id}.name}}",
                    "policy_name": _literal(fill(policy, filled_values)),
                    "policy_type": "System"})
        else:   # oss_bucket
            # force_destroy: objects the agent uploaded must not block the episode's cleanup.
            # The ACL lives in alicloud_oss_bucket_acl (provider >= 1.220.0); the docs ask for
            # ignore_changes on the bucket's own acl so the two do not fight.
            block = {"bucket": p["name"], "storage_class": p["storage_class"],
                     "force_destroy": True, "lifecycle": {"ignore_changes": ["acl"]}}
            add("alicloud_oss_bucket_acl", spec.id, spec.id, {
                "bucket": f"${{alicloud_oss_bucket.{spec.id}.bucket}}", "acl": p["acl"]})
        add(tf_type, spec.id, spec.id, block)

    doc: dict[str, Any] = {
        "terraform": {"required_providers": {"alicloud": {"source": PROVIDER_SOURCE,
                                                          "version": PROVIDER_VERSION}}},
        "provider": {"alicloud": _provider(region, endpoint)},
        "resource": resources,
    }
    return doc, owners


def _provider(region: str, endpoint: str | None) -> dict[str, Any]:
    block: dict[str, Any] = {"region": region}
    if endpoint is not None:
        scheme, sep, host = endpoint.partition("://")
        if not sep:
            scheme, host = "http", endpoint
        if scheme not in ("http", "https") or not host or "/" in host.rstrip("/"):
            raise ConfigError(f"endpoint must be host[:port] or http(s)://host[:port], "
                              f"got {endpoint!r}")
        host = host.rstrip("/")
        # The provider's endpoints are hosts; the scheme is the provider-wide `protocol`.
        block["protocol"] = scheme.upper()
        block["endpoints"] = {product: host for product in ENDPOINT_PRODUCTS}
    return block


def _literal(value: Any) -> Any:
    """Escape Terraform template syntax in a literal string, so a description holding ``${``
    stays text instead of becoming an interpolation."""
    if isinstance(value, str):
        return value.replace("${", "$${").replace("%{", "%%{")
    return value


def dumps(doc: Mapping[str, Any]) -> str:
    """The document as written to ``main.tf.json`` (sorted keys: byte-identical reruns)."""
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


class TerraformProvisioner:
    """Provision an episode's declarations with ``terraform apply`` in
    ``<workdir_root>/<episode_id>/`` and destroy them with ``terraform destroy``.

    ``env`` is laid over ``os.environ`` for the ``terraform`` processes; credentials come from
    there (``ALICLOUD_ACCESS_KEY`` / ``ALICLOUD_SECRET_KEY``, or the project's
    ``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``ALIBABA_CLOUD_ACCESS_KEY_SECRET``, copied over).
    """

    def __init__(self, workdir_root: Path, terraform_bin: str | None = None,
                 region: str = "cn-hangzhou", endpoint: str | None = None,
                 env: Mapping[str, str] | None = None, timeout_s: float = 1800.0):
        self.workdir_root = Path(workdir_root)
        self.terraform_bin = terraform_bin or "terraform"
        self.region = region
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._env = {**os.environ, **(env or {})}
        for tf_name, project_name in (("ALICLOUD_ACCESS_KEY", "ALIBABA_CLOUD_ACCESS_KEY_ID"),
                                      ("ALICLOUD_SECRET_KEY", "ALIBABA_CLOUD_ACCESS_KEY_SECRET")):
            if not self._env.get(tf_name) and self._env.get(project_name):
                self._env[tf_name] = self._env[project_name]
        self._env.setdefault("TF_IN_AUTOMATION", "1")
        # One provider download for all episodes instead of one per episode directory.
        self._env.setdefault("TF_PLUGIN_CACHE_DIR", str(self.workdir_root / ".plugin-cache"))

    def binary(self) -> str | None:
        """The resolved terraform executable, or None when it is not there."""
        return shutil.which(self.terraform_bin, path=self._env.get("PATH", os.defpath))

    def available(self) -> bool:
        """True when the terraform binary is found and ``terraform version`` runs."""
        binary = self.binary()
        if binary is None:
            return False
        try:
            return subprocess.run([binary, "version"], env=self._env, capture_output=True,
                                  timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def workdir(self, episode_id: str) -> Path:
        return self.workdir_root / check_episode_id(episode_id)

    def provision(self, specs: list[ResourceSpec], episode_id: str,
                  values: Mapping[str, str] | None = None) -> ProvisionResult:
        """Write ``main.tf.json``, ``init`` and ``apply`` it, and map the state to
        :class:`Provisioned` records in declaration order. A failure destroys what was made
        and raises :class:`ProvisionError` naming the declaration Terraform blamed."""
        binary = self._require_binary()
        started = time.perf_counter()
        doc, owners = _render(specs, episode_id, values, self.region, self.endpoint)
        workdir = self.workdir(episode_id)
        workdir.mkdir(parents=True, exist_ok=True)
        Path(self._env["TF_PLUGIN_CACHE_DIR"]).mkdir(parents=True, exist_ok=True)
        (workdir / "main.tf.json").write_text(dumps(doc))
        try:
            self._run(binary, workdir, episode_id, owners, "init", "-input=false")
            self._run(binary, workdir, episode_id, owners, "apply", "-auto-approve",
                      "-input=false")
            state = self._state(binary, workdir, episode_id, owners)
            made = _provisioned(specs, state, self.region, episode_id)
        except ProvisionError:
            self.destroy(episode_id)
            raise
        return ProvisionResult(episode_id, made, time.perf_counter() - started)

    def destroy(self, episode_id: str) -> DestroyReport:
        """``terraform destroy`` the episode's state; the report lists the destroyed addresses,
        or the error. Nothing to do when no state was ever written."""
        workdir = self.workdir(episode_id)
        report = DestroyReport()
        if not (workdir / "terraform.tfstate").exists():
            return report
        binary = self._require_binary()
        try:
            addresses = sorted(self._state(binary, workdir, episode_id, {}))
            self._run(binary, workdir, episode_id, {}, "destroy", "-auto-approve",
                      "-input=false")
        except ProvisionError as exc:
            report.errors.append(exc.message)
            return report
        report.deleted.extend(addresses)
        return report

    def _require_binary(self) -> str:
        binary = self.binary()
        if binary is None:
            raise ConfigError(f"terraform binary {self.terraform_bin!r} not found on PATH; "
                              "install Terraform or pass TerraformProvisioner(terraform_bin=...)")
        return binary

    def _run(self, binary: str, workdir: Path, episode_id: str, owners: Mapping[str, str],
             *args: str) -> str:
        step = f"terraform {args[0]}"
        try:
            done = subprocess.run([binary, *args, "-no-color"], cwd=workdir, env=self._env,
                                  capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise ProvisionError(episode_id, step,
                                 f"timed out after {self.timeout_s:g} s") from exc
        except OSError as exc:
            raise ProvisionError(episode_id, step, str(exc)) from exc
        if done.returncode != 0:
            output = (done.stderr or "") + (done.stdout or "")
            blamed = _TF_ADDRESS.search(output)
            spec_id = owners.get(blamed[1], step) if blamed else step
            raise ProvisionError(episode_id, spec_id,
                                 f"{step} exited {done.returncode}: {_tail(output)}")
        return done.stdout

    def _state(self, binary: str, workdir: Path, episode_id: str,
               owners: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """Terraform address -> attribute values, from ``terraform show -json``."""
        out = self._run(binary, workdir, episode_id, owners, "show", "-json")
        try:
            root = json.loads(out or "{}").get("values", {}).get("root_module", {})
        except (json.JSONDecodeError, AttributeError) as exc:
            raise ProvisionError(episode_id, "terraform show",
                                 f"unreadable JSON: {exc}") from exc
        return {r["address"]: r.get("values", {}) for r in root.get("resources", [])
                if r.get("mode", "managed") == "managed"}


def _provisioned(specs: list[ResourceSpec], state: Mapping[str, Mapping[str, Any]],
                 region: str, episode_id: str) -> tuple[Provisioned, ...]:
    """The same cloud ids the ``sdk`` backend reports, so callers cannot tell the backends
    apart: resource ids, user and bucket names, and the sdk's key for a rule."""
    made = []
    for spec in specs:
        address = f"{RESOURCE_TYPES[spec.type]}.{spec.id}"
        values = state.get(address)
        if values is None:
            raise ProvisionError(episode_id, spec.id, f"{address} is not in the state after "
                                 "apply")
        p = spec.properties
        if spec.type == "ram_user":
            made.append(Provisioned(spec.id, spec.type, str(values["name"]), ""))
            continue
        if spec.type == "oss_bucket":
            cloud_id = str(values.get("bucket") or values["id"])
        elif spec.type == "security_group_rule":
            ports = p["port_range"] if p["protocol"] in ("TCP", "UDP") else "-1/-1"
            cloud_id = (f"{values['security_group_id']}:{p['direction']}:{p['protocol']}:"
                        f"{ports}:{p['cidr']}")
        else:
            cloud_id = str(values["id"])
        made.append(Provisioned(spec.id, spec.type, cloud_id, region))
    return tuple(made)


def _tail(text: str, limit: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]
