"""One exception hierarchy: every exception class the project defines derives from
:class:`consolerl.errors.ConsoleRLError`, and survives a pickle round trip (errors cross Ray
boundaries) as the same type with the same message and attributes.

The checks import every module of the project's packages and look at every ``BaseException``
subclass defined there, so a new ``class Foo(RuntimeError)`` anywhere fails here. A class
whose constructor takes more than one message string must have an entry in :data:`ARGS`
(representative values for every parameter); the tests at the bottom run the same checks on a
fixture package to show that each kind of mistake is caught and named.
"""
from __future__ import annotations

import importlib
import inspect
import pickle
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from tests.layers import LAYERS

from consolerl.errors import ConsoleRLError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = tuple(LAYERS)
# Modules not imported here, with the reason. None so far: vllm_server.py imports vLLM only
# inside functions, so it imports without vLLM installed.
SKIP_MODULES: dict[str, str] = {}
MESSAGE = "something went wrong: representative message"


def _env_error(kind: str, message: str):
    from consolerl.types import EnvError
    return EnvError(kind, message)


def _plan_rejected():
    from infra.provisioning.resource_coder import PlanRejected
    return PlanRejected("dry_run", "10.0.0.0/24 overlaps vSwitch ${vsw1}", "vsw2",
                        "properties.cidr_block", ("10.0.1.0/24", "10.0.2.0/24"), 2)


# "module.QualName" -> a function returning constructor args with a non-default value for every
# parameter. Needed for every class whose constructor is not a single message string.
ARGS: dict[str, Callable[[], tuple]] = {
    "doccheck.service.DocsInputError": lambda: (
        "page 'shot.md' is not text (binary content)", 1, "content", 422),
    "jobsapi.client.ApiError": lambda: (429, "your team has 3 queued jobs", 30.0),
    "consolerl.errors.CloudAPIError": lambda: (
        "InvalidVpcID.NotFound", "The specified VPC does not exist.", 404, "req-8F2A",
        "DescribeVSwitches"),
    "infra.llm.ChatError": lambda: (
        "http://127.0.0.1:9/v1/chat/completions: HTTP 503: overloaded", 503, "http"),
    "infra.console_sim.errors.CloudError": lambda: (
        "Forbidden.RAM", "User not authorized to operate on the specified resource.", 403),
    "infra.console_sim.console.core.BadRequest": lambda: (
        413, "The form is larger than 65536 bytes."),
    "infra.provisioning.resource_coder._Refused": lambda: (_plan_rejected(),),
    "infra.provisioning.sdk.ProvisionError": lambda: (
        "ep-0123456789abcdef", "vpc1", "QuotaExceeded.Vpc: too many VPCs"),
    "env_workers.leases.NoAccountAvailable": lambda: (
        "rollout-worker-3", 2.5, "4 accounts leased, 0 cooling down"),
    "env_workers.leases.LeaseLost": lambda: ("acct-07", 42, "taken over by rollout-worker-2"),
    "env_workers.actions.RefusedURLError": lambda: (
        "goto: only http:// and https:// URLs are allowed, not 'javascript:'",
        "javascript:alert(1)"),
    "rollout_service.episode._ActorGone": lambda: ("RESTARTING",),
    "rollout_service.episode._WorkerFailed": lambda: (
        _env_error("worker_failed", "env worker step failed: ActorDiedError: the actor died"),),
    "reward_service.service.ScoreRequestError": lambda: (
        "values", "task 'ram-create-user-0' needs a value for {user_name}"),
    "trainer.checkpoint.CheckpointCorrupt": lambda: (
        "/runs/r1/checkpoints/step-000010", "state.json is truncated"),
    "trainer.stream.StreamUnavailable": lambda: (
        "redis://:***@10.0.0.5:6379/0", 12.5, "ConnectionRefusedError: [Errno 111]"),
}


# ---- the checks (also run on fixture packages below) ----

def import_all(packages: Iterable[str], skip: dict[str, str]) -> dict[str, str]:
    """Import every module of ``packages``; returns {module: error} for those that failed."""
    import pkgutil

    failed: dict[str, str] = {}
    for name in packages:
        try:
            package = importlib.import_module(name)
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
            continue
        for info in pkgutil.walk_packages(package.__path__, name + ".",
                                          onerror=lambda n: failed.setdefault(n, "not walkable")):
            if info.name in skip:
                continue
            try:
                importlib.import_module(info.name)
            except Exception as exc:
                failed[info.name] = f"{type(exc).__name__}: {exc}"
    return failed


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _in(module: str, packages: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def project_exceptions(packages: Iterable[str]) -> list[type[BaseException]]:
    """Every loaded BaseException subclass (however deep, nested classes included) whose
    module is in ``packages``, sorted by name."""
    packages = tuple(packages)
    found: dict[str, type[BaseException]] = {}
    todo: list[type] = [BaseException]
    seen: set[type] = set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        if _in(cls.__module__, packages):
            found[qualname(cls)] = cls
    return [found[k] for k in sorted(found)]


def outside_hierarchy(classes: Iterable[type[BaseException]]) -> list[str]:
    return [f"{qualname(c)} (bases: {', '.join(b.__name__ for b in c.__bases__)}) does not "
            f"derive from consolerl.errors.ConsoleRLError; derive from it and the stdlib type "
            f"that fits" for c in classes if not issubclass(c, ConsoleRLError)]


def _custom_constructor(cls: type, packages: Iterable[str]) -> bool:
    """Whether a project class in ``cls``'s MRO defines ``__init__`` or ``__new__``."""
    return any(("__init__" in k.__dict__ or "__new__" in k.__dict__)
               for k in cls.__mro__ if _in(k.__module__, tuple(packages) + ("consolerl",)))


def build(cls: type[BaseException], args_table: dict[str, Callable[[], tuple]],
          packages: Iterable[str]) -> BaseException:
    """An instance of ``cls`` from the table, or from one message string; raises
    AssertionError naming the class when neither applies."""
    name = qualname(cls)
    if name in args_table:
        args = args_table[name]()
        try:
            bound = inspect.signature(cls).bind(*args)
        except TypeError as exc:
            raise AssertionError(f"{name}: the ARGS entry does not fit its constructor: "
                                 f"{exc}") from None
        missing = [p for p in inspect.signature(cls).parameters if p not in bound.arguments]
        if missing:
            raise AssertionError(f"{name}: the ARGS entry leaves parameter(s) {missing} at "
                                 f"their defaults; give every parameter a representative value")
        return cls(*args)
    if _custom_constructor(cls, packages):
        raise AssertionError(f"{name} has its own constructor but no entry in ARGS "
                             f"(tests/unit/test_exceptions.py): add representative arguments "
                             f"for every parameter")
    try:
        return cls(MESSAGE)
    except Exception as exc:
        raise AssertionError(f"{name} cannot be built from one message string "
                             f"({type(exc).__name__}: {exc}); add it to ARGS") from None


def _state(err: BaseException) -> dict:
    state = {"type": type(err), "str": str(err), "args": err.args, "dict": dict(vars(err))}
    if isinstance(err, OSError):
        state["oserror"] = (err.errno, err.strerror, err.filename, err.filename2)
    return state


def round_trip_problems(classes: Iterable[type[BaseException]],
                        args_table: dict[str, Callable[[], tuple]],
                        packages: Iterable[str]) -> list[str]:
    """For each class: what differs after a pickle round trip (plain pickle at the default
    and the highest protocol, and Ray's cloudpickle)."""
    from ray import cloudpickle

    dumpers = {"pickle": pickle.dumps,
               f"pickle protocol {pickle.HIGHEST_PROTOCOL}":
                   lambda o: pickle.dumps(o, pickle.HIGHEST_PROTOCOL),
               "cloudpickle": cloudpickle.dumps}
    problems: list[str] = []
    for cls in classes:
        name = qualname(cls)
        try:
            err = build(cls, args_table, packages)
        except AssertionError as exc:
            problems.append(str(exc))
            continue
        before = _state(err)
        for how, dump in dumpers.items():
            try:
                again = pickle.loads(dump(err))
            except Exception as exc:
                problems.append(f"{name}: {how} round trip raised {type(exc).__name__}: {exc} "
                                f"(a custom __init__ needs a __reduce__ returning its "
                                f"arguments, see CloudAPIError)")
                break
            after = _state(again)
            diff = {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
            if diff:
                problems.append(f"{name}: {how} round trip changed {diff}")
                break
    return problems


# ---- the project ----

@pytest.fixture(scope="module")
def imported() -> dict[str, str]:
    return import_all(PACKAGES, SKIP_MODULES)


@pytest.fixture(scope="module")
def classes(imported) -> list[type[BaseException]]:
    found = project_exceptions(PACKAGES)
    assert len(found) >= 20, [qualname(c) for c in found]   # the walk really found them
    return found


def test_every_project_module_imports(imported: dict[str, str]) -> None:
    assert not imported, ("modules that do not import (their exception classes go unchecked):"
                          "\n" + "\n".join(f"{m}: {e}" for m, e in sorted(imported.items())))


def test_every_exception_derives_from_console_rl_error(classes) -> None:
    bad = outside_hierarchy(classes)
    assert not bad, "\n".join(bad)


def test_every_exception_pickles_with_its_type_message_and_attributes(classes) -> None:
    problems = round_trip_problems(classes, ARGS, PACKAGES)
    assert not problems, "\n".join(problems)


def test_args_table_names_only_existing_classes(classes) -> None:
    names = {qualname(c) for c in classes}
    stale = sorted(set(ARGS) - names)
    assert not stale, f"ARGS entries for classes that no longer exist: {stale}"


def test_known_errors_still_catchable_as_their_stdlib_type() -> None:
    """The classes moved into the hierarchy keep the stdlib base callers catch them by."""
    from infra.console_sim.console.core import BadRequest
    from infra.provisioning.resource_coder import _Refused
    from reward_service.service import UnknownName
    from rollout_service.vllm_engine import EngineError
    from trainer.grpo import NoExperienceError

    assert issubclass(NoExperienceError, TimeoutError)
    assert issubclass(EngineError, RuntimeError)
    assert issubclass(UnknownName, LookupError)
    assert issubclass(BadRequest, ValueError)
    err = BadRequest(415, "Forms must be sent as application/x-www-form-urlencoded.")
    assert (err.status, err.message, str(err)) == (
        415, "Forms must be sent as application/x-www-form-urlencoded.",
        "Forms must be sent as application/x-www-form-urlencoded.")
    again = pickle.loads(pickle.dumps(_Refused(_plan_rejected())))
    assert again.rejection == _plan_rejected() and str(again) == str(_plan_rejected())


# ---- the checks on a fixture package: each mistake is caught and named ----

FIXTURE = '''
from consolerl.errors import ConsoleRLError


class Good(ConsoleRLError, RuntimeError):
    """Message only."""


class GoodWithArgs(ConsoleRLError, LookupError):
    def __reduce__(self):
        return (type(self), (self.key, self.where))

    def __init__(self, key: str, where: str):
        self.key = key
        self.where = where
        super().__init__(f"{key} not in {where}")


class Foo(RuntimeError):
    """Outside the hierarchy."""


class Holder:
    class Nested(Exception):
        """Outside the hierarchy, and not at module level."""


class NoReduce(ConsoleRLError, ValueError):
    """In the table, but its custom __init__ does not survive pickle."""

    def __init__(self, code: str, status: int):
        super().__init__(f"{code} ({status})")
        self.code, self.status = code, status


class LosesAttribute(ConsoleRLError):
    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail

    def __reduce__(self):
        return (type(self), (self.args[0],))


class NotInTable(ConsoleRLError):
    def __init__(self, a: int, b: int):
        super().__init__(f"{a} {b}")
        self.a, self.b = a, b

    def __reduce__(self):
        return (type(self), (self.a, self.b))
'''


@pytest.fixture
def fixture_package(tmp_path: Path, monkeypatch) -> Iterable[str]:
    # a fresh name per test: classes of an earlier import linger in __subclasses__()
    name = f"exc_fixture_{uuid.uuid4().hex[:12]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "errors.py").write_text(textwrap.dedent(FIXTURE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def test_checks_catch_a_class_outside_the_hierarchy(fixture_package: str) -> None:
    assert import_all([fixture_package], {}) == {}
    found = {c.__qualname__: c for c in project_exceptions([fixture_package])}
    assert set(found) == {"Good", "GoodWithArgs", "Foo", "Holder.Nested", "NoReduce",
                          "LosesAttribute", "NotInTable"}
    bad = outside_hierarchy(found.values())
    assert [b.split(" ")[0] for b in bad] == [f"{fixture_package}.errors.Foo",
                                               f"{fixture_package}.errors.Holder.Nested"]
    assert "(bases: RuntimeError)" in bad[0]


def test_checks_catch_pickle_and_constructor_problems(fixture_package: str) -> None:
    import_all([fixture_package], {})
    classes = project_exceptions([fixture_package])
    prefix = f"{fixture_package}.errors."
    table = {prefix + "GoodWithArgs": lambda: ("k", "the map"),
             prefix + "NoReduce": lambda: ("Throttling", 429),
             prefix + "LosesAttribute": lambda: ("lost", "the detail")}
    problems = round_trip_problems(classes, table, [fixture_package])
    by_class = {p.split(":")[0].split(" ")[0]: p for p in problems}
    assert set(by_class) == {prefix + "NoReduce", prefix + "LosesAttribute",
                             prefix + "NotInTable"}, problems
    assert "round trip raised TypeError" in by_class[prefix + "NoReduce"]
    assert "'detail'" in by_class[prefix + "LosesAttribute"]
    assert "no entry in ARGS" in by_class[prefix + "NotInTable"]

    # a table entry that leaves a parameter at its default, or does not fit, is named too
    table[prefix + "LosesAttribute"] = lambda: ("lost",)
    table[prefix + "NotInTable"] = lambda: (1, 2, 3)
    problems = round_trip_problems(classes, table, [fixture_package])
    assert any("LosesAttribute: the ARGS entry leaves parameter(s) ['detail']" in p
               for p in problems), problems
    assert any("NotInTable: the ARGS entry does not fit its constructor" in p
               for p in problems), problems
