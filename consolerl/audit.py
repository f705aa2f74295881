"""One ActionTrail audit event, typed: what the reward's rules, the evidence channel, the
episode's clean-up, the jobs API's reports and the documentation crawl read of the audit log.

An event is built once, by :meth:`AuditEvent.from_trail`, from the JSON that LookupEvents
returns (the real ActionTrail's or the local cloud's, ``infra/console_sim``); readers use its
fields. :meth:`AuditEvent.to_json` gives that JSON back unchanged, and :meth:`AuditEvent.at`
reads any field of it by a dotted path (``requestParameters.UserName``,
``responseElements.InstanceIdSets.InstanceIdSet.0``): the vocabulary of a task's success rule,
which names ActionTrail's own fields.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from consolerl.text import ascii_digits

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"      # eventTime: UTC, one-second resolution
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def dotted(value: Any, path: str) -> Any:
    """``requestParameters.UserName`` / ``Instances.Instance.0.Status`` into nested data
    (mappings and lists); ``None`` where the path leads nowhere."""
    for part in path.split("."):
        if isinstance(value, list) and ascii_digits(part):
            index = int(part)
            value = value[index] if index < len(value) else None
        elif isinstance(value, Mapping):
            value = value.get(part)
        else:
            return None
    return value


def _text(value: Any) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True)
class AuditEvent:
    """One audit event. ``parameters``: the request parameters (``requestParameters``);
    ``response``: the response elements (write calls only; ``None`` otherwise); ``error_code``
    is empty for a call that succeeded; ``resource_names``: ``resourceName`` split at ``;``;
    ``account_id``/``access_key_id``: of ``userIdentity``; ``raw``: the event as ActionTrail
    gave it (read-only). Missing or null fields read as empty. Picklable (as its JSON)."""

    event_id: str
    event_name: str
    service_name: str = ""
    event_time: str = ""
    event_type: str = ""                # ConsoleOperation | ApiCall | ...
    event_rw: str = ""                  # Read | Write
    region: str = ""                    # acsRegion
    parameters: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, hash=False)
    response: Mapping[str, Any] | None = field(default=None, hash=False)
    error_code: str = ""
    error_message: str = ""
    resource_type: str = ""
    resource_names: tuple[str, ...] = ()
    account_id: str = ""
    access_key_id: str = ""
    user_agent: str = ""
    raw: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, hash=False, repr=False)

    @classmethod
    def from_trail(cls, event: Mapping[str, Any]) -> AuditEvent:
        """The event of one ActionTrail JSON object (an item of LookupEvents' ``Events``)."""
        raw = copy.deepcopy(dict(event))
        identity = raw.get("userIdentity")
        identity = identity if isinstance(identity, Mapping) else {}
        params = raw.get("requestParameters")
        response = raw.get("responseElements")
        return cls(
            event_id=_text(raw.get("eventId")),
            event_name=_text(raw.get("eventName")),
            service_name=_text(raw.get("serviceName")),
            event_time=_text(raw.get("eventTime")),
            event_type=_text(raw.get("eventType")),
            event_rw=_text(raw.get("eventRW")),
            region=_text(raw.get("acsRegion")),
            parameters=MappingProxyType(params) if isinstance(params, dict) else _EMPTY,
            response=MappingProxyType(response) if isinstance(response, dict) else None,
            error_code=_text(raw.get("errorCode")),
            error_message=_text(raw.get("errorMessage")),
            resource_type=_text(raw.get("resourceType")),
            resource_names=tuple(n for n in _text(raw.get("resourceName")).split(";") if n),
            account_id=_text(identity.get("accountId")),
            access_key_id=_text(identity.get("accessKeyId")),
            user_agent=_text(raw.get("userAgent")),
            raw=MappingProxyType(raw))

    def to_json(self) -> dict[str, Any]:
        """The event's JSON, as ActionTrail gave it (a copy)."""
        return copy.deepcopy(dict(self.raw))

    def __reduce__(self) -> tuple[Any, ...]:
        return (AuditEvent.from_trail, (self.to_json(),))

    def at(self, path: str) -> Any:
        """A field of the event's JSON by dotted path (:func:`dotted`); ``None`` when absent."""
        return dotted(self.raw, path)

    def brief(self) -> AuditEvent:
        """The event's identity and outcome only (id, name, time, error code): what reports
        keep of it."""
        return AuditEvent.from_trail({"eventId": self.event_id, "eventName": self.event_name,
                                      "eventTime": self.event_time,
                                      "errorCode": self.error_code})

    @property
    def refused(self) -> bool:
        """The call failed (the event carries an error code)."""
        return bool(self.error_code)

    @property
    def by_console(self) -> bool:
        """Made from the web console (what an agent in the browser can do), not by an SDK."""
        return ".console.aliyun.com" in self.user_agent or self.event_type == "ConsoleOperation"

    @property
    def epoch(self) -> float:
        """``event_time`` in epoch seconds; ``-inf`` when it does not parse (sorts first)."""
        try:
            return datetime.strptime(self.event_time, TIME_FORMAT) \
                .replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            return float("-inf")


__all__ = ["AuditEvent", "TIME_FORMAT", "dotted"]
