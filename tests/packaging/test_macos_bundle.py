"""What Shoal.app declares and how it is signed, checked on any OS: the Info.plist macOS
reads, the icon it shows, and the signing script's commands in the order they run."""

from __future__ import annotations

import os
import plistlib
import shlex
import struct
import subprocess
import sys
from pathlib import Path

import pytest

if not os.environ.get("QT_QPA_PLATFORM"):
    os.environ["QT_QPA_PLATFORM"] = "offscreen"  # the icons are drawn with Qt, no display
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
from shoalpack import icons, meta, plist  # noqa: E402

SIGN = ROOT / "packaging" / "macos" / "sign"


def test_info_plist_has_what_macos_checks() -> None:
    info = plistlib.loads(plist.dumps(meta.version(), "14.0"))
    assert info["CFBundleIdentifier"] == "org.shoal.Shoal"
    assert info["CFBundleShortVersionString"] == info["CFBundleVersion"] == meta.version()
    assert info["CFBundleExecutable"] == "shoal"
    assert info["CFBundleIconFile"] == "Shoal.icns"
    assert info["LSMinimumSystemVersion"] == "14.0"
    # without these two, macOS 15+ blocks finding and reaching other nodes on the LAN
    assert "local network" in info["NSLocalNetworkUsageDescription"]
    from engine.cluster.discovery import SERVICE
    assert info["NSBonjourServices"] == [SERVICE.removesuffix(".local.")] == ["_shoal._tcp"]


def test_minimum_macos_is_the_newest_the_mlx_wheels_need() -> None:
    tags = ["cp311-cp311-macosx_14_0_arm64", "py3-none-macosx_15_0_arm64"]
    assert meta.macos_min_from_tags(tags) == "15.0"
    assert meta.macos_min_from_tags(["cp312-cp312-macosx_13_5_arm64"]) == "13.5"
    assert meta.macos_min_from_tags(["cp311-cp311-manylinux_2_35_x86_64"]) is None
    assert meta.macos_minimum(default="14.0") == "14.0"  # Linux wheels say nothing


def test_entitlements_are_a_valid_plist() -> None:
    ent = plistlib.loads((ROOT / "packaging" / "macos" / "entitlements.plist").read_bytes())
    assert ent["com.apple.security.cs.allow-unsigned-executable-memory"] is True


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_icons_in_every_size(tmp_path: Path, qapp) -> None:
    # qapp: the session's one QApplication, so drawing leaves no bare QGuiApplication behind
    icons.make_icons(tmp_path)
    elements = icons.read_icns((tmp_path / "Shoal.icns").read_bytes())
    assert {png_size(d) for d in elements.values()} == {
        (s, s) for s in (16, 32, 64, 128, 256, 512, 1024)}
    for s in icons.LINUX_SIZES:
        assert png_size((tmp_path / f"hicolor/{s}x{s}/apps/shoal.png").read_bytes()) == (s, s)
    assert (tmp_path / "hicolor/scalable/apps/shoal.svg").is_file()


MACHO = bytes.fromhex("cffaedfe") + b"\0" * 60


@pytest.fixture
def fake_app(tmp_path: Path) -> Path:
    """A Shoal.app laid out as PyInstaller makes it, with Mach-O stand-ins."""
    app = tmp_path / "dist" / "Shoal.app"
    c = app / "Contents"
    for rel in ("MacOS/shoal", "Frameworks/mlx/lib/libmlx.dylib",
                "Frameworks/mlx/core.cpython-311-darwin.so",
                "Frameworks/PySide6/Qt/lib/QtCore.framework/Versions/A/QtCore",
                "Frameworks/PySide6/Qt/plugins/platforms/libqcocoa.dylib",
                "Frameworks/Python"):
        (c / rel).parent.mkdir(parents=True, exist_ok=True)
        (c / rel).write_bytes(MACHO)
    (c / "Resources/mlx/lib").mkdir(parents=True)
    (c / "Resources/mlx/lib/mlx.metallib").write_bytes(b"MTLB" + b"\0" * 60)  # not code
    (c / "Frameworks/mlx/lib/mlx.metallib").symlink_to("../../../Resources/mlx/lib/mlx.metallib")
    # the top-level links macOS loads libmlx through, and the spec's metallib beside it
    (c / "Frameworks/libmlx.dylib").symlink_to("mlx/lib/libmlx.dylib")
    (c / "Frameworks/mlx.metallib").symlink_to("mlx/lib/mlx.metallib")
    (c / "Frameworks/PySide6/Qt/lib/QtCore.framework/QtCore").symlink_to("Versions/A/QtCore")
    (c / "Frameworks/PySide6/Qt/lib/QtCore.framework/Versions/Current").symlink_to("A")
    (c / "Info.plist").write_bytes(plist.dumps("0.1.0", "14.0"))
    return app


def sign(app: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    return subprocess.run([sys.executable, str(SIGN), str(app), "--dry-run"], text=True,
                          capture_output=True, env={**clean, **env}, timeout=60)


def commands(out: str) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in out.splitlines() if line.startswith("+ ")]


def test_signing_goes_inside_out_then_notarizes_staples_and_makes_a_dmg(fake_app: Path) -> None:
    r = sign(fake_app, SHOAL_SIGN_IDENTITY="Developer ID Application: T (ABC123)",
             SHOAL_NOTARY_PROFILE="shoal")
    assert r.returncode == 0, r.stderr
    cmds = commands(r.stdout)
    signed = [Path(c[-1]) for c in cmds if c[0] == "codesign" and "--sign" in c]
    assert not any("--deep" in c for c in cmds if c[0] == "codesign" and "--sign" in c)
    c = fake_app / "Contents"
    code = {c / "MacOS/shoal", c / "Frameworks/mlx/lib/libmlx.dylib", c / "Frameworks/Python",
            c / "Frameworks/mlx/core.cpython-311-darwin.so",
            c / "Frameworks/PySide6/Qt/plugins/platforms/libqcocoa.dylib",
            c / "Frameworks/PySide6/Qt/lib/QtCore.framework/Versions/A/QtCore",
            c / "Frameworks/PySide6/Qt/lib/QtCore.framework/Versions/A", fake_app}
    assert code <= set(signed)
    assert not any(p.name == "mlx.metallib" or p.is_symlink() for p in signed)
    for i, outer in enumerate(signed):  # nothing is signed after what contains it
        assert not any(outer in inner.parents for inner in signed[i + 1:]), outer
    app_sign = signed.index(fake_app)
    assert signed[app_sign - 1] == c / "MacOS/shoal"
    entitled = [Path(x[-1]) for x in cmds if "--entitlements" in x]
    assert entitled == [c / "MacOS/shoal", fake_app]
    assert all("runtime" in x for x in cmds if x[0] == "codesign" and "--sign" in x
               and not x[-1].endswith(".dmg"))

    def first(pred) -> int:
        return next(i for i, x in enumerate(cmds) if pred(x))

    app_signed = first(lambda x: x[0] == "codesign" and x[-1] == str(fake_app))
    notarize_app = first(lambda x: x[:3] == ["xcrun", "notarytool", "submit"])
    staple_app = first(lambda x: x[:3] == ["xcrun", "stapler", "staple"])
    dmg_made = first(lambda x: x[:2] == ["hdiutil", "create"])
    dmg = cmds[dmg_made][-1]
    assert dmg.endswith("dist/Shoal-0.1.0.dmg")
    dmg_signed = first(lambda x: x[0] == "codesign" and x[-1] == dmg)
    assert cmds[dmg_signed] == ["codesign", "--force", "--timestamp", "--sign",
                                "Developer ID Application: T (ABC123)", dmg]
    notarize_dmg = first(lambda x: x[:3] == ["xcrun", "notarytool", "submit"] and dmg in x)
    staple_dmg = first(lambda x: x[:3] == ["xcrun", "stapler", "staple"] and x[-1] == dmg)
    assert app_signed < notarize_app < staple_app < dmg_made < dmg_signed < notarize_dmg \
        < staple_dmg == len(cmds) - 1
    assert "--keychain-profile" in cmds[notarize_app] and "--wait" in cmds[notarize_app]
    assert not (fake_app.parent / "Shoal-0.1.0.dmg").exists()  # a dry run runs nothing


def test_signing_without_notary_credentials_still_signs_and_makes_the_dmg(fake_app: Path
                                                                          ) -> None:
    r = sign(fake_app, SHOAL_SIGN_IDENTITY="Developer ID Application: T (ABC123)")
    assert r.returncode == 0 and "not notarized" in r.stderr
    cmds = commands(r.stdout)
    assert not any("notarytool" in c or "stapler" in c for c in cmds)
    assert any(c[:2] == ["hdiutil", "create"] for c in cmds)


def test_app_specific_password_never_shows(fake_app: Path) -> None:
    r = sign(fake_app, SHOAL_SIGN_IDENTITY="Developer ID Application: T (ABC123)",
             SHOAL_NOTARY_APPLE_ID="a@b.c", SHOAL_NOTARY_TEAM_ID="ABC123",
             SHOAL_NOTARY_PASSWORD="hunter2-secret")
    assert r.returncode == 0
    assert "hunter2-secret" not in r.stdout + r.stderr and "****" in r.stdout


def test_signing_without_an_identity_says_how_to_get_one(fake_app: Path) -> None:
    r = sign(fake_app)
    assert r.returncode == 2
    assert "SHOAL_SIGN_IDENTITY" in r.stderr and "find-identity" in r.stderr
