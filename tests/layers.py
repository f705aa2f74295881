"""The import-layering checker: the top-level packages form layers and each imports only from
layers below it; and no modules of the project import each other in a circle.

    consolerl (0) -> infra (1) -> env_workers, reward_service (2, siblings) -> rollout_service (3)
    -> doccheck (4) -> datagen, trainer (5, siblings) -> jobsapi (6) -> cluster (7)

A sealed package (:data:`SEALED`: the documentation checker) is imported from other layers by
its own name only (``from doccheck import DocsService``), never by its modules.

``benchmarks`` and ``tests`` stand outside the layers: they may import anything, and nothing in
a layer may import them.

The check reads source only (``ast``), never imports the code under test. It sees every
``import a.b`` and ``from a.b import c`` at any depth (module level, in a function, under
``if TYPE_CHECKING:`` -- a type-only upward import is still an upward dependency), resolves
relative imports against the file's package, and also counts, with a literal module name,
``importlib.import_module("x")`` / ``import_module("x")``, ``__import__("x")`` and
``runpy.run_module("x")`` / ``run_module("x")``. Running a module through runpy is a dependency
like an import: a ``trainer`` module that runs ``cluster.job`` needs the layer above it to be
there, so a lower layer may not forward to a higher one that way either. (A name that is not a
literal, and ``runpy.run_path``, which takes a file, cannot be known statically and are not
counted.)

A relative import that climbs past its own top-level package (``from ...infra import x`` in
``consolerl/sub/m.py``) is reported whatever its target: it fails at run time ("attempted
relative import beyond top-level package") and would hide a cross-package import from a reader.

Import cycles (:func:`import_cycles`): the graph has one node per module of the project (every
``.py`` file under the project's top-level folders, ``benchmarks`` and ``tests`` included) and an
edge for every import counted above, wherever it sits. An import inside a function does not
break a circle: it only delays it to run time (as ``if TYPE_CHECKING:`` only hides it from the
interpreter); the two modules still depend on each other and neither can be read, tested or
moved without the other. A circle is broken by moving what both need into a module both
import. An edge goes to the module named (``from a.b import c`` to ``a.b.c`` when that is a
module, else to ``a.b``), not to the packages around it that Python also initialises.

Lives in ``tests/`` on purpose: no service package depends on it.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LAYERS: dict[str, int] = {
    "consolerl": 0,
    "infra": 1,
    "env_workers": 2,
    "reward_service": 2,
    "rollout_service": 3,
    "doccheck": 4,
    "datagen": 5,
    "trainer": 5,
    "jobsapi": 6,
    "cluster": 7,
}
OUTSIDE: frozenset[str] = frozenset({"benchmarks", "tests"})
# Packages whose modules are theirs alone: another layer imports only the package itself (its
# ``__init__`` is the public surface), never ``doccheck.check`` and the like.
SEALED: frozenset[str] = frozenset({"doccheck"})
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


_IMPORTERS = frozenset({"import_module", "__import__", "run_module"})


@dataclass(frozen=True)
class _Import:
    line: int
    module: str         # absolute
    escaped: bool       # a relative import that climbed past the file's top-level package
    verb: str           # "imports", or "runs" (runpy)
    names: tuple[str, ...] = ()     # ``from module import names``


def _call_imports(node: ast.Call) -> tuple[str, str | None, str] | None:
    """``importlib.import_module("x", package=...)`` / ``import_module(...)`` /
    ``__import__("x")`` / ``runpy.run_module("x")`` with a literal name: (name, literal package
    or None, verb)."""
    func = node.func
    fname = func.attr if isinstance(func, ast.Attribute) else (
        func.id if isinstance(func, ast.Name) else None)
    if fname not in _IMPORTERS:
        return None
    first = node.args[0] if node.args else next(
        (kw.value for kw in node.keywords if kw.arg in ("name", "mod_name")), None)
    name = _literal_str(first)
    if name is None:
        return None
    package = None
    if fname == "import_module":
        if len(node.args) > 1:
            package = _literal_str(node.args[1])
        for kw in node.keywords:
            if kw.arg == "package":
                package = _literal_str(kw.value)
    return name, package, "runs" if fname == "run_module" else "imports"


def _imports(tree: ast.AST, module_parts: list[str], is_init: bool) -> Iterator[_Import]:
    """Every import in the tree, wherever it sits."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield _Import(node.lineno, alias.name, False, "imports")
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names if a.name != "*")
            if node.level:
                name, escaped = _resolve_relative(module_parts, is_init, node.level, node.module)
                yield _Import(node.lineno, name, escaped, "imports", names)
            elif node.module:
                yield _Import(node.lineno, node.module, False, "imports", names)
        elif isinstance(node, ast.Call):
            found = _call_imports(node)
            if found is None:
                continue
            name, package, verb = found
            if name.startswith("."):
                if package is None:
                    continue      # relative to a package we cannot know statically
                level = len(name) - len(name.lstrip("."))
                rest = name[level:] or None
                pkg_parts = package.split(".")
                resolved, escaped = _resolve_relative(pkg_parts, True, level, rest)
                yield _Import(node.lineno, resolved, escaped, verb)
            else:
                yield _Import(node.lineno, name, False, verb)


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
    for imp in _imports(tree, module_parts, is_init):
        line, name = imp.line, imp.module
        target = name.split(".")[0]
        if imp.escaped:
            out.append(Violation(
                path, line, importer, name,
                f"{importer} ({_where(importer)}) has a relative import that climbs out of its "
                f"package to {name or '<root>'}; import across packages absolutely"))
        elif target in SEALED and target != importer and name != target:
            out.append(Violation(
                path, line, importer, name,
                f"{importer} imports {name}, an internal module of {target}; import what it "
                f"needs from {target} itself (its public surface)"))
        elif target in local and not _allowed(importer, target):
            sibling = ", a sibling" if target in LAYERS and LAYERS[target] == LAYERS[importer] else ""
            how = " through runpy" if imp.verb == "runs" else ""
            out.append(Violation(
                path, line, importer, name,
                f"{importer} ({_where(importer)}) {imp.verb} {name} ({_where(target)}{sibling})"
                f"{how}"))
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


# ---- import cycles ----

@dataclass(frozen=True)
class Cycle:
    """Modules that import each other in a circle (a strongly connected set) and the imports
    that join them: ``(path, line, imported module)``, sorted."""

    modules: tuple[str, ...]
    edges: tuple[tuple[str, int, str], ...]

    def __str__(self) -> str:
        joins = "; ".join(f"{path}:{line} -> {target}" for path, line, target in self.edges)
        return f"import cycle between {', '.join(self.modules)}: {joins}"


def _project_modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``), for every project file."""
    modules: dict[str, tuple[Path, bool]] = {}
    for package in sorted(_local_packages(root)):
        top, single = root / package, root / f"{package}.py"
        files = _py_files(top) if top.is_dir() else [single] if single.is_file() else []
        for path in files:
            parts, is_init = _module_parts(path.relative_to(root))
            modules[".".join(parts)] = (path, is_init)
    return modules


def _target(imp: _Import, modules: dict[str, tuple[Path, bool]]) -> list[str]:
    """The project modules one import statement names (several for ``from pkg import a, b``
    when a and b are modules)."""
    subs = [f"{imp.module}.{n}" if imp.module else n for n in imp.names]
    found = [m for m in subs if m in modules]
    if found and len(found) == len(subs):
        return found
    parts = imp.module.split(".")
    for k in range(len(parts), 0, -1):
        name = ".".join(parts[:k])
        if name in modules:
            return found + [name]
    return found


def import_graph(root: str | Path) -> dict[str, dict[str, tuple[str, int]]]:
    """module -> {imported project module: (path, line) of the first import of it}."""
    root = Path(root)
    modules = _project_modules(root)
    graph: dict[str, dict[str, tuple[str, int]]] = {}
    for module, (path, is_init) in modules.items():
        rel = path.relative_to(root).as_posix()
        edges: dict[str, tuple[str, int]] = {}
        try:
            tree = ast.parse(path.read_bytes(), filename=rel)
        except SyntaxError:
            tree = ast.Module(body=[], type_ignores=[])     # check_tree reports it
        for imp in _imports(tree, module.split("."), is_init):
            if imp.escaped:
                continue
            for target in _target(imp, modules):
                if target != module and (target not in edges or imp.line < edges[target][1]):
                    edges[target] = (rel, imp.line)
        graph[module] = edges
    return graph


def _strongly_connected(graph: dict[str, dict[str, tuple[str, int]]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


def import_cycles(root: str | Path) -> list[Cycle]:
    """Every import cycle between the project's modules under ``root`` (see the module's
    docstring for what counts as an import), sorted."""
    graph = import_graph(root)
    cycles = []
    for component in _strongly_connected(graph):
        if len(component) < 2:
            continue
        members = set(component)
        edges = sorted((path, line, target) for module in component
                       for target, (path, line) in graph[module].items() if target in members)
        cycles.append(Cycle(tuple(component), tuple(edges)))
    return sorted(cycles, key=lambda c: c.modules)
