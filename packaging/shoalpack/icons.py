"""The app icon in every size a desktop asks for, drawn from resources/icons/shoal.svg:
PNGs for Linux's hicolor theme and an .icns for macOS (written here, so any host can
build it and the tests can read it back)."""

from __future__ import annotations

import struct
from pathlib import Path

from shoalpack.meta import ROOT

SVG = ROOT / "resources" / "icons" / "shoal.svg"
LINUX_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
# .icns element types holding PNG data, by pixel size (Apple's "Icon Composer" set).
ICNS_TYPES = {16: b"icp4", 32: b"icp5", 64: b"icp6", 128: b"ic07", 256: b"ic08",
              512: b"ic09", 1024: b"ic10"}


def render_png(svg: Path, size: int) -> bytes:
    """The SVG drawn at size×size as PNG bytes (Qt's SVG renderer, no window needed)."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication(
        ["shoal-icons", "-platform", "offscreen"])  # no window, so no display needed
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    QSvgRenderer(str(svg)).render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(data.data())


def icns(pngs: dict[int, bytes]) -> bytes:
    """An .icns file holding the given PNGs (size → bytes); sizes without a type are left out."""
    body = b"".join(ICNS_TYPES[s] + struct.pack(">I", 8 + len(d)) + d
                    for s, d in sorted(pngs.items()) if s in ICNS_TYPES)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def read_icns(data: bytes) -> dict[bytes, bytes]:
    """The elements of an .icns file (type → data): how the tests check what was written."""
    if data[:4] != b"icns" or struct.unpack(">I", data[4:8])[0] != len(data):
        raise ValueError("not an .icns file")
    out, i = {}, 8
    while i < len(data):
        kind, n = data[i:i + 4], struct.unpack(">I", data[i + 4:i + 8])[0]
        out[kind] = data[i + 8:i + n]
        i += n
    return out


def make_icons(out: Path, svg: Path = SVG) -> Path:
    """Write out/hicolor/NxN/apps/shoal.png for every Linux size, out/hicolor/scalable and
    out/Shoal.icns. Returns out."""
    pngs = {s: render_png(svg, s) for s in sorted({*LINUX_SIZES, *ICNS_TYPES})}
    for s in LINUX_SIZES:
        path = out / "hicolor" / f"{s}x{s}" / "apps" / "shoal.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pngs[s])
    scalable = out / "hicolor" / "scalable" / "apps" / "shoal.svg"
    scalable.parent.mkdir(parents=True, exist_ok=True)
    scalable.write_bytes(svg.read_bytes())
    (out / "Shoal.icns").write_bytes(icns(pngs))
    return out
