"""Typed access to an API call's flattened parameters, with Alibaba Cloud's error codes.

The SDK flattens lists and objects: ``SecurityGroupIds.1=sg-..``, ``Tag.1.Key=k``,
``SystemDisk.Category=cloud_essd``; some list parameters are JSON strings (``InstanceIds``).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

from consolerl.text import ascii_digits

from .errors import CloudError, invalid, missing

_MAX_LIST = 100
_MAX_JSON_CHARS = 16 * 1024      # 100 ids of 128 characters, quoted, with commas


def json_depth(text: str) -> int:
    """How deeply the arrays and objects of a JSON text nest (0 for a scalar), counted without
    parsing, so that a deep text is refused before a recursive parser overflows the stack."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def json_value(name: str, text: str, *, max_len: int, max_depth: int, why: str) -> object:
    """Parse the JSON text of parameter ``name``; InvalidParameter naming it (and ``why``)
    when it is longer than ``max_len`` characters, nests deeper than ``max_depth``, or is
    not JSON. Never a RecursionError."""
    if len(text) > max_len:
        raise invalid(name, f"at most {max_len} characters; {why}")
    if json_depth(text) > max_depth:
        raise invalid(name, f"nested more than {max_depth} level{'s' if max_depth > 1 else ''} "
                            f"deep; {why}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise invalid(name, why) from None



def _list_index(key: str, digits: str) -> int:
    """A list index (``Tag.3.Key`` -> 3) between 1 and the list limit; InvalidParameter
    naming the key (cut short) otherwise. The length is checked before ``int()``, which
    refuses numbers of more than 4,300 digits with a ValueError."""
    if len(digits) > 6 or not 1 <= int(digits) <= _MAX_LIST:
        raise invalid(key[:64], f"list index must be between 1 and {_MAX_LIST}")
    return int(digits)


class Params:
    def __init__(self, raw: Mapping[str, str]):
        self.raw = dict(raw)

    def __contains__(self, name: str) -> bool:
        return name in self.raw

    def str(self, name: str, *, required: bool = False, default: str | None = None,
            max_len: int = 1024, min_len: int = 0, pattern: str | None = None,
            choices: Iterable[str] | None = None, code: str = "InvalidParameter",
            why: str = "") -> str | None:
        value = self.raw.get(name)
        if value is None or value == "":
            if required:
                raise missing(name)
            return default
        if len(value) > max_len or len(value) < min_len:
            raise invalid(name, why or f"length must be between {min_len} and {max_len}", code)
        if choices is not None:
            allowed = list(choices)
            if value not in allowed:
                raise invalid(name, f"allowed values are {', '.join(allowed)}", code)
        if pattern is not None and not re.fullmatch(pattern, value):
            raise invalid(name, why or "the format is not valid", code)
        return value

    def req(self, name: str, **kw) -> str:
        value = self.str(name, required=True, **kw)
        assert value is not None  # required=True never returns None
        return value

    def int(self, name: str, *, default: int | None = None, lo: int = 0,
            hi: int = 2 ** 31 - 1, required: bool = False) -> int | None:
        value = self.raw.get(name)
        if value is None or value == "":
            if required:
                raise missing(name)
            return default
        if not re.fullmatch(r"-?[0-9]{1,12}", value):
            raise invalid(name, "must be an integer")
        number = int(value)
        if not lo <= number <= hi:
            raise invalid(name, f"must be between {lo} and {hi}")
        return number

    def bool(self, name: str, default: bool = False) -> bool:
        value = self.raw.get(name)
        if value is None or value == "":
            return default
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise invalid(name, "must be true or false")

    def list(self, name: str) -> list[str]:
        """``Name.1``, ``Name.2``, ... in index order."""
        items: dict[int, str] = {}
        prefix = name + "."
        for key, value in self.raw.items():
            if key.startswith(prefix) and ascii_digits(key[len(prefix):]):
                index = _list_index(key, key[len(prefix):])
                items[index] = value
        return [items[i] for i in sorted(items)]

    def structs(self, name: str, fields: Iterable[str]) -> list[dict[str, str]]:
        """``Name.N.Field`` entries grouped by N, in index order; unknown fields are refused."""
        allowed = set(fields)
        groups: dict[int, dict[str, str]] = {}
        prefix = name + "."
        for key, value in self.raw.items():
            if not key.startswith(prefix):
                continue
            index, dot, field = key[len(prefix):].partition(".")
            if not dot or not ascii_digits(index):
                continue
            number = _list_index(key, index)
            if field not in allowed:
                raise invalid(key[:64], f"unknown field; allowed: {', '.join(sorted(allowed))}")
            groups.setdefault(number, {})[field] = value
        return [groups[i] for i in sorted(groups)]

    def json_list(self, name: str) -> list[str] | None:
        """A JSON array of strings (``["i-xxx", ...]``), at most 100 of them."""
        value = self.raw.get(name)
        if value is None or value == "":
            return None
        shape = 'must be a JSON array of strings, like ["i-xxx"]'
        items = json_value(name, value, max_len=_MAX_JSON_CHARS, max_depth=1, why=shape)
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise invalid(name, shape)
        if len(items) > _MAX_LIST:
            raise invalid(name, f"at most {_MAX_LIST} items")
        return items

    def tags(self, name: str = "Tag") -> list[tuple[str, str]]:
        tags = []
        for entry in self.structs(name, ("Key", "Value")):
            key = entry.get("Key", "")
            if not key:
                raise CloudError("InvalidTagKey.Malformed", f"{name}.N.Key must not be empty.", 400)
            if len(key) > 128 or key.startswith(("aliyun", "acs:", "http://", "https://")):
                raise CloudError("InvalidTagKey.Malformed",
                                 "Tag keys are at most 128 characters and cannot start with "
                                 "aliyun, acs:, http:// or https://.", 400)
            value = entry.get("Value", "")
            if len(value) > 128:
                raise CloudError("InvalidTagValue.Malformed", "Tag values are at most 128 characters.", 400)
            tags.append((key, value))
        if len(tags) > 20:
            raise CloudError("InvalidTagCount", "A resource can have at most 20 tags.", 400)
        return tags
