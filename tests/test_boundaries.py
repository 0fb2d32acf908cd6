"""The layering contract of DESIGN.md, checked on the syntax tree: engine never imports Qt
or app; app never imports mlx; placement does no I/O.

Imports are followed through modules: what a file imports anywhere (in a function too),
and from there everything those modules import when they load (their top-level imports,
outside `if TYPE_CHECKING:`), so a ban can't be dodged by one module in between."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = ("engine", "app")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _file_of(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _names(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The modules an import statement loads (a `from X import y` may name submodule X.y)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:  # relative: from the importing module's package
        pkg = module.split(".")
        pkg = pkg[:len(pkg) - node.level + (1 if _file_of(module).name == "__init__.py"
                                             else 0)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [base] + [f"{base}.{a.name}" for a in node.names
                     if _file_of(f"{base}.{a.name}") is not None]


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _load_time(body: list[ast.stmt], module: str) -> list[str]:
    """Imports that run when the module loads: top level, in if/try/with/class bodies, but
    not in functions nor under `if TYPE_CHECKING:`."""
    out: list[str] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out += _names(node, module)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node):
                out += _load_time(node.body, module)
            out += _load_time(node.orelse, module)
        elif isinstance(node, (ast.Try, ast.With, ast.ClassDef)):
            for part in ("body", "orelse", "finalbody"):
                out += _load_time(getattr(node, part, []), module)
            for h in getattr(node, "handlers", []):
                out += _load_time(h.body, module)
    return out


def _anywhere(path: Path) -> list[str]:
    module = _module_name(path)
    return [n for node in ast.walk(_tree(path)) if isinstance(node, (ast.Import, ast.ImportFrom))
            for n in _names(node, module)]


@functools.cache
def _loads(module: str) -> frozenset[str]:
    """Every module loading `module` loads, itself and its packages included."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        parts = m.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c loads a and a.b first
            name = ".".join(parts[:i])
            if name in seen:
                continue
            seen.add(name)
            path = _file_of(name) if parts[0] in OURS else None
            if path is not None:
                todo += _load_time(_tree(path).body, name)
    return frozenset(seen)


def _offenders(package: str, banned: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        reached = set().union(*(_loads(m) for m in _anywhere(path)))
        bad = sorted(m for m in reached if m.split(".")[0] in banned)
        if bad:
            out.append(f"{path.relative_to(ROOT)}: {', '.join(bad)}")
    return out


def test_engine_never_imports_qt_or_the_app():
    assert _offenders("engine", ("PySide6", "pyqtgraph", "app", "shiboken6")) == []


def test_app_never_imports_mlx():
    assert _offenders("app", ("mlx", "mlx_lm")) == []


IO_MODULES = ("os", "io", "pathlib", "socket", "subprocess", "shutil", "tempfile", "aiohttp",
              "httpx", "urllib", "mlx", "mlx_lm")
IO_NAMES = {"open", "Path", "input", "print"}


def test_placement_is_pure():
    assert _offenders("engine/placement", IO_MODULES) == []
    # ... and calls no I/O through names it didn't import (builtins, attributes)
    found = []
    for path in sorted((ROOT / "engine/placement").rglob("*.py")):
        for node in ast.walk(_tree(path)):
            name = node.id if isinstance(node, ast.Name) else \
                node.attr if isinstance(node, ast.Attribute) else None
            if name in IO_NAMES or name in IO_MODULES or \
                    name in ("read_text", "read_bytes", "write_text", "write_bytes"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert found == []


def test_the_walk_follows_imports_through_modules():
    # engine.node.server loads aiohttp through its own imports and engine.api.common's
    assert "aiohttp" in _loads("engine.node.server")
    assert "engine.api.common" in _loads("engine.node.server")


def _import_graph() -> dict[str, set[str]]:
    """Our modules and the modules of ours each imports anywhere (functions included,
    `if TYPE_CHECKING:` not: it never runs)."""
    graph: dict[str, set[str]] = {}
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = _module_name(path)
            skip = {id(n) for node in ast.walk(_tree(path))
                    if isinstance(node, ast.If) and _is_type_checking(node)
                    for n in ast.walk(node)}
            graph[module] = {name for node in ast.walk(_tree(path)) if id(node) not in skip
                             and isinstance(node, (ast.Import, ast.ImportFrom))
                             for name in _names(node, module)
                             if name.split(".")[0] in OURS and _file_of(name) and name != module
                             and not module.startswith(name + ".")}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that reach each other (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_its_way_back_to_itself():
    """No circles, not even through an import inside a function: each module can be read
    knowing only what it imports."""
    assert _circles(_import_graph()) == []


def test_the_circle_check_sees_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Folder order, bottom to top: a module imports only from its own floor or below (anywhere
# in it, functions included; `if TYPE_CHECKING:` aside). Top-level modules of engine/ are
# named alone; a folder stands for everything in it.
FLOORS: list[tuple[str, ...]] = [
    ("engine", "engine.errors", "engine.words", "engine.paths", "engine.logs", "engine.net",
     "engine.durations", "engine.modelconfig"),  # the basics: no engine import but these
    ("engine.platform",),  # what this machine is: device, BLAS, memory rule, probes
    ("engine.records", "engine.protocol"),  # the shared vocabulary
    ("engine.placement", "engine.placement_profiles"),  # pure planning
    ("engine.cluster", "engine.cluster_records", "engine.hub", "engine.telemetry"),
    ("engine.runtime",),  # the worker
    ("engine.api",),  # one adapter per wire protocol
    ("engine.node",),  # the daemon
    ("engine.cli", "engine.client", "engine.connect", "engine.connect_files",
     "engine.connect_fit", "engine.connect_jsonc", "engine.placement_cli",
     "engine.selftest", "app"),  # what people run
]


def _floor(module: str) -> int:
    """The floor of `module`: that of the longest name in FLOORS it is, or is inside."""
    best, at = "", -1
    for i, names in enumerate(FLOORS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > len(best):
                best, at = name, i
    return at


def _backward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs
                  if _floor(b) > _floor(a))


def test_every_module_has_a_floor():
    assert [m for m in _import_graph() if _floor(m) < 0] == []


def test_imports_go_to_their_own_floor_or_below():
    """engine/records.py can't import the node, placement can't import the runtime, the API
    can't import the node: each floor is read knowing only the floors below it."""
    assert _backward(_import_graph()) == []


def test_the_floor_check_sees_a_backward_import():
    graph = {"engine.records": {"engine.errors"}, "engine.api.ollama": {"engine.node.state"},
             "engine.platform.cpu": {"engine.runtime.load"}, "app.chat": {"engine.client"}}
    assert _backward(graph) == ["engine.api.ollama -> engine.node.state",
                                "engine.platform.cpu -> engine.runtime.load"]
