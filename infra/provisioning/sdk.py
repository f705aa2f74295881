"""The ``sdk`` provisioner: creates Resource META declarations through the official SDK client
(local or real cloud) and destroys everything an episode owns.

- Every taggable resource carries the tag ``consolerl-episode=<episode id>``; RAM users and OSS
  buckets (no tags) carry the episode id in their names (checked by Resource META).
- Creation is idempotent: VPC, vSwitch, security group and instance creates send a ClientToken
  derived from the episode and the declaration, an existing user/bucket/rule of the episode is
  taken as created. Independent declarations are created in parallel; each waits for its ready
  state (Available, Running/Stopped).
- A failed provisioning destroys what it made and raises :class:`ProvisionError` (the episode
  is an env_error, never the agent's failure).
- :meth:`SdkProvisioner.destroy` sweeps by tag and name, not by what provisioning remembers, so
  it also removes what the agent renamed, and works after a crash; :meth:`leftovers` verifies.
"""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import oss2

from consolerl.errors import CloudAPIError, ConfigError, ConsoleRLError
from infra.cloud import CloudClient

from consolerl.resources import ResourceSpec, creation_levels, fill

EPISODE_TAG = "consolerl-episode"
_EPISODE_ID = re.compile(r"[a-z0-9]{6,16}")
_RETRYABLE = {"DependencyViolation", "DependencyViolation.VSwitch",
              "DependencyViolation.SecurityGroup", "IncorrectVpcStatus", "IncorrectVSwitchStatus",
              "IncorrectInstanceStatus", "Throttling", "Throttling.User", "ServiceUnavailable"}


class ProvisionError(ConsoleRLError, RuntimeError):
    """Provisioning of ``spec_id`` failed; what had been created was destroyed."""

    def __init__(self, episode_id: str, spec_id: str, message: str):
        super().__init__(f"episode {episode_id}: provisioning {spec_id} failed: {message}")
        self.episode_id, self.spec_id, self.message = episode_id, spec_id, message

    def __reduce__(self):
        return (type(self), (self.episode_id, self.spec_id, self.message))


@dataclass(frozen=True)
class Provisioned:
    spec_id: str
    type: str
    cloud_id: str             # vpc-..., sg-..., i-..., a user or bucket name, or a rule key
    region: str


@dataclass(frozen=True)
class ProvisionResult:
    episode_id: str
    resources: tuple[Provisioned, ...]
    seconds: float

    def id_of(self, spec_id: str) -> str:
        for r in self.resources:
            if r.spec_id == spec_id:
                return r.cloud_id
        raise KeyError(f"no provisioned resource {spec_id!r}")

    def values(self) -> dict[str, str]:
        """spec id -> cloud id, for filling task texts and rules."""
        return {r.spec_id: r.cloud_id for r in self.resources}


@dataclass
class DestroyReport:
    deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def check_episode_id(episode_id: str) -> str:
    if not isinstance(episode_id, str) or not _EPISODE_ID.fullmatch(episode_id):
        raise ConfigError(f"episode id must be 6-16 of [a-z0-9], got {episode_id!r}")
    return episode_id


class SdkProvisioner:
    """Provision and destroy episode resources through ``client_factory()`` clients (one per
    thread: the SDK clients are not shared across threads)."""

    def __init__(self, client_factory: Callable[[], CloudClient], region: str = "cn-hangzhou",
                 regions: Iterable[str] = (), ready_timeout_s: float = 120.0,
                 poll_s: float = 0.1, parallel: int = 4):
        self._factory = client_factory
        self.region = region
        self.regions = tuple(dict.fromkeys([region, *regions]))   # swept by destroy
        self.ready_timeout_s = ready_timeout_s
        self.poll_s = poll_s
        self.parallel = parallel
        self._local = threading.local()
        # Set per episode (the lease's mark, consolerl.accounts.lease_agent): every thread's
        # client sends it, so the audit log ties each call to the lease it ran under.
        self.user_agent = ""

    @property
    def client(self) -> CloudClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._factory()
        if client.user_agent != self.user_agent:
            client.user_agent = self.user_agent
        return client

    # ---- provisioning ---------------------------------------------------------------------------
    def provision(self, specs: list[ResourceSpec], episode_id: str,
                  values: Mapping[str, str] | None = None) -> ProvisionResult:
        check_episode_id(episode_id)
        started = time.perf_counter()
        values = {**(values or {}), "episode": episode_id}
        made: dict[str, Provisioned] = {}
        try:
            for level in creation_levels(specs):
                with ThreadPoolExecutor(max(1, min(self.parallel, len(level)))) as pool:
                    futures = {spec.id: pool.submit(self._create, spec, made, values, episode_id)
                               for spec in level}
                    failed: tuple[str, BaseException] | None = None
                    for spec_id, future in futures.items():
                        try:
                            made[spec_id] = future.result()
                        except (CloudAPIError, oss2.exceptions.OssError, ConfigError,
                                TimeoutError) as exc:
                            failed = failed or (spec_id, exc)
                    if failed is not None:
                        raise ProvisionError(episode_id, failed[0], _describe(failed[1]))
        except ProvisionError:
            self.destroy(episode_id)
            raise
        return ProvisionResult(episode_id, tuple(made[s.id] for s in specs if s.id in made),
                               time.perf_counter() - started)

    def _create(self, spec: ResourceSpec, made: Mapping[str, Provisioned],
                values: Mapping[str, str], episode_id: str) -> Provisioned:
        p = {k: fill(v, values) for k, v in spec.properties.items()}
        for prop, target in spec.refs().items():
            p[prop] = made[target].cloud_id
        token = f"{episode_id}-{spec.id}"
        tag = {"Tag.1.Key": EPISODE_TAG, "Tag.1.Value": episode_id}
        region = self.region
        c = self.client
        if spec.type == "vpc":
            vid = c.rpc("Vpc", "CreateVpc", _clean({
                "RegionId": region, "CidrBlock": p["cidr_block"], "VpcName": p.get("name"),
                "Description": p.get("description"), "ClientToken": token, **tag}))["VpcId"]
            self._wait(lambda: c.rpc("Vpc", "DescribeVpcs", {"RegionId": region, "VpcId": vid})
                       ["Vpcs"]["Vpc"][0]["Status"] == "Available", f"VPC {vid} Available")
            return Provisioned(spec.id, spec.type, vid, region)
        if spec.type == "vswitch":
            sid = c.rpc("Vpc", "CreateVSwitch", _clean({
                "RegionId": region, "VpcId": p["vpc"], "ZoneId": p["zone"],
                "CidrBlock": p["cidr_block"], "VSwitchName": p.get("name"),
                "Description": p.get("description"), "ClientToken": token, **tag}))["VSwitchId"]
            self._wait(lambda: c.rpc("Vpc", "DescribeVSwitches", {
                "RegionId": region, "VSwitchId": sid})["VSwitches"]["VSwitch"][0]["Status"]
                == "Available", f"vSwitch {sid} Available")
            return Provisioned(spec.id, spec.type, sid, region)
        if spec.type == "security_group":
            gid = c.rpc("Ecs", "CreateSecurityGroup", _clean({
                "RegionId": region, "VpcId": p["vpc"], "SecurityGroupName": p.get("name"),
                "Description": p.get("description"), "SecurityGroupType": p["group_type"],
                "ClientToken": token, **tag}))["SecurityGroupId"]
            return Provisioned(spec.id, spec.type, gid, region)
        if spec.type == "security_group_rule":
            return self._rule(spec, p, region)
        if spec.type == "instance":
            return self._instance(spec, p, region, token, tag)
        if spec.type == "ram_user":
            return self._user(spec, p)
        if spec.type == "oss_bucket":
            bucket = c.oss_bucket(p["name"])
            try:
                bucket.create_bucket(p["acl"], oss2.models.BucketCreateConfig(p["storage_class"]))
            except oss2.exceptions.ServerError as exc:
                # Ours already (a retried provisioning) is fine; someone else's name is not.
                if exc.code != "BucketAlreadyExists" or not _owns(bucket):
                    raise
            return Provisioned(spec.id, spec.type, p["name"], region)
        raise ConfigError(f"no sdk provisioner for resource type {spec.type!r}")

    def _rule(self, spec: ResourceSpec, p: dict[str, Any], region: str) -> Provisioned:
        egress = p["direction"] == "egress"
        ports = p["port_range"] if p["protocol"] in ("TCP", "UDP") else "-1/-1"
        params = _clean({"RegionId": region, "SecurityGroupId": p["security_group"],
                         "IpProtocol": p["protocol"], "PortRange": ports,
                         ("DestCidrIp" if egress else "SourceCidrIp"): p["cidr"],
                         "Policy": p["policy"], "Priority": str(p["priority"]),
                         "Description": p.get("description")})
        try:
            self.client.rpc("Ecs", "AuthorizeSecurityGroupEgress" if egress
                            else "AuthorizeSecurityGroup", params)
        except CloudAPIError as exc:
            if exc.code != "InvalidPermission.Duplicate":
                raise
        key = f"{p['security_group']}:{p['direction']}:{p['protocol']}:{ports}:{p['cidr']}"
        return Provisioned(spec.id, spec.type, key, region)

    def _instance(self, spec: ResourceSpec, p: dict[str, Any], region: str, token: str,
                  tag: dict[str, str]) -> Provisioned:
        c = self.client
        iid = c.rpc("Ecs", "RunInstances", _clean({
            "RegionId": region, "InstanceType": p["instance_type"], "ImageId": p["image"],
            "VSwitchId": p["vswitch"], "SecurityGroupId": p["security_group"],
            "InstanceName": p.get("name"), "Amount": "1", "ClientToken": token, **tag})
        )["InstanceIdSets"]["InstanceIdSet"][0]

        def status() -> str:
            return c.rpc("Ecs", "DescribeInstances", {"RegionId": region, "InstanceIds":
                         f'["{iid}"]'})["Instances"]["Instance"][0]["Status"]
        self._wait(lambda: status() in ("Running", "Stopped"), f"instance {iid} Running")
        if p["status"] == "Stopped" and status() == "Running":
            c.rpc("Ecs", "StopInstance", {"RegionId": region, "InstanceId": iid})
            self._wait(lambda: status() == "Stopped", f"instance {iid} Stopped")
        return Provisioned(spec.id, spec.type, iid, region)

    def _user(self, spec: ResourceSpec, p: dict[str, Any]) -> Provisioned:
        c = self.client
        try:
            c.rpc("Ram", "CreateUser", _clean({"UserName": p["name"],
                                               "DisplayName": p.get("display_name")}))
        except CloudAPIError as exc:
            if exc.code != "EntityAlreadyExists.User":
                raise
        for policy in p.get("policies", ()):
            try:
                c.rpc("Ram", "AttachPolicyToUser", {"PolicyType": "System", "PolicyName": policy,
                                                    "UserName": p["name"]})
            except CloudAPIError as exc:
                if exc.code != "EntityAlreadyExists.User.Policy":
                    raise
        return Provisioned(spec.id, spec.type, p["name"], "")

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not ready within {self.ready_timeout_s:g} s")
            time.sleep(self.poll_s)

    # ---- destruction ----------------------------------------------------------------------------
    def destroy(self, episode_id: str, extra: Iterable[Provisioned] = ()) -> DestroyReport:
        """Delete every resource of the episode (tag or name) in ``regions``, plus ``extra``
        (what the agent made without the tag, found by the caller in the audit log), in
        whatever region the agent made it."""
        check_episode_id(episode_id)
        report = DestroyReport()
        c = self.client
        extra_by_type: dict[str, list[Provisioned]] = {}
        extra = list(extra)
        for item in extra:
            extra_by_type.setdefault(item.type, []).append(item)
        agent_regions = [x.region for x in extra
                         if re.fullmatch(r"[a-z]{2,3}-[a-z0-9-]{2,30}", x.region)]
        regions = dict.fromkeys([*self.regions, *agent_regions])
        for region in regions:
            for iid in self._tagged(region, "instance", episode_id) + _ids(
                    extra_by_type, "instance", region):
                self._delete(report, f"instance {iid}", lambda iid=iid, r=region: c.rpc(
                    "Ecs", "DeleteInstance", {"RegionId": r, "InstanceId": iid, "Force": "true"}),
                    missing="InvalidInstanceId.NotFound")
            for gid in self._tagged(region, "security_group", episode_id) + _ids(
                    extra_by_type, "security_group", region):
                self._delete(report, f"security group {gid}", lambda gid=gid, r=region: c.rpc(
                    "Ecs", "DeleteSecurityGroup", {"RegionId": r, "SecurityGroupId": gid}),
                    missing="InvalidSecurityGroupId.NotFound")
            for sid in self._tagged(region, "vswitch", episode_id) + _ids(
                    extra_by_type, "vswitch", region):
                self._delete(report, f"vSwitch {sid}", lambda sid=sid, r=region: c.rpc(
                    "Vpc", "DeleteVSwitch", {"RegionId": r, "VSwitchId": sid}),
                    missing="InvalidVSwitchId.NotFound")
            for vid in self._tagged(region, "vpc", episode_id) + _ids(extra_by_type, "vpc",
                                                                       region):
                self._delete(report, f"VPC {vid}", lambda vid=vid, r=region: c.rpc(
                    "Vpc", "DeleteVpc", {"RegionId": r, "VpcId": vid}),
                    missing="InvalidVpcId.NotFound")
        for name in self._named_users(episode_id) + [x.cloud_id for x in
                                                      extra_by_type.get("ram_user", [])]:
            self._delete(report, f"RAM user {name}", lambda name=name: self._delete_user(name),
                         missing="EntityNotExist.User")
        for name in self._named_buckets(episode_id) + [x.cloud_id for x in
                                                        extra_by_type.get("oss_bucket", [])]:
            self._delete(report, f"bucket {name}",
                         lambda name=name: c.oss_bucket(name).delete_bucket(), missing="NoSuchBucket")
        return report

    def leftovers(self, episode_id: str) -> list[str]:
        """Everything of the episode still in the cloud (empty after a clean destroy)."""
        check_episode_id(episode_id)
        left = [f"{kind} {rid}" for region in self.regions
                for kind in ("instance", "security_group", "vswitch", "vpc")
                for rid in self._tagged(region, kind, episode_id)]
        left += [f"ram_user {n}" for n in self._named_users(episode_id)]
        left += [f"oss_bucket {n}" for n in self._named_buckets(episode_id)]
        return left

    def inventory(self) -> set[str]:
        """Every resource of the account of the kinds episodes provision, episode's or not
        (``"vpc vpc-..."``, ``"ram_user name"``, ...): what a soak run compares before and
        after to find what nobody destroyed."""
        found = {f"{kind} {rid}" for region in self.regions
                 for kind in ("instance", "security_group", "vswitch", "vpc")
                 for rid in self._tagged(region, kind, None)}
        found |= {f"ram_user {n}" for n in self._named_users("")}
        found |= {f"oss_bucket {n}" for n in self._named_buckets("")}
        return found

    def _delete(self, report: DestroyReport, what: str, call: Callable[[], Any],
                missing: str) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            try:
                call()
                report.deleted.append(what)
                return
            except CloudAPIError as exc:
                if exc.code == missing:
                    return
                if exc.code not in _RETRYABLE or time.monotonic() > deadline:
                    report.errors.append(f"{what}: {exc.code}: {exc.message}")
                    return
            except oss2.exceptions.OssError as exc:
                if exc.code != missing:
                    report.errors.append(f"{what}: {exc.code}: {exc.message}")
                return
            time.sleep(self.poll_s)

    def _delete_user(self, name: str) -> None:
        c = self.client
        for policy in c.rpc("Ram", "ListPoliciesForUser", {"UserName": name})["Policies"][
                "Policy"]:
            c.rpc("Ram", "DetachPolicyFromUser", {"UserName": name, "PolicyType":
                                                  policy["PolicyType"],
                                                  "PolicyName": policy["PolicyName"]})
        c.rpc("Ram", "DeleteUser", {"UserName": name})

    _LISTS = {
        "instance": ("Ecs", "DescribeInstances", "Instances.Instance", "InstanceId", 100),
        "security_group": ("Ecs", "DescribeSecurityGroups", "SecurityGroups.SecurityGroup",
                           "SecurityGroupId", 50),
        "vswitch": ("Vpc", "DescribeVSwitches", "VSwitches.VSwitch", "VSwitchId", 50),
        "vpc": ("Vpc", "DescribeVpcs", "Vpcs.Vpc", "VpcId", 50),
    }

    def _tagged(self, region: str, kind: str, episode_id: str | None) -> list[str]:
        """The ids of ``kind`` tagged for ``episode_id`` (None: all of them, tagged or not)."""
        product, action, path, key, size = self._LISTS[kind]
        found: list[str] = []
        page = 1
        tag = {} if episode_id is None else {"Tag.1.Key": EPISODE_TAG, "Tag.1.Value": episode_id}
        while True:
            body = self.client.rpc(product, action, {
                "RegionId": region, "PageNumber": str(page), "PageSize": str(size), **tag})
            items: Any = body
            for part in path.split("."):
                items = items[part]
            found += [item[key] for item in items]
            if not items or len(found) >= body["TotalCount"]:
                return found
            page += 1

    def _named_users(self, episode_id: str) -> list[str]:
        users, marker = [], None
        while True:
            body = self.client.rpc("Ram", "ListUsers", _clean({"MaxItems": "1000",
                                                               "Marker": marker}))
            users += [u["UserName"] for u in body["Users"]["User"]
                      if episode_id in u["UserName"]]
            if not body.get("IsTruncated"):
                return users
            marker = body["Marker"]

    def _named_buckets(self, episode_id: str) -> list[str]:
        return [b.name for b in oss2.BucketIterator(self.client.oss_service())
                if episode_id in b.name]


def _owns(bucket: oss2.Bucket) -> bool:
    try:
        bucket.get_bucket_info()
        return True
    except oss2.exceptions.OssError:
        return False


def _ids(extra: Mapping[str, list[Provisioned]], kind: str, region: str) -> list[str]:
    return [x.cloud_id for x in extra.get(kind, []) if x.region == region]


def _clean(params: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in params.items() if v not in (None, "")}


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CloudAPIError):
        return f"{exc.code}: {exc.message}"
    if isinstance(exc, oss2.exceptions.OssError):
        return f"{exc.code}: {exc.message}"
    return str(exc)
