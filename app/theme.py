"""Appearance: light, dark or the system's, switched while the app runs, and every colour
the app uses besides the palette's own (states, series, syntax), chosen for the palette in
force. Widgets take their looks from one application style sheet (resources/style.qss)
through a `role` property, never from inline style sheets."""

from __future__ import annotations

import sys
from pathlib import Path
from string import Template

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QWidget

MODES = (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark"))
APPEARANCE = "view/appearance"  # QSettings key
STYLE_SHEET = Path(__file__).resolve().parent.parent / "resources" / "style.qss"

# Meaning colours: (on a light background, on a dark one), readable on both.
COLOURS = {
    "error": ("#c62828", "#ff7b72"),
    "warning": ("#a35200", "#f0a04b"),
    "ok": ("#2e7d32", "#7ee787"),
    "info": ("#1f6feb", "#79b8ff"),
    "planned": ("#e0a020", "#e0a020"),
    "code-bg": ("#f3f4f6", "#161b22"),
    "card": ("#ffffff", "#262a30"),
    "card-unpaired": ("#fff4e5", "#3a2e1f"),
    "card-mismatch": ("#fdecec", "#3d2224"),
    "track": ("#e8e8e8", "#3a3f46"),
    "free": ("#dcefdc", "#2f4a35"),
    "others": ("#9a9a9a", "#6e7681"),
}
# One colour per node or series, in rank order.
SERIES = (("#2f7fd8", "#58a6ff"), ("#2e9d57", "#56d364"), ("#8e5bd0", "#bc8cff"),
          ("#d0792f", "#f0883e"), ("#2aa3a3", "#39c5cf"), ("#c0489a", "#f778ba"),
          ("#7a8a2a", "#b7c94a"))
# Code highlighting: keyword, string, comment, number, type / builtin.
SYNTAX = {"keyword": ("#8250df", "#d2a8ff"), "string": ("#0a7f3f", "#a5d6ff"),
          "comment": ("#6e7781", "#8b949e"), "number": ("#0550ae", "#79c0ff"),
          "type": ("#953800", "#ffa657")}
# The tray icon's states (the same in both appearances: it sits on the menubar).
STATES = {"idle": "#2e9d57", "downloading": "#8e5bd0", "loading": "#e0a020",
          "generating": "#2f7fd8", "error": "#d03b3b", "unreachable": "#d03b3b"}
GREY = "#8a8a8a"


def palette() -> QPalette:
    return QGuiApplication.palette()


def is_dark(pal: QPalette | None = None) -> bool:
    pal = pal or palette()
    return pal.color(QPalette.ColorRole.Window).lightness() < 128


def colour(name: str, pal: QPalette | None = None) -> QColor:
    light, dark = COLOURS[name]
    return QColor(dark if is_dark(pal) else light)


def series(i: int, pal: QPalette | None = None) -> QColor:
    light, dark = SERIES[i % len(SERIES)]
    return QColor(dark if is_dark(pal) else light)


def syntax(kind: str, pal: QPalette | None = None) -> QColor:
    light, dark = SYNTAX[kind]
    return QColor(dark if is_dark(pal) else light)


def readable_on(background: QColor) -> QColor:
    """Black or white, whichever reads on `background`."""
    return QColor("#000000") if background.lightnessF() > 0.6 else QColor("#ffffff")


def text(pal: QPalette | None = None) -> QColor:
    return (pal or palette()).color(QPalette.ColorRole.WindowText)


def muted(pal: QPalette | None = None) -> QColor:
    return (pal or palette()).color(QPalette.ColorRole.PlaceholderText)


def dark_palette() -> QPalette:
    p = QPalette()
    roles = QPalette.ColorRole
    for role, value in ((roles.Window, "#1f2227"), (roles.WindowText, "#e6e6e6"),
                        (roles.Base, "#16181c"), (roles.AlternateBase, "#23262b"),
                        (roles.Text, "#e6e6e6"), (roles.Button, "#2c3036"),
                        (roles.ButtonText, "#e6e6e6"), (roles.BrightText, "#ffffff"),
                        (roles.Highlight, "#2f6fbf"), (roles.HighlightedText, "#ffffff"),
                        (roles.ToolTipBase, "#2c3036"), (roles.ToolTipText, "#e6e6e6"),
                        (roles.PlaceholderText, "#9097a0"), (roles.Link, "#79b8ff"),
                        (roles.LinkVisited, "#bc8cff"), (roles.Mid, "#3a3f46"),
                        (roles.Dark, "#111317"), (roles.Light, "#3a3f46"),
                        (roles.Midlight, "#30343a"), (roles.Shadow, "#000000")):
        p.setColor(role, QColor(value))
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6e7681"))
    return p


def light_palette() -> QPalette:
    p = QPalette()
    roles = QPalette.ColorRole
    for role, value in ((roles.Window, "#f3f3f3"), (roles.WindowText, "#1f2328"),
                        (roles.Base, "#ffffff"), (roles.AlternateBase, "#f6f8fa"),
                        (roles.Text, "#1f2328"), (roles.Button, "#f0f0f0"),
                        (roles.ButtonText, "#1f2328"), (roles.BrightText, "#000000"),
                        (roles.Highlight, "#2f7fd8"), (roles.HighlightedText, "#ffffff"),
                        (roles.ToolTipBase, "#ffffdc"), (roles.ToolTipText, "#1f2328"),
                        (roles.PlaceholderText, "#6e7781"), (roles.Link, "#0969da"),
                        (roles.LinkVisited, "#8250df"), (roles.Mid, "#c8c8c8"),
                        (roles.Dark, "#a0a0a0"), (roles.Light, "#ffffff"),
                        (roles.Midlight, "#e3e3e3"), (roles.Shadow, "#767676")):
        p.setColor(role, QColor(value))
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#8c959f"))
    return p


def style_sheet(pal: QPalette | None = None) -> str:
    """resources/style.qss with its $names filled for the palette in force."""
    values = {name.replace("-", "_"): colour(name, pal).name() for name in COLOURS}
    values["muted"] = muted(pal).name()
    try:
        return Template(STYLE_SHEET.read_text(encoding="utf-8")).safe_substitute(values)
    except OSError:
        return ""  # a broken install still opens, plainer


class Appearance(QObject):
    """The one place that sets the application's palette and style sheet. `changed`
    follows every switch, the user's or the system's."""

    changed = Signal()

    def __init__(self, app: QApplication, mode: str = "system", parent: QObject | None = None):
        super().__init__(parent)
        self.app = app
        self.mode = "system"
        self._native = app.palette()  # the platform's own, for "follow the system"
        app.styleHints().colorSchemeChanged.connect(self._system_changed)
        self.set_mode(mode)

    def set_mode(self, mode: str) -> None:
        if mode not in dict(MODES):
            mode = "system"
        self.mode = mode
        hints = self.app.styleHints()
        if mode == "system":
            hints.unsetColorScheme()
            dark = hints.colorScheme() == Qt.ColorScheme.Dark
            pal = dark_palette() if dark and not is_dark(self._native) else self._native
        else:
            hints.setColorScheme(Qt.ColorScheme.Dark if mode == "dark"
                                 else Qt.ColorScheme.Light)
            # macOS and Windows repaint natively; elsewhere the platform may ignore the hint
            native = sys.platform in ("darwin", "win32")
            pal = self.app.palette() if native else (
                dark_palette() if mode == "dark" else light_palette())
        self.app.setPalette(pal)
        self.app.setStyleSheet(style_sheet(pal))
        self.changed.emit()

    def _system_changed(self, _scheme: Qt.ColorScheme) -> None:
        if self.mode == "system":
            self._native = self.app.palette()
            self.set_mode("system")
        elif sys.platform in ("darwin", "win32"):  # the native palette came a moment later
            self.app.setStyleSheet(style_sheet(self.app.palette()))
            self.changed.emit()


def set_role(widget: QWidget, role: str | None) -> None:
    """Give a widget its look from the style sheet (error, warning, muted, ...); re-polish
    so a role changed after the widget was shown takes effect."""
    if widget.property("role") == role:
        return
    widget.setProperty("role", role)
    style = widget.style()
    style.unpolish(widget)
    style.polish(widget)
