"""packaging/build's steps: icons, PyInstaller, then the platform's finish (Linux archive,
or signing on macOS), the self-test inside the built app, and what it all came to."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from shoalpack import icons, linux, meta, mlxlib

ROOT = meta.ROOT
BUILD, DIST = ROOT / "build", ROOT / "dist"
SPEC = ROOT / "packaging" / "shoal.spec"
MAC = sys.platform == "darwin"


def say(text: str) -> None:
    print(f"==> {text}", file=sys.stderr, flush=True)


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def executable() -> Path:
    if MAC:
        return DIST / f"{meta.NAME}.app" / "Contents" / "MacOS" / meta.EXECUTABLE
    return DIST / meta.NAME / meta.EXECUTABLE


def pyinstaller() -> None:
    subprocess.run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
                    "--distpath", str(DIST), "--workpath", str(BUILD / "pyinstaller"),
                    str(SPEC)], check=True, cwd=ROOT)


def check_mlx(folder: Path) -> None:
    """Stop before signing a bundle whose MLX would find no GPU kernels (see mlxlib)."""
    lonely = mlxlib.unmatched(folder)
    if lonely:
        names = ", ".join(str(p.relative_to(folder)) for p in lonely)
        raise SystemExit(f"{mlxlib.METALLIB} is not beside {names} in {folder.name}: MLX "
                         "loaded from there would fail to load its GPU kernels (shoal.spec)")


def self_test() -> None:
    """Run the frozen app's --self-test with a throwaway home, as a user's first launch."""
    home = BUILD / "selftest-home"
    env = {**os.environ, "SHOAL_HOME": str(home)}
    subprocess.run([str(executable()), "--self-test", "--home", str(home)], check=True, env=env)


def main() -> int:
    t0 = time.monotonic()
    version = meta.version()
    say("drawing the icons")
    icons.make_icons(BUILD / "icons")
    say(f"building {meta.NAME} {version} with PyInstaller (a few minutes)")
    pyinstaller()
    folder = DIST / (f"{meta.NAME}.app" if MAC else meta.NAME)
    check_mlx(folder)
    if MAC:
        product = folder
        if os.environ.get("SHOAL_SIGN_IDENTITY"):
            say("signing, notarizing, stapling and making the DMG")
            subprocess.run([sys.executable, str(ROOT / "packaging" / "macos" / "sign"),
                            str(product)], check=True)
        else:
            say("not signed (set SHOAL_SIGN_IDENTITY to sign, notarize and make a DMG)")
    else:
        linux.finish(DIST / meta.NAME, BUILD / "icons")
    if os.environ.get("SHOAL_BUILD_SELFTEST", "1") != "0":
        say("self-test inside the built app")
        self_test()
    if not MAC:
        say("packing the archive")
        product = linux.pack(DIST / meta.NAME, DIST / linux.archive_name(version))
    took = time.monotonic() - t0
    print(f"built {product.relative_to(ROOT)}: {size_of(product) / 2**20:.0f} MiB "
          f"({folder.name} unpacked {size_of(folder) / 2**20:.0f} MiB) in {took:.0f} s",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
