"""The import-layering checker (issue 20): the top-level packages form layers and each imports
only from layers below it.

    consolerl (0) -> infra (1) -> env_workers, reward_service (2, siblings) -> rollout_service (3)
    -> trainer (4) -> cluster (5)

``benchmarks`` and ``tests`` stand outside the layers: they may import anything, and nothing in
a layer may import them.

The check reads source only (``ast``), never imports the code under test. It sees every
``import a.b`` and ``from a.b import c`` at any depth (module level, in a function, under
``if TYPE_CHECKING:`` -- a type-only upward import is still an upward dependency), resolves
relative imports against the file's package, and also counts ``importlib.import_module("x")`` and
``__import__("x")`` with a literal name. ``runpy.run_module("cluster.job")`` runs a module as a
program and is not an import (``trainer/main.py`` and ``trainer/evaluate.py`` forward that way).

A relative import that climbs past its own top-level package (``from ...infra import x`` in
``consolerl/sub/m.py``) is reported whatever its target: it fails at run time ("attempted
relative import beyond top-level package") and would hide a cross-package import from a reader.

Lives in ``tests/`` on purpose: no service package depends on it.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

LAYERS: dict[str, int] = {
    "consolerl": 0,
    "infra": 1,
    "env_workers": 2,
    "reward_service": 2,
    "rollout_service": 3,
    "trainer": 4,
    "cluster": 5,
}
OUTSIDE: frozenset[str] = frozenset({"benchmarks", "tests"})
_SKIP_DIRS = frozenset({"__pycache__", "node_modules"})


@dataclass(frozen=True)
class Violation:
    path: str           # relative to the root, with forward slashes
    line: int
    importer: str       # the importing file's top-level package
    imported: str       # the absolute module name imported
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def _where(package: str) -> str:
    if package in LAYERS:
        return f"layer {LAYERS[package]}"
    if package in OUTSIDE:
        return "outside the layers"
    return "in no layer"


def _local_packages(root: Path) -> set[str]:
    """Top-level names that belong to this project: the known ones plus every folder or module at
    the root holding Python source (so a layer importing, say, ``tasks`` is caught too)."""
    names = set(LAYERS) | set(OUTSIDE)
    for entry in root.iterdir():
        if entry.name.startswith(".") or entry.name in _SKIP_DIRS:
            continue
        if entry.is_file() and entry.suffix == ".py":
            names.add(entry.stem)
        elif entry.is_dir() and entry.name.isidentifier() and any(_py_files(entry)):
            names.add(entry.name)
    return names


def _py_files(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).parts
        if any(p.startswith(".") or p in _SKIP_DIRS for p in rel[:-1]):
            continue
        yield path


def _module_parts(rel: Path) -> tuple[list[str], bool]:
    """The dotted name of a file (``infra/cloud/client.py`` -> infra.cloud.client) and whether it
    is a package's ``__init__``."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        return parts[:-1], True
    return parts, False


def _resolve_relative(module_parts: list[str], is_init: bool, level: int,
                      name: str | None) -> tuple[str, bool]:
    """Absolute name of ``from <level dots><name> import ...``; the flag says the climb went past
    the file's top-level package (the result is then the name the dots point at from the root)."""
    package = module_parts if is_init else module_parts[:-1]
    keep = len(package) - (level - 1)
    escaped = keep < 1
    base = package[:max(keep, 0)]
    full = base + (name.split(".") if name else [])
    return ".".join(full), escaped


def _literal_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _call_imports(node: ast.Call) -> tuple[str, str | None] | None:
    """``importlib.import_module("x", package=...)`` / ``import_module(...)`` /
    ``__import__("x")`` with a literal name: (name, literal package or None)."""
    func = node.func
    fname = func.attr if isinstance(func, ast.Attribute) else (
        func.id if isinstance(func, ast.Name) else None)
    if fname not in {"import_module", "__import__"} or not node.args:
        return None
    name = _literal_str(node.args[0])
    if name is None:
        return None
    package = None
    if fname == "import_module":
        if len(node.args) > 1:
            package = _literal_str(node.args[1])
        for kw in node.keywords:
            if kw.arg == "package":
                package = _literal_str(kw.value)
    return name, package


def _imports(tree: ast.AST, module_parts: list[str], is_init: bool):
    """Yield (line, absolute module name, escaped_top_level) for every import in the tree."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, False
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                name, escaped = _resolve_relative(module_parts, is_init, node.level, node.module)
                yield node.lineno, name, escaped
            elif node.module:
                yield node.lineno, node.module, False
        elif isinstance(node, ast.Call):
            found = _call_imports(node)
            if found is None:
                continue
            name, package = found
            if name.startswith("."):
                if package is None:
                    continue      # relative to a package we cannot know statically
                level = len(name) - len(name.lstrip("."))
                rest = name[level:] or None
                pkg_parts = package.split(".")
                resolved, escaped = _resolve_relative(pkg_parts, True, level, rest)
                yield node.lineno, resolved, escaped
            else:
                yield node.lineno, name, False


def _allowed(importer: str, target: str) -> bool:
    if target == importer:
        return True
    if target in OUTSIDE or target not in LAYERS:
        return False
    return LAYERS[target] < LAYERS[importer]


def check_source(source: str | bytes, rel_path: str, local: set[str] | None = None
                 ) -> list[Violation]:
    """Violations in one file, given its path relative to the root (``infra/a.py``)."""
    rel = Path(rel_path)
    module_parts, is_init = _module_parts(rel)
    importer = module_parts[0] if module_parts else ""
    if importer not in LAYERS:
        return []          # benchmarks/, tests/ and anything else may import anything
    local = set(LAYERS) | set(OUTSIDE) if local is None else local
    path = rel.as_posix()
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        return [Violation(path, exc.lineno or 0, importer, "",
                          f"cannot parse ({exc.msg}), so its imports cannot be checked")]
    out: list[Violation] = []
    for line, name, escaped in _imports(tree, module_parts, is_init):
        target = name.split(".")[0]
        if escaped:
            out.append(Violation(
                path, line, importer, name,
                f"{importer} ({_where(importer)}) has a relative import that climbs out of its "
                f"package to {name or '<root>'}; import across packages absolutely"))
        elif target in local and not _allowed(importer, target):
            sibling = ", a sibling" if target in LAYERS and LAYERS[target] == LAYERS[importer] else ""
            out.append(Violation(
                path, line, importer, name,
                f"{importer} ({_where(importer)}) imports {name} ({_where(target)}{sibling})"))
    return out


def check_tree(root: str | Path) -> list[Violation]:
    """Every layering violation under ``root``, sorted by path and line."""
    root = Path(root)
    local = _local_packages(root)
    out: list[Violation] = []
    for package in LAYERS:
        folder = root / package
        if not folder.is_dir():
            continue
        for path in _py_files(folder):
            rel = path.relative_to(root).as_posix()
            out.extend(check_source(path.read_bytes(), rel, local))
    return sorted(out, key=lambda v: (v.path, v.line, v.imported))
