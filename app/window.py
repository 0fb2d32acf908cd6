"""The main window: a start-up page until the node answers, then the views in tabs
(Chat, Models, Topology, Placement, Charts)."""

from __future__ import annotations

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QFontDatabase, QKeySequence
from PySide6.QtWidgets import (
    QLabel,
    QMainWindow,
    QPlainTextEdit,
    QPushButton,
    QStackedWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.settings import KEEP_IN_TRAY
from app.status import StatusLabel, StatusMonitor

__all__ = ["KEEP_IN_TRAY", "MainWindow", "StartPage"]


class StartPage(QWidget):
    """'Starting node…', or why the node didn't start, with the end of its log."""

    retry_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        self.title = QLabel("Starting node…")
        self.title.setStyleSheet("font-size: 16pt;")
        self.title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.reason = QLabel()
        self.reason.setWordWrap(True)
        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.retry_button = QPushButton("Try again")
        self.retry_button.clicked.connect(self.retry_requested)
        layout.addStretch(1)
        for w in (self.title, self.reason, self.log_view, self.retry_button):
            layout.addWidget(w)
        layout.addStretch(1)
        self.show_starting()

    def show_starting(self) -> None:
        self.title.setText("Starting node…")
        for w in (self.reason, self.log_view, self.retry_button):
            w.hide()

    def show_failure(self, reason: str, log_tail: str, log_path: str) -> None:
        self.title.setText("The local node didn't start")
        self.reason.setText(f"{reason}\nIts output is in {log_path}; the end of it is below.")
        self.log_view.setPlainText(log_tail or "(the node wrote nothing)")
        for w in (self.reason, self.log_view, self.retry_button):
            w.show()


class MainWindow(QMainWindow):
    """Closing the window quits, unless a tray exists and the user chose to keep running
    in it (default off, so closing never leaves an invisible process behind)."""

    quit_requested = Signal()
    settings_requested = Signal()

    def __init__(self, monitor: StatusMonitor, settings: QSettings, tray_available: bool,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.settings, self.tray_available = settings, tray_available
        self.setWindowTitle("Shoal")
        self.resize(1100, 760)
        self.pages = QStackedWidget()
        self.start_page = StartPage()
        self.pages.addWidget(self.start_page)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.pages.addWidget(self.tabs)
        self.setCentralWidget(self.pages)
        self.statusBar().addWidget(StatusLabel(monitor), 1)
        self.views: dict[str, QWidget] = {}
        self._build_menu()

    def _build_menu(self) -> None:
        menu = self.menuBar().addMenu("&Shoal")
        self.keep_action = QAction("Keep running in the tray when the window closes", self)
        self.keep_action.setCheckable(True)
        self.keep_action.setEnabled(self.tray_available)
        self.keep_action.setChecked(self.keep_in_tray())
        self.keep_action.toggled.connect(
            lambda on: self.settings.setValue(KEEP_IN_TRAY, bool(on)))
        menu.addAction(self.keep_action)
        self.settings_action = QAction("&Settings…", self)
        self.settings_action.setShortcut(QKeySequence("Ctrl+,"))
        self.settings_action.setMenuRole(QAction.MenuRole.PreferencesRole)
        self.settings_action.triggered.connect(self.settings_requested)
        menu.addAction(self.settings_action)
        menu.addSeparator()
        self.quit_action = QAction("&Quit Shoal", self)
        # Explicit: StandardKey.Quit is empty on some platforms. "Ctrl" is Cmd on macOS.
        self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        self.quit_action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        self.quit_action.setMenuRole(QAction.MenuRole.QuitRole)
        self.quit_action.triggered.connect(self.quit_requested)
        menu.addAction(self.quit_action)

    def keep_in_tray(self) -> bool:
        return self.tray_available and str(self.settings.value(KEEP_IN_TRAY, False)).lower() in (
            "true", "1")

    def sync_keep(self) -> None:
        """After the settings dialog changed the same setting."""
        self.keep_action.blockSignals(True)
        self.keep_action.setChecked(self.keep_in_tray())
        self.keep_action.blockSignals(False)

    def add_view(self, title: str, view: QWidget) -> None:
        self.views[title] = view
        self.tabs.addTab(view, title)

    def show_view(self, title: str) -> None:
        self.tabs.setCurrentWidget(self.views[title])
        self.pages.setCurrentWidget(self.tabs)

    def show_start_page(self) -> None:
        self.pages.setCurrentWidget(self.start_page)

    def show_and_raise(self) -> None:
        self.showNormal()
        self.raise_()
        self.activateWindow()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt's name
        if self.keep_in_tray():
            event.ignore()
            self.hide()
        else:
            event.accept()
            self.quit_requested.emit()
