"""The task suite as data: every file validates, and the suite has the promised shape."""
from __future__ import annotations

import importlib.util

import pytest
import yaml

from consolerl.errors import ConfigError
from datagen.oracle import FAMILIES
from consolerl.tasks import TASKS_DIR, load_suite, parse_task


def test_the_suite_validates_and_has_its_shape():
    tasks = load_suite(TASKS_DIR)
    assert len(tasks) >= 80
    assert {t.product for t in tasks} == {"ecs", "vpc", "ram", "oss"}
    assert sum(t.split == "heldout" for t in tasks) >= len(tasks) / 4
    assert sum(bool(t.prerequisites) for t in tasks) >= 10
    assert sum(bool(t.drift) for t in tasks) >= 10
    assert sum(t.expected == "infeasible" for t in tasks) >= 18
    for t in tasks:     # wrong-doc tasks too: their oracle walks to the page, then reports
        assert t.oracle_family in FAMILIES, t.id
    assert len({d for t in tasks for d in t.drift.split(",") if d}) >= 4


GOOD = yaml.safe_load((TASKS_DIR / "ram" / "ram-create-user-0.yaml").read_text())


@pytest.mark.parametrize("change,message", [
    ({"schema": 2}, "field 'schema' must be 1"),
    ({"product": "rds"}, "field 'product' must be one of"),
    ({"split": "test"}, "field 'split'"),
    ({"difficulty": 9}, "field 'difficulty'"),
    ({"start_page": "https://evil/"}, "field 'start_page'"),
    # The env worker's rule: dot segments resolved as a server reads them.
    ({"start_page": "/console/../metrics"}, "the env worker would refuse it"),
    ({"start_page": "/console/ram/../../openapi"}, "the env worker would refuse it"),
    ({"drift": "teleport"}, "field 'drift'"),
    ({"expected": "infeasible"}, "infeasible_reason"),
    ({"procedure": "Do it."}, "numbered steps"),
    ({"colour": "red"}, "unknown field"),
    ({"success": {"end_state": [{"service": "Ram", "action": "DeleteUser",
                                 "expect": {"a": "b"}}]}}, "must be a read action"),
    ({"success": {}}, "needs required_events or end_state"),
    ({"prerequisites": [{"id": "u", "type": "ram_user", "properties": {"name": "x"}}]},
     "must contain {episode}"),
])
def test_a_bad_task_names_the_file_and_field(change, message):
    with pytest.raises(ConfigError, match="tasks/x.yaml") as err:
        parse_task({**GOOD, **change}, "tasks/x.yaml")
    assert message in str(err.value)


def test_the_committed_suite_is_what_the_generator_writes():
    """The YAML is generated (``python tasks/generate.py``): a hand edit, or a family changed
    without regenerating, fails here."""
    spec = importlib.util.spec_from_file_location("tasks_generate", TASKS_DIR / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    files = generate.build()
    on_disk = {f"{p.parent.name}/{p.name}": p.read_text() for p in TASKS_DIR.glob("*/*.yaml")}
    assert sorted(files) == sorted(on_disk)
    stale = [name for name, text in files.items() if on_disk[name] != text]
    assert not stale, f"regenerate the suite: {stale[:5]}"


@pytest.mark.parametrize("path,console", [
    ("/console/ram/users", True), ("/console", True), ("/console/ram/../oss", True),
    ("/console/../metrics", False), ("/console/%2e%2e/metrics", False),
    ("/console/..%2fmetrics", False), ("/console\\..\\metrics", False),
    ("/console/%252e%252e/metrics", False), ("/metrics", False),
])
def test_one_console_path_rule_for_worker_and_validation(path, console):
    from consolerl.paths import is_console_path
    assert is_console_path(path) is console
