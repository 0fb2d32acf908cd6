"""The layering contract of DESIGN.md, checked on every import statement: engine never
imports Qt or app; app never imports mlx; placement does no I/O."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(package: str) -> list[tuple[Path, str]]:
    out = []
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out += [(path, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.append((path, node.module))
    return out


def _offenders(package: str, banned: tuple[str, ...]) -> list[str]:
    return [f"{p.relative_to(ROOT)}: {m}" for p, m in _imports(package)
            if m.split(".")[0] in banned]


def test_engine_never_imports_qt_or_the_app():
    assert _offenders("engine", ("PySide6", "pyqtgraph", "app", "shiboken6")) == []


def test_app_never_imports_mlx():
    assert _offenders("app", ("mlx", "mlx_lm")) == []


def test_placement_is_pure():
    assert _offenders("engine/placement", ("os", "socket", "subprocess", "aiohttp",
                                           "httpx", "mlx", "shutil")) == []
