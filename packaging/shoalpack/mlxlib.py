"""MLX's lib folder in the bundle. libmlx loads its GPU kernels (mlx.metallib) from the
folder libmlx itself was loaded from (dladdr), then from Resources/ in it, then from the
build machine's path. PyInstaller collects mlx/lib as it is, but on macOS it rewrites the
extension to load libmlx through a link in the app's top-level folder, so MLX looks for its
kernels there (0.32.x: "Failed to load the default metallib" with the file in mlx/lib). So
the dylib and mlx.metallib go to mlx/lib together, and beside every other libmlx the bundle
ends up with, a link to that same mlx.metallib (a link: the file is 100-200 MB)."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from pathlib import Path

DEST = "mlx/lib"  # as pip installs it, beside the extension (mlx/core.*.so)
METALLIB = "mlx.metallib"
CODE_SUFFIXES = (".so", ".dylib")


def lib_folder(mlx_dir: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(binaries, datas) for the spec: every file of mlx/lib, to mlx/lib in the bundle."""
    files = sorted(p for p in (mlx_dir / "lib").iterdir() if p.is_file())
    binaries = [(str(p), DEST) for p in files if p.name.endswith(CODE_SUFFIXES)]
    datas = [(str(p), DEST) for p in files if not p.name.endswith(CODE_SUFFIXES)]
    if not any(Path(src).name.startswith("libmlx.") for src, _ in binaries):
        raise SystemExit(f"MLX's library is missing from {mlx_dir / 'lib'}: reinstall mlx")
    return binaries, datas


def metallib_links(toc: Iterable[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """SYMLINK entries (PyInstaller's TOC form) to mlx/lib/mlx.metallib, one beside each
    libmlx (file or link) that Analysis placed outside mlx/lib."""
    entries = list(toc)
    taken = {dest for dest, _, _ in entries}
    target = posixpath.join(DEST, METALLIB)
    links: dict[str, tuple[str, str, str]] = {}
    for dest, _, _ in entries:
        folder, name = posixpath.split(dest.replace("\\", "/"))
        if not name.startswith("libmlx.") or folder == DEST:
            continue
        link = posixpath.join(folder, METALLIB) if folder else METALLIB
        if link not in taken:
            links[link] = (link, posixpath.relpath(target, folder or "."), "SYMLINK")
    return list(links.values())


def unmatched(bundle: Path) -> list[Path]:
    """Each libmlx in a built bundle (file or link) with no mlx.metallib beside it, where
    the bundle has a metallib at all (macOS): MLX on that path would find no kernels."""
    found: list[Path] = []
    has_metallib = False
    for folder, dirs, files in os.walk(bundle):
        names = set(files) | {d for d in dirs if os.path.islink(os.path.join(folder, d))}
        has_metallib = has_metallib or METALLIB in names
        found += [Path(folder, n) for n in sorted(names) if n.startswith("libmlx.")]
    if not has_metallib:
        return []
    return sorted(lib for lib in found if not (lib.parent / METALLIB).is_file())
