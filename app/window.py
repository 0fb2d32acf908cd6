"""The main window: a start-up page until the node answers and its model is ready, then
the views in tabs (Chat, Models, Topology, Placement, Charts, Developer), with the
keyboard shortcuts and the appearance menu."""

from __future__ import annotations

from PySide6.QtCore import QSettings, QSize, Qt, Signal
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QMainWindow,
    QStackedWidget,
    QTabWidget,
    QWidget,
)

from app.settings import KEEP_IN_TRAY
from app.startup import StartPage
from app.status import StatusLabel, StatusMonitor
from app.theme import APPEARANCE, MODES

__all__ = ["KEEP_IN_TRAY", "MainWindow", "StartPage"]
MINIMUM = QSize(900, 600)  # a small laptop's window, with room for the desktop's bars


def tab_past_tables(view: QWidget) -> None:
    """Tab moves from control to control; in a table or list the arrow keys move from
    cell to cell (Qt's tables take Tab for their cells, so Tab walks every one)."""
    for table in view.findChildren(QAbstractItemView):
        table.setTabKeyNavigation(False)


class MainWindow(QMainWindow):
    """Closing the window quits, unless a tray exists and the user chose to keep running
    in it (default off, so closing never leaves an invisible process behind)."""

    quit_requested = Signal()
    settings_requested = Signal()
    appearance_requested = Signal(str)  # "system" | "light" | "dark"
    new_chat_requested = Signal()
    model_picker_requested = Signal()
    stop_requested = Signal()

    def __init__(self, monitor: StatusMonitor, settings: QSettings, tray_available: bool,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.settings, self.tray_available = settings, tray_available
        self.setWindowTitle("Shoal")
        self.setMinimumSize(MINIMUM)
        self.resize(1100, 760)
        self.pages = QStackedWidget()
        self.start_page = StartPage()
        self.pages.addWidget(self.start_page)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.setAccessibleName("Views")
        self.tabs.currentChanged.connect(self._tab_shown)
        self.pages.addWidget(self.tabs)
        self.setCentralWidget(self.pages)
        self.statusBar().addWidget(StatusLabel(monitor), 1)
        self.views: dict[str, QWidget] = {}
        self.view_actions: list[QAction] = []
        self._build_menu()

    def _action(self, text: str, keys: str | QKeySequence.StandardKey | None,
                signal: Signal, menu) -> QAction:  # noqa: ANN001 - a QMenu
        action = QAction(text, self)
        if keys is not None:
            action.setShortcut(QKeySequence(keys))
        action.triggered.connect(signal)
        menu.addAction(action)
        return action

    def _build_menu(self) -> None:
        menu = self.menuBar().addMenu("&Shoal")
        self.keep_action = QAction("Keep running in the tray when the window closes", self)
        self.keep_action.setCheckable(True)
        self.keep_action.setEnabled(self.tray_available)
        self.keep_action.setChecked(self.keep_in_tray())
        self.keep_action.toggled.connect(
            lambda on: self.settings.setValue(KEEP_IN_TRAY, bool(on)))
        menu.addAction(self.keep_action)
        self.settings_action = self._action("&Settings…", "Ctrl+,", self.settings_requested,
                                            menu)
        self.settings_action.setMenuRole(QAction.MenuRole.PreferencesRole)
        menu.addSeparator()
        self.quit_action = self._action("&Quit Shoal", "Ctrl+Q", self.quit_requested, menu)
        # Explicit: StandardKey.Quit is empty on some platforms. "Ctrl" is Cmd on macOS.
        self.quit_action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        self.quit_action.setMenuRole(QAction.MenuRole.QuitRole)

        chat = self.menuBar().addMenu("&Chat")
        self.new_chat_action = self._action("&New conversation", "Ctrl+N",
                                            self.new_chat_requested, chat)
        self.model_action = self._action("Choose &model…", "Ctrl+L",
                                         self.model_picker_requested, chat)
        self.stop_action = self._action("&Stop the reply", "Esc", self.stop_requested, chat)

        view = self.menuBar().addMenu("&View")
        self.views_menu = view
        view.addSeparator()
        appearance = view.addMenu("&Appearance")
        group = QActionGroup(self)
        current = str(self.settings.value(APPEARANCE, "system"))
        self.appearance_actions: dict[str, QAction] = {}
        for key, text in MODES:
            a = QAction(text, self, checkable=True)
            a.setChecked(key == current)
            a.triggered.connect(lambda _on=False, k=key: self.appearance_requested.emit(k))
            group.addAction(a)
            appearance.addAction(a)
            self.appearance_actions[key] = a

    def sync_appearance(self, mode: str) -> None:
        action = self.appearance_actions.get(mode)
        if action is not None:
            action.setChecked(True)

    def keep_in_tray(self) -> bool:
        return self.tray_available and str(self.settings.value(KEEP_IN_TRAY, False)).lower() in (
            "true", "1")

    def sync_keep(self) -> None:
        """After the settings dialog changed the same setting."""
        self.keep_action.blockSignals(True)
        self.keep_action.setChecked(self.keep_in_tray())
        self.keep_action.blockSignals(False)

    def add_view(self, title: str, view: QWidget) -> None:
        """A tab, reached with Ctrl+1, Ctrl+2, ... in order (and from the View menu)."""
        self.views[title] = view
        tab_past_tables(view)
        self.tabs.addTab(view, title)
        n = len(self.views)
        action = QAction(title, self)
        if n <= 9:
            action.setShortcut(QKeySequence(f"Ctrl+{n}"))
        action.triggered.connect(lambda _on=False, t=title: self.show_view(t))
        first_separator = self.views_menu.actions()[len(self.view_actions)]
        self.views_menu.insertAction(first_separator, action)
        self.view_actions.append(action)

    def _tab_shown(self, _index: int) -> None:
        view = self.tabs.currentWidget()
        if view is not None:
            tab_past_tables(view)  # tables the view made since it was added

    def show_view(self, title: str) -> None:
        """Show a tab, the keyboard in its first place (a view's focus_home, e.g. the
        chat's message box), not wherever it last was (a Copy button)."""
        view = self.views[title]
        self.tabs.setCurrentWidget(view)
        self.pages.setCurrentWidget(self.tabs)
        home = getattr(view, "focus_home", None)
        if callable(home):
            home()

    def show_start_page(self) -> None:
        self.pages.setCurrentWidget(self.start_page)

    def showing_start_page(self) -> bool:
        return self.pages.currentWidget() is self.start_page

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
