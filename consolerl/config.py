"""Typed configuration from one YAML file with command-line overrides.

Each component owns a frozen dataclass (its ``__post_init__`` validates values); the composition
root declares one dataclass whose fields are those component configs and builds it with
:func:`load_config`::

    root = load_config(RootConfig, "configs/cpu.yaml", ["agent.max_steps=12", "policy.replicas=2"])

Overrides are ``dotted.path=value`` with the value read as YAML (``12``, ``true``, ``[a, b]``,
``null``). Unknown keys, wrong types and bad values are :class:`ConfigError` naming the file (or
override) and the dotted field.
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from .errors import ConfigError

T = TypeVar("T")
# A decimal number with an exponent and no dot, which YAML 1.1 leaves as a string.
_EXPONENT_NUMBER = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


def check_int(where: str, value: Any, minimum: int) -> None:
    """A config field that must be an integer (not a bool) of at least ``minimum``; the
    :class:`ConfigError` names ``where`` (``Class.field``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: must be an integer >= {minimum}, got {value!r}")


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
    tree: dict[str, Any] = {}
    where = "config"
    if path is not None:
        where = str(path)
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
    return build(cls, tree, where)


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
