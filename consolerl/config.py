"""Typed configuration from one YAML file with command-line overrides.

Each component owns a frozen dataclass (its field types say which values are valid); the
composition root declares one dataclass whose fields are those component configs and builds it with
:func:`load_config`::

    root = load_config(RootConfig, "configs/cpu.yaml", ["agent.max_steps=12", "policy.replicas=2"])

Overrides are ``dotted.path=value`` with the value read as YAML (``12``, ``true``, ``[a, b]``,
``null``). Unknown keys, wrong types and bad values are :class:`ConfigError` naming the file (or
override) and the dotted field.

A config states its fields' constraints in their types and derives from :class:`Checked`, which
checks them on construction (from YAML or from code alike)::

    @dataclass(frozen=True)
    class OrchestratorConfig(Checked):
        group_size: Annotated[int, AtLeast(1)] = 2
        mode: Literal["async", "sync"] = "async"
        curriculum_floor: Annotated[float, Between(0, 1, low_open=True)] = 0.1

A bad value is a :class:`ConfigError` naming ``Class.field`` and what is allowed
(``OrchestratorConfig.curriculum_floor: must be a number in (0, 1], got 2``). A constrained
number is finite; a ``bool`` field holds a bool. A config's ``__post_init__`` keeps only what
no single field can say (settings that contradict each other) and calls
``super().__post_init__()`` first.
"""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from .errors import ConfigError

T = TypeVar("T")
# A decimal number with an exponent and no dot, which YAML 1.1 leaves as a string.
_EXPONENT_NUMBER = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


# Resources with their own settings (num_cpus, num_gpus, memory_gib), not custom ones.
_BUILTIN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


def check_resources(where: str, value: Any) -> None:
    """Ray custom resources an actor needs (``{"browser": 1}``): it is placed only on a node
    that offers them. Names other than Ray's built-in ones; amounts > 0, whole numbers above
    1 (Ray's rule for fractional resources)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: must be a mapping of resource name to amount, "
                          f"got {type(value).__name__}")
    for name, amount in value.items():
        if not isinstance(name, str) or not name or name in _BUILTIN_RESOURCES:
            raise ConfigError(f"{where}: {name!r} is not a custom resource name (CPUs, GPUs "
                              "and memory have settings of their own)")
        if (isinstance(amount, bool) or not isinstance(amount, (int, float))
                or not amount > 0 or amount == float("inf")):
            raise ConfigError(f"{where}.{name}: must be a number > 0, got {amount!r}")
        if amount > 1 and amount != int(amount):
            raise ConfigError(f"{where}.{name}: an amount above 1 must be a whole number, "
                              f"got {amount!r}")


# Constraints a config field's type carries: ``Annotated[int, AtLeast(1)]``.

@dataclasses.dataclass(frozen=True)
class AtLeast:
    """A number >= ``low`` (> ``low`` with ``open``)."""

    low: float
    open: bool = False

    def allows(self, value: Any) -> bool:
        return value > self.low if self.open else value >= self.low

    def describe(self) -> str:
        return f"{'>' if self.open else '>='} {_num(self.low)}"


@dataclasses.dataclass(frozen=True)
class AtMost:
    """A number <= ``high`` (< ``high`` with ``open``)."""

    high: float
    open: bool = False

    def allows(self, value: Any) -> bool:
        return value < self.high if self.open else value <= self.high

    def describe(self) -> str:
        return f"{'<' if self.open else '<='} {_num(self.high)}"


@dataclasses.dataclass(frozen=True)
class Finite:
    """Any finite number."""

    def allows(self, value: Any) -> bool:
        return True

    def describe(self) -> str:
        return ""


@dataclasses.dataclass(frozen=True)
class Between:
    """A number in [``low``, ``high``]; either end excluded with ``low_open`` / ``high_open``."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def allows(self, value: Any) -> bool:
        return ((value > self.low if self.low_open else value >= self.low)
                and (value < self.high if self.high_open else value <= self.high))

    def describe(self, integer: bool = False) -> str:
        if integer and not (self.low_open or self.high_open):
            return f"in {_num(self.low)}..{_num(self.high)}"
        return (f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}"
                f"{')' if self.high_open else ']'}")


@dataclasses.dataclass(frozen=True)
class OneOf:
    """One of ``values`` (a set known only at run time; a fixed one is a ``Literal``)."""

    values: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Satisfies:
    """``check(where, value)`` raises :class:`ConfigError` naming ``where`` for a bad value."""

    check: Callable[[str, Any], None]


@dataclasses.dataclass(frozen=True)
class NonEmpty:
    """A non-empty string (``trimmed``: without surrounding spaces)."""

    trimmed: bool = False


@dataclasses.dataclass(frozen=True)
class Matches:
    """A string the regular expression ``pattern`` matches whole; ``what`` says in words what
    that is (``a redis:// URL``) for the error message, which otherwise shows the pattern."""

    pattern: str
    what: str = ""


@dataclasses.dataclass(frozen=True)
class Regex:
    """A regular expression (:func:`re.compile` takes it)."""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_Check = Callable[[str, Any], None]


def _checker(tp: Any) -> _Check | None:
    """A check of a value against the constraints ``tp`` carries (None: it carries none)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        base, marks = args[0], args[1:]
        inner = _checker(base)

        def check(where: str, value: Any) -> None:
            if inner is not None:
                inner(where, value)
            for mark in marks:
                _apply(mark, base, where, value)
        return check
    if tp is bool:
        def boolean(where: str, value: Any) -> None:
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: must be true or false, got {value!r}")
        return boolean
    if origin is typing.Literal:
        def literal(where: str, value: Any) -> None:
            if value not in args:
                raise ConfigError(f"{where}: must be one of {', '.join(map(str, args))}, "
                                  f"got {value!r}")
        return literal
    if origin in (typing.Union, types.UnionType):
        arms = [(arg, _checker(arg)) for arg in args if arg is not type(None)]
        if not any(c for _, c in arms):
            return None
        optional = type(None) in args

        def union(where: str, value: Any) -> None:
            if value is None and optional:
                return
            errors = []
            for _, arm in arms:
                if arm is None:
                    return
                try:
                    return arm(where, value)
                except ConfigError as exc:
                    errors.append(str(exc))
            message = errors[0]
            if optional:
                message = message.replace(", got ", " or null, got ", 1)
            raise ConfigError(message)
        return union
    if origin in (tuple, list) and args:
        item = _checker(args[0])
        if item is None or (origin is tuple and len(args) != 2) or (
                origin is tuple and args[1] is not Ellipsis):
            return None

        def items(where: str, value: Any) -> None:
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise ConfigError(f"{where}: must be a list, got {value!r}")
            for i, v in enumerate(value):
                item(f"{where}[{i}]", v)
        return items
    return None


def _apply(mark: Any, base: Any, where: str, value: Any) -> None:
    if isinstance(mark, (AtLeast, AtMost, Between, Finite)):
        integer = base is int
        if not (_is_int(value) if integer else _is_number(value)) or (
                not integer and not math.isfinite(value)) or not mark.allows(value):
            rule = mark.describe(integer) if isinstance(mark, Between) else mark.describe()
            kind = "an integer" if integer else "a number" if rule else "a finite number"
            raise ConfigError(f"{where}: must be {' '.join(filter(None, (kind, rule)))}, "
                              f"got {value!r}")
    elif isinstance(mark, OneOf):
        if value not in mark.values:
            raise ConfigError(f"{where}: must be one of {', '.join(map(str, mark.values))}, "
                              f"got {value!r}")
    elif isinstance(mark, NonEmpty):
        if not isinstance(value, str) or not value or (mark.trimmed and value != value.strip()):
            rule = " without surrounding spaces" if mark.trimmed else ""
            raise ConfigError(f"{where}: must be a non-empty string{rule}, got {value!r}")
    elif isinstance(mark, Matches):
        if not isinstance(value, str) or not re.fullmatch(mark.pattern, value):
            raise ConfigError(f"{where}: must be {mark.what or 'a match of ' + mark.pattern}, "
                              f"got {value!r}")
    elif isinstance(mark, Regex):
        try:
            re.compile(value)
        except (re.error, TypeError) as exc:
            raise ConfigError(f"{where}: not a regular expression ({exc}), "
                              f"got {value!r}") from None
    elif isinstance(mark, Satisfies):
        mark.check(where, value)


_CHECKS: dict[type, tuple[tuple[str, str, _Check], ...]] = {}


def _checks(cls: type) -> tuple[tuple[str, str, _Check], ...]:
    """(field, the name of the class that declares it, its check) for each constrained field."""
    found = _CHECKS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        owner = {f.name: next(c.__name__ for c in cls.__mro__
                              if f.name in getattr(c, "__annotations__", {}))
                 for f in dataclasses.fields(cls)}
        found = tuple((f.name, owner[f.name], check) for f in dataclasses.fields(cls)
                      if (check := _checker(hints[f.name])) is not None)
        _CHECKS[cls] = found
    return found


def check_fields(config: Any, name: str | None = None) -> None:
    """Check every field of the dataclass ``config`` against the constraints its type carries;
    the :class:`ConfigError` names ``name.field`` (``name``: the config's ``config_name``, else
    the class that declares the field)."""
    prefix = name or getattr(config, "config_name", "")
    for field_name, owner, check in _checks(type(config)):
        check(f"{prefix or owner}.{field_name}", getattr(config, field_name))


class Checked:
    """Base of a config dataclass whose fields' types carry their constraints
    (:class:`AtLeast`, :class:`AtMost`, :class:`Between`, :class:`Finite`, :class:`OneOf`,
    :class:`NonEmpty`, :class:`Matches`, :class:`Regex`, :class:`Satisfies`, ``Literal``):
    checked on construction. ``config_name`` (a class attribute; default the name of the class
    that declares the field) is what messages call it."""

    def __post_init__(self) -> None:
        check_fields(self)


def _loosen(tp: Any) -> Any:
    """``tp`` without its ``Literal`` choices, which a :class:`Checked` config checks itself
    (naming ``Class.field``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return Any
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_loosen(a) for a in args)]
    return tp


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: must be a mapping, got {type(value).__name__}")
        return build(tp, value, where)
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: must be a list, got {type(value).__name__}")
        item = args[0] if args else Any
        items = [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return list(items) if origin is list or tp is list else tuple(items)
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: must be a mapping, got {type(value).__name__}")
        kt, vt = args if args else (Any, Any)
        return {_convert(kt, k, where): _convert(vt, v, f"{where}.{k}") for k, v in value.items()}
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: must be one of {', '.join(map(str, args))}, "
                              f"got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be an integer, got {value!r}")
        return value
    if tp is float:
        # YAML 1.1 (PyYAML) reads 3e-4 or 1E5 (no dot) as a string; take them as the numbers
        # they are, in the file and in overrides alike.
        if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value.strip()):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: must be a string, got {value!r}")
        return value
    return value


def build(cls: type[T], data: Mapping[str, Any], where: str = "config") -> T:
    """``cls`` (a dataclass) from a mapping, recursively; unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    if issubclass(cls, Checked):
        hints = {name: _loosen(tp) for name, tp in hints.items()}
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = set(data) - set(fields)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                          f"allowed: {', '.join(fields)}")
    kwargs = {name: _convert(hints[name], value, f"{where}.{name}")
              for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _set(tree: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"{where}: bad key {dotted!r}")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{where}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def read_yaml(path: str | Path) -> Any:
    """The YAML document in the file at ``path``; ConfigError naming the file when it cannot be
    read, is not UTF-8 or not YAML. PyYAML itself raises more than YAMLError on odd input: a
    number of more than 4,300 digits is a ValueError, brackets a few thousand deep a
    RecursionError."""
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc)[:200]}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None


def load_config(cls: type[T], path: str | Path | None = None,
                overrides: Sequence[str] = ()) -> T:
    """Build ``cls`` from the YAML file at ``path`` (optional) plus ``overrides``."""
    return build(cls, config_tree(path, overrides), "config" if path is None else str(path))


def config_tree(path: str | Path | None = None, overrides: Sequence[str] = ()
                ) -> dict[str, Any]:
    """The plain mapping :func:`load_config` builds from: the YAML file at ``path`` (optional)
    with ``overrides`` (``dotted.key=value``) set in it. What a config states, as opposed to
    what it leaves to the defaults."""
    tree: dict[str, Any] = {}
    if path is not None:
        loaded = read_yaml(path)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: must hold a mapping")
        tree = loaded or {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        _set(tree, key.strip(), value, f"override {item!r}")
    return tree


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain data (tuples as lists), for logging the run's effective config."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(config)
