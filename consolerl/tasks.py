"""Tasks as data: the versioned YAML schema of ``tasks/**/*.yaml``, validated on load with
errors that name the file and the field.

A task (schema 1)::

    schema: 1
    id: ram-create-user-basic          # equals the file name without .yaml
    product: ram                       # ecs | vpc | ram | oss
    title: Create a RAM user
    procedure: |                       # the documentation's numbered steps, in prose
      1. Sign in to the RAM console ...
    start_page: /console/ram/users
    split: train                       # train | heldout
    difficulty: 1                      # 1 (one step) .. 5 (multi-page)
    drift: ""                          # optional UI drift profile (infra/console_sim drift kinds)
    parameters: {user_name: "deploy-{episode}"}   # {episode} is a per-episode unique suffix
    prerequisites: [...]               # Resource META (consolerl/resources.py)
    expected: success                  # or infeasible: the documented procedure is wrong
    infeasible_reason: ""              # why, when expected is infeasible
    success:                           # the reward service's rule
      required_events:                 # audit events that must exist (errorCode empty)
        - {event: CreateUser, service: Ram, where: {requestParameters.UserName: "{user_name}"}}
      forbidden_events: [{event: DeleteUser}]
      end_state:                       # Describe calls after the episode
        - {service: Ram, action: GetUser, params: {UserName: "{user_name}"},
           expect: {User.UserName: "{user_name}"}}
    cleanup: destroy                   # destroy | keep
    oracle: {family: ram_create_user, args: {...}}   # how the scripted oracle solves it

Strings may use ``{name}`` placeholders: task parameters, ``episode``, and the cloud ids of the
prerequisites by their declaration id.

Event rules (``required_events`` / ``forbidden_events`` items) are
``{id?, event, service?, after?, where?}``:

- ``where`` maps a dotted event field (``requestParameters.X``, ``responseElements.Y``,
  ``errorCode``, ``acsRegion``, ...) to a predicate: a scalar (equals, after placeholders), or one
  of ``{in: [a, b]}``, ``{prefix: s}``, ``{contains: s}``, ``{regex: re}`` (full match, RE2),
  ``{exists: true|false}``, ``{ref: "<rule id>.<dotted field>"}`` (equals that field of the event
  matched by an earlier required rule: a resource reference, e.g. the rule added to the
  security group the agent created).
- An event only matches when its ``errorCode`` is empty, unless ``where`` has an ``errorCode``
  predicate.
- ``id`` names a required rule for ``ref`` and ``after``; ``after: [ids]`` (required rules only)
  says the matched event must come after the events matched by those earlier rules.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consolerl.config import read_yaml
from consolerl.errors import ConfigError
from consolerl.paths import is_console_path
from consolerl.patterns import PatternError, compile_pattern
from consolerl.drift import parse as parse_drift

from consolerl.resources import parse_resources, placeholders as text_placeholders
from consolerl.text import brief

SCHEMA_VERSION = 1
PRODUCTS = ("ecs", "vpc", "ram", "oss")
SPLITS = ("train", "heldout")
SERVICES = ("Ecs", "Vpc", "Ram", "Oss")
_KEYS = {"schema", "id", "product", "title", "procedure", "start_page", "split", "difficulty",
         "drift", "parameters", "prerequisites", "expected", "infeasible_reason", "success",
         "cleanup", "oracle"}
_ID = re.compile(r"[a-z0-9][a-z0-9-]{2,63}")


PREDICATE_OPS = ("eq", "in", "prefix", "contains", "regex", "exists", "ref")
FILLED_OPS = ("eq", "in", "prefix", "contains")   # whose operands take {name} placeholders


@dataclass(frozen=True)
class Predicate:
    """One ``where`` entry's test: ``op`` (one of :data:`PREDICATE_OPS`) and its operand (a
    string; a tuple of strings for ``in``; ``true``/``false`` for ``exists``; ``<rule id>.<path>``
    for ``ref``)."""

    op: str
    value: str | tuple[str, ...]


@dataclass(frozen=True)
class EventRule:
    event: str
    service: str = ""
    where: tuple[tuple[str, Predicate], ...] = ()   # dotted event field -> predicate
    id: str = ""
    after: tuple[str, ...] = ()                      # ids of earlier required rules

    def literals(self) -> list[str]:
        """The plain values the rule names (equality operands, before placeholders)."""
        return [p.value for _, p in self.where if p.op == "eq" and isinstance(p.value, str)]


@dataclass(frozen=True)
class StateCheck:
    service: str
    action: str
    params: tuple[tuple[str, str], ...] = ()
    expect: tuple[tuple[str, str], ...] = ()     # dotted response path -> expected value
    expect_error: str = ""                       # the call must fail with this code


@dataclass(frozen=True)
class SuccessRule:
    required_events: tuple[EventRule, ...] = ()
    forbidden_events: tuple[EventRule, ...] = ()
    end_state: tuple[StateCheck, ...] = ()

    def placeholders(self) -> frozenset[str]:
        """The ``{name}`` placeholders the rule fills from an episode's values when it is
        evaluated (predicates of :data:`FILLED_OPS`, end-state params and expectations): an
        episode's values must name every one."""
        texts = [v for rule in (*self.required_events, *self.forbidden_events)
                 for _, p in rule.where if p.op in FILLED_OPS
                 for v in ((p.value,) if isinstance(p.value, str) else p.value)]
        texts += [v for check in self.end_state for _, v in (*check.params, *check.expect)]
        return frozenset(name for text in texts for name in text_placeholders(text))


@dataclass(frozen=True)
class Task:
    id: str
    product: str
    title: str
    procedure: str
    start_page: str
    split: str
    difficulty: int
    success: SuccessRule
    drift: str = ""
    parameters: tuple[tuple[str, str], ...] = ()
    prerequisites: tuple[Any, ...] = ()          # ResourceSpec (consolerl.resources)
    expected: str = "success"
    infeasible_reason: str = ""
    cleanup: str = "destroy"
    oracle_family: str = ""
    oracle_args: tuple[tuple[str, str], ...] = ()
    source: str = field(default="", compare=False)

    def values(self, episode: str, provisioned: dict[str, str] | None = None) -> dict[str, str]:
        """Placeholder values of one episode: parameters (themselves filled), the episode
        id and the prerequisites' cloud ids."""
        base = {"episode": episode, **(provisioned or {})}
        params = {k: v.replace("{episode}", episode) for k, v in self.parameters}
        return {**base, **params}


def _str(where: str, data: dict, key: str, *, required: bool = True, default: str = "",
         max_len: int = 10_000) -> str:
    value = data.get(key, None)
    if value is None:
        if required:
            raise ConfigError(f"{where}: field '{key}' is required")
        return default
    if not isinstance(value, str):
        raise ConfigError(f"{where}: field '{key}' must be a string, got {type(value).__name__}")
    if len(value) > max_len:
        raise ConfigError(f"{where}: field '{key}' is longer than {max_len} characters")
    return value


def _pairs(where: str, value: object, key: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: field '{key}' must be a mapping")
    out = []
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, (dict, list)) or v is None:
            raise ConfigError(f"{where}: field '{key}.{k}' must map a name to a scalar")
        out.append((k, str(v).lower() if isinstance(v, bool) else str(v)))
    return tuple(out)


def _predicate(at: str, path: str, value: object) -> Predicate:
    if isinstance(value, bool):
        return Predicate("eq", str(value).lower())
    if isinstance(value, (str, int, float)):
        return Predicate("eq", str(value))
    if not isinstance(value, dict) or len(value) != 1:
        raise ConfigError(f"{at}: where.{path} must be a scalar or a mapping with one of "
                          f"{', '.join(PREDICATE_OPS[1:])}")
    (op, operand), = value.items()
    if op == "in":
        if not isinstance(operand, list) or not operand or \
                not all(isinstance(v, (str, int, float)) for v in operand):
            raise ConfigError(f"{at}: where.{path}.in must be a non-empty list of scalars")
        return Predicate("in", tuple(str(v) for v in operand))
    if op == "exists":
        if not isinstance(operand, bool):
            raise ConfigError(f"{at}: where.{path}.exists must be true or false")
        return Predicate("exists", str(operand).lower())
    if op in ("prefix", "contains", "regex", "ref"):
        if not isinstance(operand, str) or not operand:
            raise ConfigError(f"{at}: where.{path}.{op} must be a non-empty string")
        if op == "regex":
            try:             # a task's pattern may be a user's (inline tasks): RE2's rule
                compile_pattern(operand, f"where.{path}.regex")
            except PatternError as exc:
                raise ConfigError(f"{at}: {exc}") from None
        if op == "ref" and not re.fullmatch(r"[a-z][a-z0-9_]*\.[A-Za-z0-9_.]+", operand):
            raise ConfigError(f"{at}: where.{path}.ref must be '<rule id>.<dotted field>', "
                              f"got {operand!r}")
        return Predicate(op, operand)
    raise ConfigError(f"{at}: where.{path}: unknown predicate {brief(op)}; use a scalar or one of "
                      f"{', '.join(PREDICATE_OPS[1:])}")


def _events(where: str, value: object, key: str,
            known: tuple[str, ...] = ()) -> tuple[EventRule, ...]:
    """``known``: ids of the required rules (for the forbidden rules' references)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{where}: field 'success.{key}' must be a list")
    rules: list[EventRule] = []
    ids = list(known)
    for i, item in enumerate(value):
        at = f"{where}: success.{key}[{i}]"
        if not isinstance(item, dict) or set(item) - {"id", "event", "service", "where",
                                                      "after"}:
            raise ConfigError(f"{at}: expected a mapping with event, service, where, id, after")
        event = _str(at, item, "event", max_len=64)
        service = _str(at, item, "service", required=False, max_len=16)
        if service and service not in SERVICES:
            raise ConfigError(f"{at}: field 'service' must be one of {', '.join(SERVICES)}")
        rule_id = _str(at, item, "id", required=False, max_len=32)
        if rule_id and not re.fullmatch(r"[a-z][a-z0-9_]*", rule_id):
            raise ConfigError(f"{at}: field 'id' must be [a-z][a-z0-9_]*, got {rule_id!r}")
        if rule_id and key != "required_events":
            raise ConfigError(f"{at}: field 'id' is only for required_events")
        if rule_id in ids and rule_id:
            raise ConfigError(f"{at}: id {rule_id!r} is used twice")
        after = item.get("after") or []
        if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
            raise ConfigError(f"{at}: field 'after' must be a list of rule ids")
        if after and key != "required_events":
            raise ConfigError(f"{at}: field 'after' is only for required_events")
        where_map = item.get("where")
        if where_map is not None and not isinstance(where_map, dict):
            raise ConfigError(f"{at}: field 'where' must be a mapping")
        preds = tuple((str(path), _predicate(at, str(path), v))
                      for path, v in (where_map or {}).items())
        refs = [p.value.split(".", 1)[0] for _, p in preds if p.op == "ref"]
        for name in [*after, *refs]:
            if name not in ids:
                raise ConfigError(f"{at}: {name!r} must name an earlier required event's id "
                                  f"(known: {', '.join(ids) or 'none'})")
        rules.append(EventRule(event, service, preds, rule_id, tuple(after)))
        if rule_id:
            ids.append(rule_id)
    return tuple(rules)


def _checks(where: str, value: object) -> tuple[StateCheck, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{where}: field 'success.end_state' must be a list")
    checks = []
    for i, item in enumerate(value):
        at = f"{where}: success.end_state[{i}]"
        if not isinstance(item, dict) or set(item) - {"service", "action", "params", "expect",
                                                      "expect_error"}:
            raise ConfigError(f"{at}: expected a mapping with service, action, params, expect "
                              "or expect_error")
        service = _str(at, item, "service", max_len=16)
        if service not in SERVICES:
            raise ConfigError(f"{at}: field 'service' must be one of {', '.join(SERVICES)}")
        action = _str(at, item, "action", max_len=64)
        if not re.fullmatch(r"(Describe|Get|List)[A-Za-z]+", action):
            raise ConfigError(f"{at}: field 'action' must be a read action (Describe*, Get*, "
                              f"List*), got {action!r}")
        check = StateCheck(service, action, _pairs(at, item.get("params"), "params"),
                           _pairs(at, item.get("expect"), "expect"),
                           _str(at, item, "expect_error", required=False, max_len=64))
        if not check.expect and not check.expect_error:
            raise ConfigError(f"{at}: give 'expect' or 'expect_error'")
        checks.append(check)
    return tuple(checks)


def parse_task(data: object, source: str) -> Task:
    """Validate one task document; ``source`` (the file) prefixes every error."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a task file holds one mapping")
    unknown = set(data) - _KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {brief(sorted(unknown, key=str))}; "
                          f"allowed: {', '.join(sorted(_KEYS))}")
    if data.get("schema") != SCHEMA_VERSION:
        raise ConfigError(f"{source}: field 'schema' must be {SCHEMA_VERSION}, got "
                          f"{brief(data.get('schema'))}")
    task_id = _str(source, data, "id", max_len=64)
    if not _ID.fullmatch(task_id):
        raise ConfigError(f"{source}: field 'id' must be 3-64 of [a-z0-9-], got {task_id!r}")
    product = _str(source, data, "product")
    if product not in PRODUCTS:
        raise ConfigError(f"{source}: field 'product' must be one of {', '.join(PRODUCTS)}")
    split = _str(source, data, "split")
    if split not in SPLITS:
        raise ConfigError(f"{source}: field 'split' must be one of {', '.join(SPLITS)}")
    difficulty = data.get("difficulty")
    if isinstance(difficulty, bool) or not isinstance(difficulty, int) or not 1 <= difficulty <= 5:
        raise ConfigError(f"{source}: field 'difficulty' must be an integer 1-5")
    start = _str(source, data, "start_page", max_len=256)
    if not re.fullmatch(r"/console/[A-Za-z0-9/_.?=&{}-]*", start):
        raise ConfigError(f"{source}: field 'start_page' must be a console path like "
                          f"/console/ecs/instances, got {start!r}")
    if not is_console_path(start.split("?", 1)[0]):
        # The env worker's rule (dot segments resolved as a server reads them).
        raise ConfigError(f"{source}: field 'start_page' {start!r} leaves /console/ once its "
                          "dot segments are resolved; the env worker would refuse it")
    drift = _str(source, data, "drift", required=False, max_len=128)
    try:
        parse_drift(drift)
    except ConfigError as exc:
        raise ConfigError(f"{source}: field 'drift': {exc}") from None
    expected = _str(source, data, "expected", required=False, default="success")
    if expected not in ("success", "infeasible"):
        raise ConfigError(f"{source}: field 'expected' must be success or infeasible")
    reason = _str(source, data, "infeasible_reason", required=False, max_len=1000)
    if (expected == "infeasible") != bool(reason):
        raise ConfigError(f"{source}: field 'infeasible_reason' is required exactly when "
                          "expected is infeasible")
    success = data.get("success") or {}
    if not isinstance(success, dict) or set(success) - {"required_events", "forbidden_events",
                                                        "end_state"}:
        raise ConfigError(f"{source}: field 'success' must be a mapping with required_events, "
                          "forbidden_events, end_state")
    required = _events(source, success.get("required_events"), "required_events")
    rule = SuccessRule(required,
                       _events(source, success.get("forbidden_events"), "forbidden_events",
                               tuple(r.id for r in required if r.id)),
                       _checks(source, success.get("end_state")))
    if expected == "success" and not rule.required_events and not rule.end_state:
        raise ConfigError(f"{source}: field 'success' needs required_events or end_state")
    cleanup = _str(source, data, "cleanup", required=False, default="destroy")
    if cleanup not in ("destroy", "keep"):
        raise ConfigError(f"{source}: field 'cleanup' must be destroy or keep")
    oracle = data.get("oracle") or {}
    if not isinstance(oracle, dict) or set(oracle) - {"family", "args"}:
        raise ConfigError(f"{source}: field 'oracle' must be a mapping with family, args")
    task = Task(
        id=task_id, product=product, title=_str(source, data, "title", max_len=200),
        procedure=_str(source, data, "procedure"), start_page=start, split=split,
        difficulty=difficulty, success=rule, drift=drift,
        parameters=_pairs(source, data.get("parameters"), "parameters"),
        prerequisites=tuple(parse_resources(data.get("prerequisites"), source)),
        expected=expected, infeasible_reason=reason, cleanup=cleanup,
        oracle_family=_str(source, oracle, "family", required=False, max_len=64),
        oracle_args=_pairs(source, oracle.get("args"), "oracle.args"), source=source)
    if not re.match(r"\s*1\.", task.procedure):
        raise ConfigError(f"{source}: field 'procedure' must be numbered steps starting "
                          "with '1.'")
    return task


def load_task(path: Path | str) -> Task:
    path = Path(path)
    task = parse_task(read_yaml(path), str(path))
    if task.id != path.stem:
        raise ConfigError(f"{path}: field 'id' ({task.id!r}) must equal the file name")
    return task


def load_suite(root: Path | str) -> list[Task]:
    """Every ``*.yaml`` under ``root``, sorted by id; ids must be unique."""
    tasks = [load_task(p) for p in sorted(Path(root).rglob("*.yaml"))]
    seen: dict[str, str] = {}
    for t in tasks:
        if t.id in seen:
            raise ConfigError(f"{t.source}: id {t.id!r} is also used by {seen[t.id]}")
        seen[t.id] = t.source
    return sorted(tasks, key=lambda t: t.id)


TASKS_DIR = Path(__file__).resolve().parents[1] / "tasks"
