"""Fuzzing of the pure parsers of outside input: the action parser, goto's
host allow-list, task files (from dicts, as the jobs API gets them, and from YAML text), their
prerequisites, drift profiles, accounts files, the local cloud's parameter parsing, query
strings, ACS3 Authorization headers and timestamps, judges' replies and lease user agents.

Properties, for every generated input: the parser returns a value or raises only its documented
error type (never a TypeError, ValueError, RecursionError... of its own), within a time bound
and a tracemalloc peak bound per input (:class:`Probe`). Hypothesis runs derandomized, so each
test runs the same examples every time; the count is each test's ``n`` (in its id) and a
``FUZZ <name>: N examples ...`` line is printed (``pytest -rP`` shows it). No Hypothesis
deadline: on shared cores its 200 ms flakes; :class:`Probe` asserts a looser bound itself.
"""
from __future__ import annotations

import json
import re
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from consolerl.accounts import parse_accounts, parse_lease_agent
from consolerl.drift import KINDS, parse as parse_drift
from consolerl.errors import ConfigError
from consolerl.resources import SCHEMA as RESOURCE_SCHEMA, parse_resources
from consolerl.tasks import TASKS_DIR, Task, load_task, parse_task
from env_workers.actions import (ACTION_TYPES, MAX_OUTPUT_CHARS, Action, ActionError,
                                 host_allowed, parse_action)
from infra.console_sim.auth import parse_params
from infra.console_sim.errors import CloudError
from infra.console_sim.params import Params, json_depth
from infra.console_sim.signing import parse_acs3_authorization
from infra.console_sim.timeutil import iso, parse_iso
from reward_service.judges import JudgeConfig, parse_vote

pytestmark = pytest.mark.timeout(120)   # a hang fails in 2 minutes, not the suite's 5


def fuzz(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example])


class Probe:
    """Runs one parser call per example with a time and memory bound, and counts examples.

    ``with Probe(...) as probe:`` prints the count at the end. ``probe.call(fn, *args,
    expect=(ErrorType,))`` returns ``(value, None)``, or ``(None, error)`` for a documented
    error, and lets any other exception through (the test fails with it). It asserts that the
    call took under ``seconds`` and (traced by tracemalloc, unless ``trace=False``) that its
    peak allocation stayed under ``peak_bytes + per_char * size`` (``size``: input length)."""

    def __init__(self, name: str, seconds: float = 1.0, peak_bytes: int = 4 << 20,
                 per_char: int = 16, trace: bool = True):
        self.name, self.seconds, self.peak_bytes, self.per_char = name, seconds, peak_bytes, \
            per_char
        self.trace = trace
        self.runs, self.slowest, self.peak = 0, 0.0, 0

    def __enter__(self) -> "Probe":
        return self

    def __exit__(self, *exc: object) -> None:
        print(f"FUZZ {self.name}: {self.runs} examples, slowest {self.slowest * 1000:.1f} ms, "
              f"peak {self.peak / 1024:.0f} KiB")

    def call(self, fn: Callable[..., Any], *args: Any, expect: tuple[type[BaseException], ...]
             = (), size: int = 0) -> tuple[Any, BaseException | None]:
        self.runs += 1
        # Traced around the call only: tracing Hypothesis's own work would triple the run time.
        if self.trace:
            tracemalloc.start()
        started = time.perf_counter()
        value, error = None, None
        try:
            value = fn(*args)
        except expect as exc:
            error = exc
        finally:
            elapsed = time.perf_counter() - started
            peak = tracemalloc.get_traced_memory()[1] if self.trace else 0
            tracemalloc.stop()
            self.slowest, self.peak = max(self.slowest, elapsed), max(self.peak, peak)
        assert elapsed < self.seconds, f"{self.name} took {elapsed:.2f} s on {_show(args)}"
        limit = self.peak_bytes + self.per_char * size
        assert peak < limit, f"{self.name} allocated {peak} bytes (limit {limit}) on {_show(args)}"
        return value, error


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) < 300 else text[:300] + f"... ({len(text)} chars)"


# ---- shared strategies -----------------------------------------------------------------------

# Any code point, lone surrogates included (JSON "\ud800" decodes to one).
anychar = st.characters(codec=None, exclude_categories=())
anytext = st.text(anychar, max_size=200)
shorttext = st.text(anychar, max_size=16)
# Long runs of one piece: what a looping model or an attacker sends.
def runs(pieces: list[str], most: int) -> st.SearchStrategy[str]:
    return st.builds(lambda p, n: (p * n)[:most], st.sampled_from(pieces),
                     st.integers(1, most))


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                         st.floats(allow_nan=True, allow_infinity=True), shorttext)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(shorttext, inner, max_size=4), max_leaves=8)


# ---- the action parser -------------------------------------------------------------------------

ACTION_NAMES = [cls.name for cls in ACTION_TYPES]
action_pieces = st.one_of(
    st.sampled_from(ACTION_NAMES + ["Action:", "Action: ", "(", ")", "((", "))", ",", '"', "'",
                                    "\\", '\\"', "\\n", "\\u0000", "\\x", "[", "]", "[17]",
                                    "```", "```python", " ", "\t", "\n", "\r\n", "\r", "a12",
                                    "Control+", "Enter", "https://", "http://[::1]:80/",
                                    "@", "#", "%", "\x00", "\x1b", "\u2028", "\ufeff",
                                    "\ud800", "é", "你好", "import os", ";"]),
    st.text(anychar, max_size=8))
model_outputs = st.lists(action_pieces, max_size=60).map("".join)


@pytest.mark.parametrize("n", [500])
def test_parse_action_never_raises_on_model_output(n):
    """500 examples: text built from the grammar's own pieces (names, quotes, escapes, fences,
    brackets, control characters, surrogates). An action comes back valid and canonical."""
    with Probe("parse_action", seconds=0.5) as probe:
        @fuzz(n)
        @given(text=st.one_of(model_outputs, anytext))
        def run(text):
            result, _ = probe.call(parse_action, text, size=len(text))
            assert isinstance(result, (Action, ActionError))
            if isinstance(result, Action):
                assert parse_action(result.to_text()) == result
            else:
                # The error quotes at most a short excerpt of the model's text.
                assert len(result.message) < 1500, len(result.message)
        run()
    assert probe.runs >= n


@pytest.mark.parametrize("n", [40])
def test_parse_action_huge_outputs_are_bounded(n):
    """40 examples of 2k-150k characters: long runs of one piece (parentheses, quotes,
    backslashes, fences, newlines, action lines), alone or around a valid action."""
    pieces = ["(", "click(", '"', "\\", "```\n", "\n", "click(a1)\n", 'fill(b, "', "Action: ",
              "\\n", " ", "a", "```python\nclick(a1)\n```\n", "\ud800", "[1]"]
    with Probe("parse_action_huge", seconds=2.0) as probe:
        @fuzz(n)
        @given(body=runs(pieces, MAX_OUTPUT_CHARS + 50_000),
               tail=st.sampled_from(["", "\nclick(a1)", '\nfill(b, "x")', "```"]))
        def run(body, tail):
            text = body + tail
            result, _ = probe.call(parse_action, text, size=len(text))
            assert isinstance(result, (Action, ActionError))
            if len(text) > MAX_OUTPUT_CHARS:
                assert isinstance(result, ActionError)
        run()


hosts = st.one_of(
    st.sampled_from(["127.0.0.1", "localhost", "[::1]", "[::ffff:127.0.0.1]", "0x7f.1",
                     "LOCALHOST", "ecs.console.aliyun.com", "\u212aelvin", "xn--80ak6aa92e.com",
                     "[", "]", "[::1", "a..b", "", "%2e", "2130706433", "127.1"]),
    st.text(anychar, max_size=20))
ports = st.one_of(st.just(""), st.sampled_from([":", ":0", ":80", ":65535", ":65536", ":-1",
                                                 ":99999999999999999999", ":８０", ":0x50"]),
                  st.text(anychar, max_size=6).map(lambda s: ":" + s))
urls = st.builds(lambda scheme, user, host, port, path: f"{scheme}{user}{host}{port}{path}",
                 st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "javascript:",
                                  "//", "", "http:/", "http:\\\\"]),
                 st.sampled_from(["", "user@", "a:b@", "@", "host@"]), hosts, ports,
                 st.one_of(st.just(""), st.text(anychar, max_size=30)))


@pytest.mark.parametrize("n", [300])
def test_host_allowed_never_raises(n):
    """300 examples: URLs from hostile schemes, credentials, hosts (IPv6, IDNA, Kelvin sign,
    numeric IPs) and ports, against hostile allow-list entries; a bool, every time."""
    with Probe("host_allowed", seconds=0.5) as probe:
        @fuzz(n)
        @given(url=st.one_of(urls, anytext),
               entries=st.lists(st.one_of(hosts.map(lambda h: h), st.builds(
                   lambda h, p: h + p, hosts, ports), st.none(), st.integers()), max_size=4))
        def run(url, entries):
            allowed, _ = probe.call(host_allowed, url, entries, size=len(url))
            assert isinstance(allowed, bool)
        run()


# ---- task files ----------------------------------------------------------------------------

BASE_TASKS = [yaml.safe_load(p.read_text()) for p in sorted(TASKS_DIR.rglob("*.yaml"))
              if p.stem in ("ecs-add-rule-0", "oss-delete-bucket-0",
                            "oss-enable-versioning-wrongdoc")]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys and indices) into a document, the root excluded."""
    found = []
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        found.append(prefix + (key,))
        found.extend(_paths(child, prefix + (key,)))
    return found


@st.composite
def mutated_tasks(draw) -> dict:
    """A real task document with 1-4 mutations: a value replaced by any JSON value, a key
    removed, an unknown key added."""
    doc = json.loads(json.dumps(draw(st.sampled_from(BASE_TASKS))))
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        how = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if how == "replace":
            parent[path[-1]] = draw(json_values)
        elif how == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.one_of(anytext, st.sampled_from(list(parent))))] = draw(json_values)
        else:
            parent.append(draw(json_values))
    return doc


@pytest.mark.parametrize("n", [300])
def test_parse_task_mutated_documents(n):
    """300 examples: real task documents with values replaced by any JSON value (recursive:
    NaN, huge ints, surrogates, nested lists and maps), keys removed, unknown keys added, as
    an API job's inline definition or POST /v1/tasks/validate hands them over. A Task, or a
    ConfigError naming the source."""
    with Probe("parse_task", seconds=0.5) as probe:
        @fuzz(n)
        @given(doc=mutated_tasks())
        @example(doc={**BASE_TASKS[0], "prerequisites": [{"id": "x", "type": []}]})
        @example(doc={**BASE_TASKS[0], "prerequisites": [{"id": "x", "type": {"a": 1}}]})
        @example(doc={**BASE_TASKS[0], "schema": _laughs(7)})
        @example(doc={**BASE_TASKS[0], "prerequisites": [{"id": "x", "type": _laughs(7)}]})
        @example(doc={**BASE_TASKS[0], "prerequisites": [{"id": _laughs(7), "type": "vpc"}]})
        @example(doc={**BASE_TASKS[0], "prerequisites": [{"id": "x", "type": "security_group_rule",
                                                          "properties": {"priority": _laughs(7)}}]})
        @example(doc={**BASE_TASKS[0], "success": {"required_events": [
            {"event": "X", "where": {"a": {7: 1}}}]}})
        @example(doc={**BASE_TASKS[0], 7: 1, "x": 2})
        def run(doc):
            task, error = probe.call(parse_task, doc, "inline", expect=(ConfigError,))
            assert isinstance(task, Task) or str(error).startswith("inline")
        run()


@pytest.mark.parametrize("n", [80])
def test_parse_task_any_value(n):
    """80 examples: any JSON value at all, and maps with only task keys."""
    keys = st.sampled_from(["schema", "id", "product", "title", "procedure", "start_page",
                            "split", "difficulty", "success", "prerequisites", "parameters",
                            "oracle", "drift", "expected", "infeasible_reason", "cleanup"])
    with Probe("parse_task_any", seconds=0.5) as probe:
        @fuzz(n)
        @given(doc=st.one_of(json_values, st.dictionaries(keys, json_values, max_size=12)))
        def run(doc):
            task, error = probe.call(parse_task, doc, "inline", expect=(ConfigError,))
            assert isinstance(task, Task) or str(error).startswith("inline")
        run()


def _laughs(levels: int) -> list:
    """A "billion laughs" value: 10**(levels + 1) leaves in a few hundred objects, as PyYAML
    builds it from aliases (it shares aliased nodes: loading is cheap, printing is not)."""
    value: list = ["lol"] * 10
    for _ in range(levels):
        value = [value] * 10
    return value


def _laughs_yaml(levels: int) -> str:
    """The same as YAML flow text: ``[&l0 [lol, ...], &l1 [*l0, ...], ...]``."""
    items = ["&l0 [" + ", ".join(["lol"] * 10) + "]"]
    items += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return "[" + ", ".join(items) + "]"


yaml_pieces = st.sampled_from(
    ["schema: 1\n", "id: fuzz-task\n", "product: ram\n", "split: train\n", "difficulty: 2\n",
     "title: T\n", "procedure: '1. Do it.'\n", "start_page: /console/ram/users\n",
     "success:\n", "  required_events:\n", "  - event: CreateUser\n", "    where:\n",
     "      x: {regex: '('}\n", "prerequisites:\n", "- id: a\n", "  type: vpc\n",
     "- {id: b, type: [1]}\n", "parameters: {a: [1]}\n", "a: &a [1, 2]\n", "b: *a\n", "*x\n",
     "!!python/object:os.system\n", "!!binary AAAA\n", "!!set {a, b}\n", "? [a]\n: 1\n",
     "{", "}", "[", "]", "- ", ": ", "\t", "'", '"', "\\", "#", "&", "*", "%YAML 1.1\n",
     "---\n", "...\n", "\x00", "\ud800", "\ufeff", "1" * 5000, "1e400", ".nan", "~"])
yaml_texts = st.lists(st.one_of(yaml_pieces, st.text(anychar, max_size=10)),
                      max_size=25).map("".join)


@pytest.mark.parametrize("n", [150])
def test_load_task_yaml_text(tmp_path, n):
    """150 examples: task files of YAML pieces (tags, aliases, anchors, tabs, NUL, BOM,
    surrogates, 5,000-digit numbers, deep brackets) and billion-laughs aliases; a Task or a
    ConfigError naming the file, bounded in time. Not traced: PyYAML's deep recursion under
    tracemalloc is 20 times slower. (PyYAML's pure-Python scanner takes about 2 s on a file of
    a few thousand "[" before its RecursionError: slow but bounded; 1,000 here.)"""
    with Probe("load_task", seconds=3.0, trace=False) as probe:
        @fuzz(n)
        @given(text=st.one_of(yaml_texts, runs(["[", "{a: ", "- ", "*a "], 1000)))
        @example(text="schema: " + "1" * 5000 + "\n")
        @example(text="[" * 1000)
        @example(text="- " * 3000 + "x")
        @example(text="schema: 1\n7: x\nb: y\n")
        @example(text=f"schema: {_laughs_yaml(7)}\n")
        @example(text=f"schema: 1\nid: fuzz-task\nx: {_laughs_yaml(7)}\n")
        def run(text):
            path = tmp_path / "fuzz-task.yaml"
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
            task, error = probe.call(load_task, path, expect=(ConfigError,), size=len(text))
            assert isinstance(task, Task) or str(error).startswith(str(path))
            if error is not None:
                assert len(str(error)) < 5000, len(str(error))
        run()


@pytest.mark.parametrize("n", [150])
def test_parse_resources(n):
    """150 examples: prerequisite lists of declared types with any property values and ids,
    references (to nothing, to themselves, in cycles)."""
    refs = st.sampled_from(["${a}", "${b}", "${c}", "${}", "${A}", "$${a}", "{episode}"])
    item = st.fixed_dictionaries({
        "id": st.one_of(st.sampled_from(["a", "b", "c", "A", "", "a" * 40]), json_values),
        "type": st.one_of(st.sampled_from(sorted(RESOURCE_SCHEMA)), json_values)},
        optional={"properties": st.one_of(json_values, st.dictionaries(
            st.sampled_from(sorted({p for s in RESOURCE_SCHEMA.values() for p in s})),
            st.one_of(refs, json_values), max_size=5)), "extra": json_values})
    with Probe("parse_resources", seconds=0.5) as probe:
        @fuzz(n)
        @given(data=st.one_of(st.lists(item, max_size=5), json_values))
        def run(data):
            probe.call(parse_resources, data, "inline", expect=(ConfigError,))
        run()


@pytest.mark.parametrize("n", [100])
def test_drift_profiles(n):
    """100 examples: drift texts (the sign-in page's ``drift=``), kinds and junk, commas."""
    part = st.one_of(st.sampled_from([*KINDS, "all", "", " ", "ALL", "rename "]), anytext)
    with Probe("drift.parse", seconds=0.5) as probe:
        @fuzz(n)
        @given(text=st.one_of(st.lists(part, max_size=8).map(",".join), st.none(),
                              runs(["rename,", "x,", ",", "zz" * 30 + ","], 20_000)))
        def run(text):
            kinds, error = probe.call(parse_drift, text, expect=(ConfigError,),
                                      size=len(text or ""))
            assert error is not None or kinds <= set(KINDS)
            if error is not None:
                assert len(str(error)) < 1000
        run()


@pytest.mark.parametrize("n", [80])
def test_parse_accounts(n):
    """80 examples: accounts lists with any values for every field."""
    fields = ["account_id", "login_name", "password", "access_key_id", "access_key_secret"]
    account = st.dictionaries(st.one_of(st.sampled_from(fields), anytext), json_values,
                              max_size=6)
    with Probe("parse_accounts", seconds=0.5) as probe:
        @fuzz(n)
        @given(data=st.one_of(st.lists(account, max_size=4), json_values))
        @example(data=[{"account_id": _laughs(7)}])
        @example(data=[{"account_id": "1", 7: "x", "y": 1}])
        def run(data):
            probe.call(parse_accounts, data, "accounts.yaml", expect=(ConfigError,))
        run()


# ---- the local cloud's parameter parsing -----------------------------------------------------

digits = st.one_of(st.integers(-5, 120).map(str), st.sampled_from(
    ["0", "00", "01", "1" * 12, "9" * 13, "9" * 60, "١", "²", "٣", "１", "-0", "+1", " 1"]))
param_names = st.one_of(
    st.sampled_from(["RegionId", "PageSize", "InstanceIds", "DryRun", "Tag", "Name"]),
    st.builds(lambda n, i, f: f"{n}.{i}{f}", st.sampled_from(["Tag", "SecurityGroupIds",
                                                                "LookupAttribute", "Name"]),
              digits, st.sampled_from(["", ".Key", ".Value", ".Other", "."])),
    anytext)
param_values = st.one_of(
    anytext, digits, st.sampled_from(["", "true", "FALSE", "tRuE", "null", "[]", '["i-1"]',
                                      '["a", 1]', "{}", '"x"', "[" * 20 + "]" * 20,
                                      '["\\ud800"]', "aliyun:x", "acs:x", "x" * 129]),
    runs(["[", "{", '"', '\\"', '["x",', "1,", "\\"], 20_000))


ACCESSORS: dict[str, Callable[[Params, str], Any]] = {
    "str": lambda p, name: p.str(name, max_len=64, pattern=r"[a-z-]+", choices=["a", "b", "ä"]),
    "int": lambda p, name: p.int(name, lo=1, hi=100),
    "bool": lambda p, name: p.bool(name),
    "list": lambda p, name: p.list(name),
    "structs": lambda p, name: p.structs(name, ("Key", "Value")),
    "json_list": lambda p, name: p.json_list(name),
    "tags": lambda p, name: p.tags(name),
}


@pytest.mark.parametrize("n", [400])
def test_params_accessors(n):
    """400 examples: flattened API parameters (``Name.N.Field`` with odd indices: 0, 101,
    Arabic-Indic and full-width digits, 60 digits; JSON lists deep, huge, not strings), read
    by an accessor; a value or a 4xx CloudError whose message stays short."""
    with Probe("Params", seconds=0.5) as probe:
        @fuzz(n)
        @given(raw=st.dictionaries(param_names, param_values, max_size=6),
               name=st.sampled_from(["RegionId", "PageSize", "InstanceIds", "DryRun", "Tag",
                                     "Name", "SecurityGroupIds", "LookupAttribute"]),
               accessor=st.sampled_from(sorted(ACCESSORS)))
        def run(raw, name, accessor):
            size = sum(len(k) + len(v) for k, v in raw.items())
            _, error = probe.call(ACCESSORS[accessor], Params(raw), name, expect=(CloudError,),
                                  size=size)
            if error is not None:
                assert 400 <= error.status < 500, error
                assert len(error.message) < 1000, (accessor, len(error.message))
        run()


@pytest.mark.parametrize("accessor", ["list", "structs", "tags"])
@pytest.mark.parametrize("digits", [4000, 5000])
def test_params_huge_list_index_is_invalid_parameter(accessor, digits):
    """A list index of thousands of digits (``Tag.99...9.Key``, well inside the 32 KiB query
    limit) is an InvalidParameter with a short message, not a ValueError."""
    key = "Tag." + "9" * digits + ("" if accessor == "list" else ".Key")
    with pytest.raises(CloudError) as caught:
        ACCESSORS[accessor](Params({key: "k"}), "Tag")
    assert caught.value.code == "InvalidParameter" and len(caught.value.message) < 1000


@pytest.mark.parametrize("n", [100])
def test_json_depth_matches_the_parser(n):
    """100 examples: ``json_depth`` (the pre-parse guard) never raises, and for any text
    json.loads accepts it counts the depth the parser sees."""
    def depth(value: Any) -> int:
        if isinstance(value, list):
            return 1 + max((depth(v) for v in value), default=0)
        if isinstance(value, dict):
            return 1 + max((depth(v) for v in value.values()), default=0)
        return 0
    with Probe("json_depth", seconds=0.5) as probe:
        @fuzz(n)
        @given(text=st.one_of(json_values.map(json.dumps), anytext,
                              runs(["[", "{", '"', "\\", '"[', "]"], 20_000)))
        def run(text):
            counted, _ = probe.call(json_depth, text, size=len(text))
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                return
            assert counted == depth(value)
        run()


query_texts = st.one_of(
    st.lists(st.builds(lambda k, v: f"{k}={v}", st.text(anychar, max_size=12),
                       st.text(anychar, max_size=12)), max_size=8).map("&".join),
    st.lists(st.sampled_from(["a=1", "a=2", "%ff", "%zz", "%", "=", "&", "a", "%00",
                              "b=%00", "c=%e4%bd%a0", "d=%ed%a0%80", "+", ";", "x=" + "y" * 100]),
             max_size=10).map("".join),
    anytext)


@pytest.mark.parametrize("n", [150])
def test_parse_params(n):
    """150 examples: query strings and form bodies (bad percent escapes, encoded surrogates and
    NUL, repeated keys); a dict or an InvalidParameter CloudError."""
    with Probe("parse_params", seconds=0.5) as probe:
        @fuzz(n)
        @given(query=query_texts, form=query_texts)
        def run(query, form):
            params, error = probe.call(parse_params, query, form, expect=(CloudError,),
                                       size=len(query) + len(form))
            if error is not None:
                assert error.code == "InvalidParameter" and error.status == 400
            else:
                assert all(isinstance(k, str) and isinstance(v, str) for k, v in params.items())
        run()


@pytest.mark.parametrize("n", [150])
def test_parse_acs3_authorization(n):
    """150 examples: ACS3 Authorization headers (missing parts, empty values, commas, equals
    signs, other schemes); a (key, headers, signature) triple or None."""
    part = st.one_of(st.sampled_from(["Credential=LTAI5tLocalAlice000001", "Credential=",
                                      "SignedHeaders=host;x-acs-date", "SignedHeaders=;;",
                                      "Signature=abc", "Signature=", "=", "", "a=b=c", " "]),
                     st.text(anychar, max_size=12))
    headers = st.builds(lambda scheme, parts: scheme + ",".join(parts),
                        st.sampled_from(["ACS3-HMAC-SHA256 ", "ACS3-HMAC-SHA256", "OSS ", ""]),
                        st.lists(part, max_size=6))
    with Probe("parse_acs3_authorization", seconds=0.5) as probe:
        @fuzz(n)
        @given(value=st.one_of(headers, anytext))
        def run(value):
            parsed, _ = probe.call(parse_acs3_authorization, value, size=len(value))
            if parsed is not None:
                key, signed, signature = parsed
                assert key and signed and signature and all(signed)
        run()


@pytest.mark.parametrize("n", [150])
def test_parse_iso(n):
    """150 examples: timestamps (x-acs-date, Timestamp, StartTime): out-of-range fields,
    other digits, fractions, spaces; milliseconds (that format back) or None."""
    stamp = st.builds(
        lambda y, mo, d, h, mi, s, frac, z: f"{y}-{mo}-{d}T{h}:{mi}{s}{frac}{z}",
        st.one_of(st.integers(0, 99999).map(lambda v: f"{v:04d}"), st.just("２０２６")),
        st.integers(0, 99).map(lambda v: f"{v:02d}"), st.integers(0, 99).map(lambda v: f"{v:02d}"),
        st.integers(0, 99).map(lambda v: f"{v:02d}"), st.integers(0, 99).map(lambda v: f"{v:02d}"),
        st.sampled_from(["", ":00", ":59", ":60", ":99"]),
        st.sampled_from(["", ".0", ".123456", ".1234567"]), st.sampled_from(["Z", "", "+08:00"]))
    with Probe("parse_iso", seconds=0.5) as probe:
        @fuzz(n)
        @given(value=st.one_of(stamp, stamp.map(lambda s: f"  {s}\n"), anytext))
        def run(value):
            ms, _ = probe.call(parse_iso, value, size=len(value))
            if ms is not None:
                assert isinstance(ms, int)
                assert parse_iso(iso(ms)) == ms - ms % 1000
        run()


judge_replies = st.one_of(
    st.builds(lambda pre, obj, post: pre + obj + post, anytext,
              st.one_of(json_values.map(json.dumps), st.fixed_dictionaries(
                  {"verdict": st.one_of(st.sampled_from(["success", "failure"]), json_values),
                   "reason": json_values}).map(json.dumps)),
              st.sampled_from(["", "\n```", "```", " \n", "}"])),
    runs(["{", '{"a":', "[", '{"verdict":"success","reason":"x"}', "}"], 70_000),
    anytext, json_values)


@pytest.mark.parametrize("n", [150])
def test_parse_vote(n):
    """150 examples: judge replies (prose around any JSON object, deep nesting, long runs of
    braces, non-text); always a vote (invalid when malformed), never an exception."""
    deep = "ok " + '{"a":' + "[" * 1990 + "]" * 1990 + "}"
    with Probe("parse_vote", seconds=1.0) as probe:
        @fuzz(n)
        @given(reply=judge_replies)
        @example(reply=deep)
        @example(reply='{"verdict":"success","reason":' + "[" * 1990 + "]" * 1990 + "}")
        def run(reply):
            vote, _ = probe.call(parse_vote, "judge", reply, JudgeConfig(),
                                 size=len(reply) if isinstance(reply, str) else 0)
            assert vote.verdict in ("success", "failure", "invalid")
            assert len(vote.reason) <= 600
        run()


@pytest.mark.parametrize("n", [100])
def test_parse_lease_agent(n):
    """100 examples: user agents (the audit log's), with lease marks of odd numbers."""
    mark = st.builds(lambda a, f: f"consolerl-lease/{a}/{f}", digits, digits)
    with Probe("parse_lease_agent", seconds=0.5) as probe:
        @fuzz(n)
        @given(agent=st.builds(lambda a, m, b: a + m + b, anytext, mark, anytext) | anytext)
        def run(agent):
            parsed, _ = probe.call(parse_lease_agent, agent, size=len(agent))
            if parsed is not None:
                assert re.fullmatch(r"[0-9]{6,20}", parsed[0]) and parsed[1] >= 0
        run()
