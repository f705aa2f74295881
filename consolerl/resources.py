"""Resource META: typed declarations of the cloud resources a task needs before it starts.

A task's ``prerequisites`` is a list of ``{id, type, properties}``. A property whose value is
``${other}`` refers to the resource declared with id ``other`` (a vSwitch's ``vpc``, an
instance's ``security_group``); ``{name}`` placeholders in strings are filled from the episode's
values (``{episode}`` is always there: the short episode id). :func:`parse_resources` checks
types, property names, required properties, references and cycles, and names the file and the
field of anything wrong; :func:`creation_levels` orders them so each level only refers to
earlier ones (a level's resources can be created in parallel).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from consolerl.errors import ConfigError
from consolerl.text import brief


@dataclass(frozen=True)
class PropertySpec:
    required: bool = False
    ref: str = ""                      # the resource type a reference must point at
    choices: tuple[str, ...] = ()
    kind: type = str                   # str, int or list (of str)
    default: Any = None


P = PropertySpec
SCHEMA: dict[str, dict[str, PropertySpec]] = {
    "vpc": {"name": P(), "cidr_block": P(default="192.168.0.0/16"), "description": P()},
    "vswitch": {"vpc": P(True, ref="vpc"), "zone": P(True), "cidr_block": P(True), "name": P(),
                "description": P()},
    "security_group": {"vpc": P(True, ref="vpc"), "name": P(), "description": P(),
                       "group_type": P(choices=("normal", "enterprise"), default="normal")},
    "security_group_rule": {
        "security_group": P(True, ref="security_group"),
        "direction": P(choices=("ingress", "egress"), default="ingress"),
        "protocol": P(choices=("TCP", "UDP", "ICMP", "GRE", "ALL"), default="TCP"),
        "port_range": P(default="22/22"), "cidr": P(default="0.0.0.0/0"),
        "policy": P(choices=("accept", "drop"), default="accept"), "priority": P(kind=int,
                                                                                default=1),
        "description": P()},
    "instance": {"vswitch": P(True, ref="vswitch"),
                 "security_group": P(True, ref="security_group"), "name": P(),
                 "instance_type": P(default="ecs.t6-c1m1.large"),
                 "image": P(default="aliyun_3_x64_20G_alibase_20240819.vhd"),
                 "status": P(choices=("Running", "Stopped"), default="Running")},
    "ram_user": {"name": P(True), "display_name": P(), "policies": P(kind=list, default=())},
    "oss_bucket": {"name": P(True), "acl": P(choices=("private", "public-read",
                                                      "public-read-write"), default="private"),
                   "storage_class": P(choices=("Standard", "IA", "Archive", "ColdArchive"),
                                      default="Standard")},
}
# Resources without cloud tags are found by their name, which must carry the episode id.
NAMED_BY_EPISODE = frozenset({"ram_user", "oss_bucket"})
_ID = re.compile(r"[a-z][a-z0-9_]{0,31}")
_REF = re.compile(r"\$\{([a-z][a-z0-9_]{0,31})\}")
_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]{0,31})\}")


@dataclass(frozen=True)
class ResourceSpec:
    """One declared resource. ``properties`` hold every property of the type (defaults
    filled); references stay ``${id}`` until provisioning resolves them."""

    id: str
    type: str
    properties: Mapping[str, Any]

    def refs(self) -> dict[str, str]:
        """property -> referenced resource id."""
        out = {}
        for name, value in self.properties.items():
            if isinstance(value, str) and (m := _REF.fullmatch(value)):
                out[name] = m[1]
        return out

    def __reduce__(self):   # MappingProxyType does not pickle
        return (_rebuild, (self.id, self.type, dict(self.properties)))


def _rebuild(rid: str, rtype: str, properties: dict[str, Any]) -> ResourceSpec:
    return ResourceSpec(rid, rtype, MappingProxyType(properties))


def parse_resources(data: object, source: str = "<prerequisites>") -> list[ResourceSpec]:
    """Validate a ``prerequisites`` list; errors name ``source`` and the field."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise ConfigError(f"{source}: 'prerequisites' must be a list of resources")
    specs: list[ResourceSpec] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(data):
        where = f"{source}: prerequisites[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected a mapping with id, type, properties")
        unknown = set(item) - {"id", "type", "properties"}
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {brief(sorted(unknown, key=str))}; "
                              "allowed: id, type, properties")
        rid, rtype = item.get("id"), item.get("type")
        if not isinstance(rid, str) or not _ID.fullmatch(rid):
            raise ConfigError(f"{where}.id: must be 1-32 of [a-z0-9_] starting with a letter, "
                              f"got {brief(rid)}")
        if rid in seen:
            raise ConfigError(f"{where}.id: duplicate id {rid!r}")
        if not isinstance(rtype, str) or rtype not in SCHEMA:
            raise ConfigError(f"{where}.type: unknown type {brief(rtype)}; allowed: "
                              f"{', '.join(SCHEMA)}")
        props = item.get("properties") or {}
        if not isinstance(props, dict):
            raise ConfigError(f"{where}.properties: must be a mapping")
        schema = SCHEMA[rtype]
        unknown = set(props) - set(schema)
        if unknown:
            raise ConfigError(f"{where}.properties: unknown "
                              f"{brief(sorted(unknown, key=str))} for {rtype}; "
                              f"allowed: {', '.join(schema)}")
        values: dict[str, Any] = {}
        for name, prop in schema.items():
            value = props.get(name, prop.default)
            field = f"{where}.properties.{name}"
            if value is None:
                if prop.required:
                    raise ConfigError(f"{field}: required for {rtype}")
                continue
            values[name] = _check_value(field, value, prop)
        if rtype in NAMED_BY_EPISODE and "{episode}" not in values["name"]:
            raise ConfigError(f"{where}.properties.name: a {rtype} name must contain "
                              "{episode}, so the episode's cleanup can find it")
        seen[rid] = rtype
        specs.append(_rebuild(rid, rtype, values))
    for spec, i in zip(specs, range(len(specs))):
        for name, target in spec.refs().items():
            field = f"{source}: prerequisites[{i}].properties.{name}"
            if target not in seen:
                raise ConfigError(f"{field}: refers to ${{{target}}}, which is not declared")
            wanted = SCHEMA[spec.type][name].ref
            if wanted and seen[target] != wanted:
                raise ConfigError(f"{field}: must refer to a {wanted}, ${{{target}}} is a "
                                  f"{seen[target]}")
    creation_levels(specs, source)   # raises on cycles
    return specs


def _check_value(field: str, value: Any, prop: PropertySpec) -> Any:
    if prop.kind is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{field}: must be a list of strings")
        return tuple(value)
    if prop.kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{field}: must be an integer, got {brief(value)}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{field}: must be a string, got {type(value).__name__}")
    if prop.ref and not _REF.fullmatch(value):
        raise ConfigError(f"{field}: must be a reference like ${{name}} to a {prop.ref}")
    if prop.choices and value not in prop.choices:
        raise ConfigError(f"{field}: {brief(value)} is not one of {', '.join(prop.choices)}")
    if len(value) > 256:
        raise ConfigError(f"{field}: at most 256 characters")
    return value


def creation_levels(specs: list[ResourceSpec], source: str = "<prerequisites>"
                    ) -> list[list[ResourceSpec]]:
    """Resources grouped so that each group only refers to earlier groups."""
    remaining = {s.id: s for s in specs}
    done: set[str] = set()
    levels: list[list[ResourceSpec]] = []
    while remaining:
        ready = [s for s in remaining.values() if set(s.refs().values()) <= done]
        if not ready:
            raise ConfigError(f"{source}: prerequisites refer to each other in a cycle: "
                              f"{', '.join(sorted(remaining))}")
        levels.append(ready)
        for s in ready:
            done.add(s.id)
            del remaining[s.id]
    return levels


def placeholders(value: str) -> set[str]:
    """The ``{name}`` placeholders :func:`fill` would replace in ``value`` (not ``${ref}``)."""
    return {m[1] for m in _PLACEHOLDER.finditer(value)
            if not (m.start() > 0 and value[m.start() - 1] == "$")}


def fill(value: Any, values: Mapping[str, str]) -> Any:
    """Replace ``{name}`` placeholders (not ``${ref}``) in a string from ``values``."""
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.start() > 0 and m.string[m.start() - 1] == "$":
            return m[0]
        if m[1] not in values:
            raise ConfigError(f"placeholder {{{m[1]}}} has no value; known: "
                              f"{', '.join(sorted(values))}")
        return values[m[1]]
    return _PLACEHOLDER.sub(sub, value)
