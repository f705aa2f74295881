"""Is a drafted task valid? :func:`validate_draft` checks, against a real cloud (the local one
in tests) in one account:

1. **It parses**: :func:`consolerl.tasks.parse_task` accepts it.
2. **Its prerequisites provision and destroy cleanly**, through the SDK provisioner an episode
   uses (:class:`infra.provisioning.sdk.SdkProvisioner`).
3. **Its rule is satisfiable**: an *API twin* does the documented operation through the
   official SDKs, then the reward service's rule evaluator (:func:`reward_service.rules.evaluate`)
   scores the rule against the account's real audit log (ActionTrail) and the end state. The
   twin makes, for each required event rule in order, that rule's ``event`` as an API call of its
   ``service``, with the request parameters the rule's ``where`` names (placeholders filled
   with the episode's values and the provisioned ids; ``in``: each choice in turn until the
   cloud accepts one; ``ref``: the value an earlier twin call sent or got back), plus the region
   and, for what it creates, the episode's tag. A rule the twin cannot satisfy (it cannot
   choose a value, the cloud refuses the call, or the call is made and the rule still fails) is
   a **drafting error**, never a defect of the documentation.
4. Everything the twin and the provisioning made is destroyed (by the episode's tag and names,
   and what the audit log shows the twin created), and nothing of the episode is left.

The twin's events are API calls, not console operations: they are scored here with the rule
evaluator directly, never by the reward service's console-only episode scoring.
"""
from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import oss2

from consolerl.accounts import Account
from consolerl.audit import AuditEvent
from consolerl.errors import ConsoleRLError, CloudAPIError, ConfigError
from consolerl.resources import fill
from consolerl.tasks import EventRule, Task, parse_task
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.provisioning.sdk import EPISODE_TAG, ProvisionError, SdkProvisioner
from reward_service.actiontrail import TrailClient, TrailConfig, episode_events
from reward_service.rules import assign, dotted, evaluate

from rollout_service.episode import agent_created, exists

# What the twin tags so destroy finds it (the actions accept Tag.N like the provisioner's).
_TAGGED_CREATES = frozenset({"CreateVpc", "CreateVSwitch", "CreateSecurityGroup",
                             "RunInstances"})
_MAX_CHOICES = 8


@dataclass(frozen=True)
class Validation:
    """The checks of one drafted task. ``problems``: each failure in words (a drafted rule
    that cannot be satisfied reads ``drafting error: ...``); ``calls``: the twin's API calls as
    ``Service:Action`` with their parameters; ``episode_id``: the episode it ran as."""

    parsed: bool
    provisioned: bool
    destroyed: bool
    twin_satisfied: bool
    problems: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()
    episode_id: str = ""

    @property
    def valid(self) -> bool:
        return (self.parsed and self.provisioned and self.destroyed and self.twin_satisfied
                and not self.problems)


class _TwinError(ConsoleRLError, RuntimeError):
    """The twin cannot do the operation: ``str`` says why (a drafting error)."""


def _oss_call(client: CloudClient, action: str, params: Mapping[str, str]) -> dict[str, Any]:
    bucket = client.oss_bucket(params.get("BucketName", ""))
    if action == "PutBucket":
        bucket.create_bucket(params.get("Acl", "private"),
                             oss2.models.BucketCreateConfig(params.get("StorageClass",
                                                                       "Standard")))
    elif action == "PutBucketAcl":
        bucket.put_bucket_acl(params.get("Acl", ""))
    elif action == "DeleteBucket":
        bucket.delete_bucket()
    else:
        raise _TwinError(f"the twin has no OSS call for {action}")
    return {}


class _Twin:
    """The documented operation done through the SDK, one required event rule at a time."""

    def __init__(self, client: CloudClient, region: str, episode_id: str,
                 values: Mapping[str, str]):
        self.client, self.region, self.episode_id = client, region, episode_id
        self.values = values
        self.sent: dict[str, dict[str, str]] = {}
        self.got: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def _ref(self, operand: str) -> str:
        rule_id, path = operand.split(".", 1)
        part, _, rest = path.partition(".")
        source = {"requestParameters": self.sent, "responseElements": self.got}.get(part)
        if source is None or rule_id not in source:
            raise _TwinError(f"the reference {operand!r} names nothing the twin sent or got")
        value = dotted(source[rule_id], rest)
        if value in (None, ""):
            raise _TwinError(f"the reference {operand!r} is empty in the twin's call")
        return str(value)

    def params(self, rule: EventRule) -> tuple[dict[str, str], list[tuple[str, list[str]]]]:
        fixed: dict[str, str] = {}
        choices: list[tuple[str, list[str]]] = []
        for path, pred in rule.where:
            if path == "acsRegion" and pred.op == "eq":
                fixed["RegionId"] = fill(pred.value, self.values)
                continue
            if not path.startswith("requestParameters."):
                continue            # response fields and errorCode follow from the call
            name = path[len("requestParameters."):]
            if pred.op == "eq":
                fixed[name] = fill(pred.value, self.values)
            elif pred.op == "in":
                choices.append((name, [fill(v, self.values) for v in pred.value]))
            elif pred.op == "ref":
                fixed[name] = self._ref(str(pred.value))
            elif pred.op == "exists" and pred.value == "false":
                continue
            else:
                raise _TwinError(f"{rule.event}: the twin cannot choose a value for {name} "
                                 f"from a {pred.op!r} predicate")
        return fixed, choices

    def do(self, rule: EventRule, index: int) -> None:
        service = rule.service or ""
        if not service:
            raise _TwinError(f"{rule.event}: the rule names no service")
        fixed, choices = self.params(rule)
        if service in ("Ecs", "Vpc"):
            fixed.setdefault("RegionId", self.region)
        if rule.event in _TAGGED_CREATES:
            fixed.update({"Tag.1.Key": EPISODE_TAG, "Tag.1.Value": self.episode_id})
        names = [n for n, _ in choices]
        combos = list(itertools.islice(itertools.product(*(c for _, c in choices)),
                                       _MAX_CHOICES))
        errors = []
        for combo in combos:
            params = {**fixed, **dict(zip(names, combo))}
            shown = ", ".join(f"{k}={v}" for k, v in params.items() if not k.startswith("Tag."))
            self.calls.append(f"{service}:{rule.event}({shown})")
            try:
                got = _oss_call(self.client, rule.event, params) if service == "Oss" else \
                    self.client.rpc(service, rule.event, params)
            except CloudAPIError as exc:
                errors.append(f"{exc.code}: {exc.message}")
                continue
            except oss2.exceptions.OssError as exc:
                errors.append(f"{exc.code}: {exc.message}")
                continue
            key = rule.id or f"#{index}"
            self.sent[key], self.got[key] = params, got
            return
        raise _TwinError(f"the cloud refused the twin's {service}:{rule.event}: "
                         f"{'; '.join(errors[-3:])}")


def _client_factory(account: Account, endpoint: str | None, region: str
                    ) -> Callable[[], CloudClient]:
    def make() -> CloudClient:
        return CloudClient(CloudConfig(endpoint=endpoint, region_id=region),
                           Credentials(account.access_key_id, account.access_key_secret))
    return make


def validate_draft(task: dict, *, account: Account, endpoint: str | None = None,
                   client_factory: Callable[[], CloudClient] | None = None,
                   region: str = "cn-hangzhou", trail_config: TrailConfig | None = None,
                   settle_s: float = 20.0, ready_timeout_s: float = 60.0,
                   user_agent: str = "", episode_id: str = "") -> Validation:
    """Validate a drafted ``task`` in ``account`` (see the module docstring): the cloud at
    ``endpoint`` (``host:port`` of the local cloud; ``None``: the real cloud), or clients from
    ``client_factory`` (one per thread). ``settle_s``: how long to wait for the twin's audit
    events and the end state. ``user_agent``: the lease's mark on every call (the env worker's
    lease, as an episode sends it). Blocking (SDK calls and polling the audit log); it makes
    and deletes cloud resources, so run it in a leased account."""
    factory = client_factory or _client_factory(account, endpoint, region)
    name = str(task.get("id", ""))[:64] if isinstance(task, dict) else ""
    try:
        parsed: Task = parse_task(task, f"draft {name}".strip())
    except ConfigError as exc:
        return Validation(False, False, True, False,
                          (f"drafting error: the task does not parse: {exc}",))
    episode = episode_id or secrets.token_hex(4)
    provisioner = SdkProvisioner(factory, region=region, ready_timeout_s=ready_timeout_s,
                                 poll_s=0.05)
    provisioner.user_agent = user_agent
    problems: list[str] = []
    try:
        ready = provisioner.provision(list(parsed.prerequisites), episode)
    except (ProvisionError, CloudAPIError, oss2.exceptions.OssError) as exc:
        left = provisioner.leftovers(episode)
        return Validation(True, False, not left, False, (
            f"drafting error: the prerequisites do not provision: {exc}",
            *([f"left after the failed provisioning: {', '.join(left)}"] if left else [])),
            episode_id=episode)
    values = parsed.values(episode, ready.values())
    client = provisioner.client
    # The audit window starts on a fresh second: event times have one-second resolution, and
    # the provisioning's own events must not fall into it.
    time.sleep(1.0 - time.time() % 1.0 + 0.01)
    started = time.time()
    twin = _Twin(client, region, episode, values)
    satisfied = False
    events: list[AuditEvent] = []
    trail = TrailClient(factory, trail_config or TrailConfig(
        qps=20, settle_s=settle_s, poll_s=0.25, clock_skew_s=5), account_id=account.account_id)
    try:
        for i, rule in enumerate(parsed.success.required_events):
            twin.do(rule, i)
        rule = parsed.success

        def mine(window: list[AuditEvent]) -> list[AuditEvent]:
            offset = trail.clock_offset_s or 0.0
            return episode_events(window, account.account_id, started + offset)
        result = trail.wait_for(started, lambda w: assign(rule.required_events, mine(w),
                                                          values)[0] is not None,
                                deadline_s=settle_s)
        events = mine(result.events)
        verdict = evaluate(rule, events, client, values, settle_s=settle_s)
        satisfied = verdict.passed
        if not satisfied:
            problems.append(f"drafting error: the API twin did the operation "
                            f"({'; '.join(twin.calls[-3:]) or 'no call'}) and the rule still "
                            f"fails: {'; '.join(verdict.reasons)}")
    except _TwinError as exc:
        problems.append(f"drafting error: {exc}")
    except (CloudAPIError, oss2.exceptions.OssError) as exc:
        problems.append(f"the cloud failed while checking the rule: {exc}")
    finally:
        destroyed, why = _destroy(provisioner, client, episode, events, twin)
        problems += why
    return Validation(True, True, destroyed, satisfied, tuple(problems), tuple(twin.calls),
                      episode)


def _destroy(provisioner: SdkProvisioner, client: CloudClient, episode: str,
             events: list[AuditEvent], twin: _Twin) -> tuple[bool, list[str]]:
    """Destroy the episode and what the twin made (from the audit log: a create the twin
    could not tag); returns whether nothing is left, and what went wrong."""
    extra = agent_created(events)
    try:
        report = provisioner.destroy(episode, extra)
        left = provisioner.leftovers(episode) + [f"{x.type} {x.cloud_id}" for x in extra
                                                 if exists(client, x)]
    except (CloudAPIError, oss2.exceptions.OssError) as exc:
        return False, [f"clean-up failed: {exc}"]
    why = [f"clean-up: {e}" for e in report.errors]
    if left:
        why.append(f"left after clean-up: {', '.join(left)}")
    return not report.errors and not left, why
