"""Imports only go down the layers and no modules import each other in a circle: the real tree
is clean (the former circles ``benchmarks.scale`` <-> ``benchmarks.scale_calibrate`` and
``cluster.serve`` <-> ``cluster.serve_app`` included), and the checker itself catches every kind
of upward import, runpy forward and cycle on small fixture trees."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.layers import (LAYERS, Cycle, Violation, check_source, check_tree,
                          import_cycles)

ROOT = Path(__file__).resolve().parents[2]


def test_repository_imports_only_go_down() -> None:
    assert (ROOT / "consolerl").is_dir() and (ROOT / "cluster").is_dir(), ROOT
    violations = check_tree(ROOT)
    assert not violations, "imports against the layer order:\n" + "\n".join(map(str, violations))


def test_repository_has_no_import_cycles() -> None:
    cycles = import_cycles(ROOT)
    assert not cycles, "modules importing each other:\n" + "\n".join(map(str, cycles))


@pytest.mark.parametrize("pair", [("benchmarks.scale", "benchmarks.scale_calibrate"),
                                  ("cluster.serve", "cluster.serve_app")])
def test_the_former_circles_are_gone(pair: tuple[str, str]) -> None:
    together = [c for c in import_cycles(ROOT) if set(pair) <= set(c.modules)]
    assert not together, str(together[0])


# ---- the checker on fixture trees ----

def make_tree(root: Path, files: dict[str, str]) -> Path:
    """Every layer package with an ``__init__.py``, plus ``files`` (path -> source)."""
    for package in LAYERS:
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    for rel, source in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.parent != root and not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
        path.write_text(textwrap.dedent(source))
    return root


def only(violations: list[Violation]) -> Violation:
    assert len(violations) == 1, [str(v) for v in violations]
    return violations[0]


def only_cycle(cycles: list[Cycle]) -> Cycle:
    assert len(cycles) == 1, [str(c) for c in cycles]
    return cycles[0]


def test_clean_tree_passes(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "consolerl/types.py": "import os\nfrom dataclasses import dataclass\n",
        "infra/cloud.py": "from consolerl.types import X\nimport consolerl\n",
        "infra/sub/deep.py": "from ..cloud import Y\nfrom . import other\nfrom .. import cloud\n",
        "env_workers/worker.py": "from infra.cloud import Y\nimport consolerl.types\n",
        "reward_service/service.py": "from infra import cloud\nfrom consolerl import types\n",
        "rollout_service/orch.py": "import env_workers.worker\nfrom reward_service import service\n",
        "trainer/algo.py": "from rollout_service.orch import O\nimport torch\n",
        "cluster/job.py": "import trainer.algo, rollout_service, env_workers, infra, consolerl\n",
    })
    assert check_tree(root) == []


def test_upward_import_names_file_and_line(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"infra/a.py": "import os\n\nfrom trainer.b import x\n"})
    v = only(check_tree(root))
    assert (v.path, v.line, v.importer, v.imported) == ("infra/a.py", 3, "infra", "trainer.b")
    assert str(v) == "infra/a.py:3: infra (layer 1) imports trainer.b (layer 5)"


def test_plain_import_statement_upward(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"consolerl/x.py": "import os, cluster.job as job\n"})
    v = only(check_tree(root))
    assert (v.path, v.line, v.imported) == ("consolerl/x.py", 1, "cluster.job")


def test_sibling_import_fails(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "env_workers/pool.py": "from reward_service.rules import evaluate\n",
        "reward_service/service.py": "import env_workers\n",
    })
    got = {(v.path, v.line, v.imported) for v in check_tree(root)}
    assert got == {("env_workers/pool.py", 1, "reward_service.rules"),
                   ("reward_service/service.py", 1, "env_workers")}
    assert all("sibling" in v.message for v in check_tree(root))


def test_relative_import_climbing_out_of_its_package_fails(tmp_path: Path) -> None:
    # consolerl/sub/m.py is module consolerl.sub.m: ``..`` is consolerl, ``...`` is past it.
    root = make_tree(tmp_path, {"consolerl/sub/m.py": "from . import sibling\n"
                                                      "from ..types import T\n"
                                                      "from ...infra import cloud\n"})
    v = only(check_tree(root))
    assert (v.path, v.line, v.imported) == ("consolerl/sub/m.py", 3, "infra")
    assert "climbs out of its package" in v.message


def test_relative_import_resolved_against_the_package(tmp_path: Path) -> None:
    # In a package's __init__.py one dot is the package itself; the resolved names are absolute.
    root = make_tree(tmp_path, {"infra/sub/__init__.py": "from .cloud import C\nfrom .. import x\n",
                                "infra/sub/cloud.py": "from ...cluster import job\n"})
    v = only(check_tree(root))
    assert (v.path, v.line, v.imported) == ("infra/sub/cloud.py", 1, "cluster")


def test_function_local_upward_import_fails(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"rollout_service/orch.py": """\
        import consolerl

        class Orchestrator:
            def run(self):
                if True:
                    from trainer.algo import advantages
                return advantages
        """})
    v = only(check_tree(root))
    assert (v.path, v.line, v.imported) == ("rollout_service/orch.py", 6, "trainer.algo")


def test_type_checking_upward_import_fails(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"env_workers/w.py": """\
        from __future__ import annotations
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from rollout_service.agent import Turn
        """})
    v = only(check_tree(root))
    assert (v.path, v.line, v.imported) == ("env_workers/w.py", 4, "rollout_service.agent")


@pytest.mark.parametrize("source, line, imported", [
    ("import importlib\nm = importlib.import_module('cluster.job')\n", 2, "cluster.job"),
    ("from importlib import import_module\nm = import_module('trainer')\n", 2, "trainer"),
    ("import importlib as il\nm = il.import_module('.job', package='cluster')\n", 2,
     "cluster.job"),
    ("m = __import__('rollout_service.orch', fromlist=['x'])\n", 1, "rollout_service.orch"),
])
def test_dynamic_import_with_literal_name_fails(tmp_path: Path, source: str, line: int,
                                                imported: str) -> None:
    root = make_tree(tmp_path, {"infra/dyn.py": source})
    v = only(check_tree(root))
    assert (v.path, v.line, v.imported) == ("infra/dyn.py", line, imported)


def test_dynamic_import_downward_or_unknown_passes(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"trainer/dyn.py": """\
        import importlib
        importlib.import_module("infra.cloud")
        __import__("json")
        name = "cluster.job"
        importlib.import_module(name)          # not a literal: cannot be known statically
        """})
    assert check_tree(root) == []


def test_layer_importing_benchmarks_or_tests_fails(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "benchmarks/x.py": "",
        "cluster/job.py": "from benchmarks.x import run\nimport tests.conftest\n",
    })
    got = [(v.path, v.line, v.imported) for v in check_tree(root)]
    assert got == [("cluster/job.py", 1, "benchmarks.x"), ("cluster/job.py", 2, "tests.conftest")]
    assert "outside the layers" in check_tree(root)[0].message


def test_layer_importing_an_unlayered_project_folder_fails(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"tasks/generate.py": "", "trainer/t.py": "import tasks.generate\n"})
    v = only(check_tree(root))
    assert (v.path, v.imported) == ("trainer/t.py", "tasks.generate")
    assert "in no layer" in v.message


def test_benchmarks_and_tests_may_import_anything(tmp_path: Path) -> None:
    everything = "import cluster.job, trainer, rollout_service, env_workers, reward_service\n" \
                 "from infra import cloud\nfrom consolerl import types\nimport tests.conftest\n"
    root = make_tree(tmp_path, {
        "benchmarks/rollout.py": everything,
        "tests/conftest.py": everything,
        "tests/unit/test_x.py": everything + "def f():\n    from cluster.job import main\n",
    })
    assert check_tree(root) == []


@pytest.mark.parametrize("source", [
    "import runpy\nif __name__ == '__main__':\n"
    "    runpy.run_module('cluster.job', run_name='__main__', alter_sys=True)\n",
    "from runpy import run_module\nif __name__ == '__main__':\n"
    "    run_module('cluster.job', run_name='__main__')\n",
    "import runpy\nif __name__ == '__main__':\n    runpy.run_module(mod_name='cluster.job')\n",
])
def test_runpy_forward_up_the_layers_fails(tmp_path: Path, source: str) -> None:
    root = make_tree(tmp_path, {"trainer/main.py": source})
    v = only(check_tree(root))
    assert (v.path, v.line, v.imported) == ("trainer/main.py", 3, "cluster.job")
    assert v.message == "trainer (layer 5) runs cluster.job (layer 7) through runpy"


def test_runpy_forward_down_or_unknown_passes(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"cluster/old.py": """\
        import runpy
        runpy.run_module("trainer.main", run_name="__main__")
        name = "cluster.job"
        runpy.run_module(name)                 # not a literal: cannot be known statically
        runpy.run_path("cluster/job.py")       # a file, not a module name
        """})
    assert check_tree(root) == []


def test_unparsable_file_is_reported(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {"infra/broken.py": "def f(:\n"})
    v = only(check_tree(root))
    assert v.path == "infra/broken.py" and "cannot parse" in v.message


def test_check_source_needs_no_tree() -> None:
    assert check_source("from cluster import job\n", "trainer/x.py")[0].imported == "cluster"
    assert check_source("from cluster import job\n", "benchmarks/x.py") == []


# ---- import cycles on fixture trees ----

def test_clean_tree_has_no_cycles(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "consolerl/types.py": "import os\n",
        "infra/cloud.py": "from consolerl.types import X\nfrom consolerl import types\n",
        "infra/__init__.py": "from infra.cloud import Cloud\n",      # the package's own
        "benchmarks/model.py": "from infra.cloud import Cloud\n",
        "benchmarks/bench.py": "from benchmarks.model import M\n"
                               "def main():\n    from benchmarks import calibrate\n",
        "benchmarks/calibrate.py": "from benchmarks.model import M\n",
    })
    assert import_cycles(root) == []


def test_a_cycle_through_function_local_imports_is_flagged(tmp_path: Path) -> None:
    # The former benchmarks.scale <-> scale_calibrate circle: both halves inside functions.
    root = make_tree(tmp_path, {
        "benchmarks/bench.py": "import os\n\ndef main():\n    from benchmarks.calibrate import c\n",
        "benchmarks/calibrate.py": "def c():\n    from benchmarks.bench import TASKS\n",
    })
    cycle = only_cycle(import_cycles(root))
    assert cycle.modules == ("benchmarks.bench", "benchmarks.calibrate")
    assert cycle.edges == (("benchmarks/bench.py", 4, "benchmarks.calibrate"),
                           ("benchmarks/calibrate.py", 2, "benchmarks.bench"))
    assert str(cycle) == ("import cycle between benchmarks.bench, benchmarks.calibrate: "
                          "benchmarks/bench.py:4 -> benchmarks.calibrate; "
                          "benchmarks/calibrate.py:2 -> benchmarks.bench")


def test_a_longer_cycle_through_from_imports_of_submodules_is_flagged(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "cluster/a.py": "from cluster import b\n",
        "cluster/b.py": "from . import c\n",
        "cluster/c.py": "import importlib\nimportlib.import_module('cluster.a')\n",
        "cluster/d.py": "from cluster import a, b, c\n",          # into the circle, not on it
    })
    cycle = only_cycle(import_cycles(root))
    assert cycle.modules == ("cluster.a", "cluster.b", "cluster.c")
    assert [e[2] for e in cycle.edges] == ["cluster.b", "cluster.c", "cluster.a"]


def test_a_type_checking_or_runpy_edge_closes_a_cycle_too(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "rollout_service/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from rollout_service.b import B\n",
        "rollout_service/b.py": "import runpy\nrunpy.run_module('rollout_service.a')\n",
    })
    assert only_cycle(import_cycles(root)).modules == ("rollout_service.a", "rollout_service.b")


def test_a_sealed_package_is_imported_by_its_name_only(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {
        "doccheck/__init__.py": "from .check import run\n",
        "doccheck/check.py": "from .model import M\n",
        "doccheck/model.py": "M = 1\n",
        "jobsapi/ok.py": "from doccheck import run\n",
        "jobsapi/bad.py": "from doccheck.check import run\n",
        "benchmarks/inside.py": "from doccheck.model import M\n",
    })
    v = only(check_tree(root))
    assert v.path == "jobsapi/bad.py" and "internal module of doccheck" in v.message
