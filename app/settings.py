"""The settings dialog: the cluster secret (show, copy, rotate), peers, the API the node
the app starts serves (address, port and origins kept in HOME/app.ini, the key in the
keyring; applied at that node's next start), the models folder, the Hugging Face token,
and running in the background.

The secret and the token are read and written by the app's node (engine.client), which
keeps them in its home; every call goes through Tasks, so a slow keyring never freezes
the window.
The API key is needed before the window opens (the app's own client sends it), so it is read
through the engine's bounded keyring-or-file store directly, and only when app.ini says one
was stored: app.ini never holds the key itself.
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.common import message_of
from app.tasks import Tasks
from app.theme import APPEARANCE, MODES
from engine.client import NodeClient
from engine.net import DEFAULT_PORT, is_loopback
from engine.records import PeerInfo

log = logging.getLogger(__name__)
KEEP_IN_TRAY = "tray/keep_running_on_close"
MENUBAR_ONLY = "tray/menubar_only"  # macOS: no Dock icon
NODE_HOST, NODE_PORT = "node/host", "node/port"
NODE_API_KEY = "node/api_key"  # only in old app.ini files: moved to the keyring when read
NODE_KEY_STORED = "node/api_key_stored"  # true when a key is in the keyring (or key file)
NODE_CORS = "node/cors_origins"  # browser origins the node allows (CORS), space-separated
NODE_HOSTS = "node/allowed_hosts"  # Host names the node answers to beside its own
NODE_SPECULATIVE = "node/speculative"  # speculative decoding on (the default) or off
NODE_DRAFT = "node/draft_model"  # a draft model's id or folder; empty: prompt lookup


# --- the API settings of the node the app starts -------------------------------------------
@dataclass(frozen=True)
class NodeSettings:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    speculative: bool = True
    draft_model: str = ""

    def drafting_env(self) -> dict[str, str]:
        """The node's drafting settings, as the environment `shoal node` reads them."""
        env = {"SHOAL_SPECULATIVE": "on" if self.speculative else "off"}
        return env | ({"SHOAL_DRAFT_MODEL": self.draft_model} if self.draft_model else {})


def parse_hosts(text: str) -> tuple[str, ...]:
    return tuple(h.lower().rstrip(".") for h in text.replace(",", " ").split())


def check_hosts(hosts: tuple[str, ...]) -> str | None:
    """Why these Host names can't be used, or None."""
    for h in hosts:
        if h != "*" and not re.fullmatch(r"[a-z0-9.\-]+|\[[0-9a-f:.]+\]", h):
            return (f"'{h}' is not a host name: write just the name clients use, like "
                    "shoal.lan (no http://, no port).")
    return None


def saved_allowed_hosts(home: Path) -> tuple[str, ...]:
    """The extra Host names saved for the node the app starts in HOME."""
    settings = QSettings(str(Path(home) / "app.ini"), QSettings.Format.IniFormat)
    return parse_hosts(str(settings.value(NODE_HOSTS, "") or ""))


def parse_origins(text: str) -> tuple[str, ...]:
    return tuple(o.rstrip("/") for o in text.replace(",", " ").split())


def check_origins(origins: tuple[str, ...]) -> str | None:
    """Why these CORS origins can't be used, or None."""
    for o in origins:
        if o != "*" and not re.fullmatch(r"https?://[^/\s]+", o):
            return (f"'{o}' is not an origin: write scheme and host, like "
                    "http://localhost:3000 (or * for any page).")
    return None


def saved_drafting_env(home: Path) -> dict[str, str]:
    """The drafting settings saved for the node the app starts in HOME."""
    settings = QSettings(str(Path(home) / "app.ini"), QSettings.Format.IniFormat)
    return node_settings(settings).drafting_env()


def saved_cors_origins(home: Path) -> tuple[str, ...]:
    """The origins saved for the node the app starts in HOME (read when it starts)."""
    settings = QSettings(str(Path(home) / "app.ini"), QSettings.Format.IniFormat)
    return node_settings(settings).cors_origins


def _key_store(settings: QSettings) -> Any:
    from engine.cluster.secret import ApiKeyStore  # stdlib only; keyring on first use
    return ApiKeyStore(Path(settings.fileName()).parent)


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("true", "1")


def api_key(settings: QSettings) -> str | None:
    """The API key of the app's node: from the keyring (or its private file), after moving a
    key an older Shoal left in plain text in app.ini there."""
    plain = str(settings.value(NODE_API_KEY, "") or "").strip()
    if plain:
        store = _key_store(settings)
        try:
            store.set(plain)
        except OSError as e:  # the home is read-only or full: keep using it as it is
            log.warning("couldn't move the API key out of %s: %s", settings.fileName(), e)
            return plain
        settings.remove(NODE_API_KEY)
        settings.setValue(NODE_KEY_STORED, True)
        settings.sync()
        log.info("moved the API key out of %s into %s", settings.fileName(), store.where)
        return plain
    if not _truthy(settings.value(NODE_KEY_STORED, False)):
        return None
    return _key_store(settings).get()


def store_api_key(settings: QSettings, key: str | None) -> str:
    """Keep `key` (None: no key) where api_key() finds it; returns where that is."""
    store = _key_store(settings)
    settings.remove(NODE_API_KEY)
    if key:
        store.set(key)
    else:
        store.clear()
    settings.setValue(NODE_KEY_STORED, bool(key))
    return store.where


def node_settings(settings: QSettings) -> NodeSettings:
    try:
        port = int(settings.value(NODE_PORT, DEFAULT_PORT))
    except (TypeError, ValueError):
        port = DEFAULT_PORT
    key = api_key(settings)
    host = str(settings.value(NODE_HOST, "127.0.0.1") or "127.0.0.1").strip()
    cors = parse_origins(str(settings.value(NODE_CORS, "") or ""))
    hosts = parse_hosts(str(settings.value(NODE_HOSTS, "") or ""))
    return NodeSettings(host or "127.0.0.1", port, key or None, cors, hosts,
                        _truthy(settings.value(NODE_SPECULATIVE, True)),
                        str(settings.value(NODE_DRAFT, "") or "").strip())


def check_api(host: str, key: str) -> str | None:
    """Why these API settings can't be used, or None."""
    if not host:
        return "Give the address to serve the API on (127.0.0.1 keeps it on this machine)."
    if not is_loopback(host) and not key:
        return (f"Serving the API on {host} opens it to the network: set an API key, or "
                "use 127.0.0.1.")
    return None


def wrappable(path: str) -> str:
    """A path a word-wrapped label may break after its slashes (it has no spaces)."""
    return path.replace("/", "/\u200b").replace("\\", "\\\u200b")


# --- the dialog -----------------------------------------------------------------------------
class SettingsDialog(QDialog):
    appearance_changed = Signal(str)  # "system" | "light" | "dark", applied at once
    restart_requested = Signal()  # API → Restart now: the app restarts the node it started

    def __init__(self, home: Path, settings: QSettings, client: NodeClient, tasks: Tasks,
                 tray_available: bool, models_dir: str | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.home, self.settings, self.client, self.tasks = home, settings, client, tasks
        self.setWindowTitle("Shoal settings")
        self.resize(640, 440)
        self.secret_value: str | None = None
        self.restartable = False  # the app started its node: Restart now can apply changes
        self.tabs = QTabWidget()
        self.tabs.addTab(self._cluster_tab(), "Cluster")
        self.tabs.addTab(self._api_tab(), "API")
        self.tabs.addTab(self._models_tab(models_dir), "Models")
        self.tabs.addTab(self._general_tab(tray_available), "General")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(buttons)
        self.load_secret()
        self.refresh_peers()

    def set_restartable(self, on: bool) -> None:
        """on: the app started its node, so saved API settings that keep its address,
        port and key can be applied at once (Restart now)."""
        self.restartable = on

    def node_restarted(self) -> None:
        if self.restart_button.isVisible():
            self.restart_button.hide()
            self.restart_button.setEnabled(True)
            self.api_message.setText("Shoal's engine runs with these settings now.")

    def show_tab(self, title: str) -> None:
        for i in range(self.tabs.count()):
            if self.tabs.tabText(i) == title:
                self.tabs.setCurrentIndex(i)

    # --- cluster: secret and peers --------------------------------------------------------
    def _cluster_tab(self) -> QWidget:
        self.secret_edit = QLineEdit()
        self.secret_edit.setReadOnly(True)
        self.secret_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.secret_edit.setPlaceholderText("reading…")
        self.secret_edit.setAccessibleName("Cluster secret")
        self.show_secret = QPushButton("Show")
        self.show_secret.setCheckable(True)
        self.show_secret.setAccessibleName("Show the cluster secret")
        self.show_secret.toggled.connect(self._reveal)
        self.copy_secret = QPushButton("Copy")
        self.copy_secret.setAccessibleName("Copy the cluster secret")
        self.copy_secret.clicked.connect(self._copy_secret)
        self.rotate_secret = QPushButton("Rotate…")
        self.rotate_secret.clicked.connect(self._ask_rotate)
        self.secret_info = QLabel()
        self.secret_info.setWordWrap(True)
        theme.set_role(self.secret_info, "muted")
        row = QHBoxLayout()
        for w in (self.secret_edit, self.show_secret, self.copy_secret, self.rotate_secret):
            row.addWidget(w)
        self.peer_list = QListWidget()
        self.peer_list.setAccessibleName("Peers")
        self.peer_list.setWordWrap(True)  # an address and a reason can be long
        self.no_peers = QLabel("No peers yet: nodes on this network with the same secret "
                               "appear by themselves; others can be added below.")
        self.no_peers.setWordWrap(True)
        theme.set_role(self.no_peers, "muted")
        self.no_peers.hide()
        peers = QVBoxLayout()
        peers.setContentsMargins(0, 0, 0, 0)
        peers.addWidget(self.peer_list)
        peers.addWidget(self.no_peers)
        self.peer_edit = QLineEdit()
        self.peer_edit.setPlaceholderText("host:port of another node (its cluster port)")
        self.peer_edit.setAccessibleName("Address of a peer to add")
        self.peer_edit.returnPressed.connect(self.add_peer)
        self.add_peer_button = QPushButton("Add")
        self.add_peer_button.setAccessibleName("Add the peer")
        self.add_peer_button.clicked.connect(self.add_peer)
        self.peer_message = QLabel()
        self.peer_message.setWordWrap(True)
        add = QHBoxLayout()
        add.addWidget(self.peer_edit, 1)
        add.addWidget(self.add_peer_button)
        tab = QWidget()
        form = QFormLayout(tab)
        form.addRow("Cluster secret:", row)
        form.addRow("", self.secret_info)
        form.addRow("Peers:", peers)
        form.addRow("", add)
        form.addRow("", self.peer_message)
        return tab

    def load_secret(self, action: str = "show") -> None:
        self.tasks.run(self.client.cluster_secret, action == "rotate",
                       on_done=self._show_secret,
                       on_error=lambda e: self.secret_info.setText(
                           f"Couldn't read the cluster secret: {message_of(e)}"), owner=self)

    def _show_secret(self, found: dict[str, str]) -> None:
        self.secret_value = found["secret"]
        self.secret_edit.setText(found["secret"])
        self.secret_info.setText(
            f"Pairing code {found.get('pairing', '?')}; kept in "
            f"{wrappable(found.get('where', '?'))}. "
            "Every node of a cluster holds the same secret; a node reads it when it starts.")

    def _reveal(self, on: bool) -> None:
        self.secret_edit.setEchoMode(QLineEdit.EchoMode.Normal if on else
                                     QLineEdit.EchoMode.Password)
        self.show_secret.setText("Hide" if on else "Show")

    def _copy_secret(self) -> None:
        if self.secret_value:
            QGuiApplication.clipboard().setText(self.secret_value)

    def _ask_rotate(self) -> None:
        answer = QMessageBox.question(
            self, "Rotate the cluster secret?",
            "A new secret takes effect when the node restarts, and every other node must "
            "be given it (shoal secret set ...) or it leaves the cluster. Rotate now?")
        if answer == QMessageBox.StandardButton.Yes:
            self.rotate()

    def rotate(self) -> None:
        self.secret_info.setText("Rotating…")
        self.load_secret("rotate")

    def refresh_peers(self) -> None:
        self.tasks.run(self.client.peers, on_done=self._fill_peers,
                       on_error=lambda e: self.peer_message.setText(
                           f"Couldn't list peers: {message_of(e)}"), owner=self)

    def _fill_peers(self, peers: list[PeerInfo]) -> None:
        self.peer_list.clear()
        for p in peers:
            state = ("in the cluster" if p.trusted else
                     p.error or ("not answering" if not p.reachable else "?"))
            self.peer_list.addItem(f"{p.name or '?'} — {p.url} — {state}")
        self.peer_list.setVisible(bool(peers))
        self.no_peers.setVisible(not peers)

    def add_peer(self) -> None:
        address = self.peer_edit.text().strip()
        if ":" not in address:
            self.peer_message.setText("Give host:port, e.g. 192.168.1.20:8422.")
            return
        self.add_peer_button.setEnabled(False)

        def done(_peer: PeerInfo) -> None:
            self.add_peer_button.setEnabled(True)
            self.peer_edit.clear()
            self.peer_message.setText(f"Added {address}; it shows in the topology once it "
                                      "answers.")
            self.refresh_peers()

        def failed(e: BaseException) -> None:
            self.add_peer_button.setEnabled(True)
            self.peer_message.setText(f"Couldn't add {address}: {message_of(e)}")
        self.tasks.run(self.client.add_peer, address, on_done=done, on_error=failed, owner=self)

    # --- API ------------------------------------------------------------------------------
    def _api_tab(self) -> QWidget:
        current = self.opened = node_settings(self.settings)
        self.host_edit = QLineEdit(current.host)
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1, 65535)
        self.port_spin.setValue(current.port)
        self.key_edit = QLineEdit(current.api_key or "")
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("none (only allowed on 127.0.0.1)")
        self.cors_edit = QLineEdit(" ".join(current.cors_origins))
        self.cors_edit.setPlaceholderText("none (e.g. http://localhost:3000 for a web UI)")
        self.hosts_edit = QLineEdit(" ".join(current.allowed_hosts))
        self.hosts_edit.setPlaceholderText("none (names clients use besides this machine's "
                                           "own, e.g. shoal.lan)")
        self.spec_box = QCheckBox("Draft tokens and verify them in one pass where that is "
                                  "faster (the answers stay the same)")
        self.spec_box.setChecked(current.speculative)
        self.draft_edit = QLineEdit(current.draft_model)
        self.draft_edit.setPlaceholderText("none: drafts from the conversation itself (a "
                                           "smaller model of the same family, by id)")
        self.api_message = QLabel("Shoal's engine uses these once it restarts. The cluster "
                                  "port (for other nodes) is this port + 1.")
        self.api_message.setWordWrap(True)
        save = QPushButton("Save")
        save.clicked.connect(self.save_api)
        self.restart_button = QPushButton("Restart now")
        self.restart_button.setToolTip("Restart Shoal's engine with these settings (a reply "
                                       "being written stops)")
        self.restart_button.clicked.connect(self._restart_now)
        self.restart_button.hide()
        buttons = QHBoxLayout()
        buttons.addWidget(save)
        buttons.addWidget(self.restart_button)
        buttons.addStretch(1)
        tab = QWidget()
        form = QFormLayout(tab)
        form.addRow("Bind address:", self.host_edit)
        form.addRow("Port:", self.port_spin)
        form.addRow("API key:", self.key_edit)
        form.addRow("Browser origins (CORS):", self.cors_edit)
        form.addRow("Other host names:", self.hosts_edit)
        form.addRow("Speculative decoding:", self.spec_box)
        form.addRow("Draft model:", self.draft_edit)
        form.addRow("", buttons)
        form.addRow("", self.api_message)
        return tab

    def save_api(self) -> bool:
        host, key = self.host_edit.text().strip(), self.key_edit.text().strip()
        origins = parse_origins(self.cors_edit.text())
        hosts = parse_hosts(self.hosts_edit.text())
        problem = check_api(host, key) or check_origins(origins) or check_hosts(hosts)
        if problem:
            self.api_message.setText(problem)
            theme.set_role(self.api_message, "error")
            return False
        self.settings.setValue(NODE_HOST, host)
        self.settings.setValue(NODE_PORT, self.port_spin.value())
        try:  # bounded: a keyring that doesn't answer in 3 s is given up for the file
            where = store_api_key(self.settings, key or None)
        except OSError as e:
            self.api_message.setText(f"Couldn't store the API key: {e}")
            theme.set_role(self.api_message, "error")
            return False
        self.settings.setValue(NODE_CORS, " ".join(origins))
        self.settings.setValue(NODE_HOSTS, " ".join(hosts))
        self.settings.setValue(NODE_SPECULATIVE, self.spec_box.isChecked())
        self.settings.setValue(NODE_DRAFT, self.draft_edit.text().strip())
        self.settings.sync()
        theme.set_role(self.api_message, None)
        kept = f" The key is kept in {wrappable(where)}." if key else ""
        self.restart_button.setVisible(self.restartable)
        if self.restartable:
            when = "Restart now applies them (a reply being written stops)."
        else:
            when = ("They apply when Shoal starts its own engine (the one running now was "
                    "started by another program).")
        self.api_message.setText(f"Saved. {when}{kept}")
        self.api_message.setToolTip(f"Saved in {self.settings.fileName()}")
        return True

    def _restart_now(self) -> None:
        self.restart_button.setEnabled(False)
        self.api_message.setText("Restarting Shoal's engine with these settings…")
        self.restart_requested.emit()

    # --- models ---------------------------------------------------------------------------
    def _models_tab(self, models_dir: str | None) -> QWidget:
        folder = models_dir or str(self.home / "models")
        self.models_dir = QLineEdit(folder)
        self.models_dir.setReadOnly(True)
        self.models_dir.setAccessibleName("Models folder")
        open_button = QPushButton("Open")
        open_button.setAccessibleName("Open the models folder")
        open_button.clicked.connect(
            lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(self.models_dir.text())))
        row = QHBoxLayout()
        row.addWidget(self.models_dir, 1)
        row.addWidget(open_button)
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setAccessibleName("Hugging Face token")
        self.token_edit.setPlaceholderText("hf_… (for gated models; kept in the keyring)")
        self.token_button = QPushButton("Save token")
        self.token_button.clicked.connect(self.save_token)
        self.token_message = QLabel()
        self.token_message.setWordWrap(True)
        token_row = QHBoxLayout()
        token_row.addWidget(self.token_edit, 1)
        token_row.addWidget(self.token_button)
        tab = QWidget()
        form = QFormLayout(tab)
        form.addRow("Models folder:", row)
        form.addRow("", QLabel("Models imported or downloaded by Shoal live here (and in "
                               "the Hugging Face cache)."))
        form.addRow("Hugging Face token:", token_row)
        form.addRow("", self.token_message)
        return tab

    def save_token(self) -> None:
        token = self.token_edit.text().strip()
        if not token:
            self.token_message.setText("Paste a token from huggingface.co/settings/tokens.")
            return
        self.token_button.setEnabled(False)
        self.token_message.setText("Checking and storing the token…")

        def done(text: str) -> None:
            self.token_button.setEnabled(True)
            self.token_edit.clear()
            self.token_message.setText(text or "Stored.")

        def failed(e: BaseException) -> None:
            self.token_button.setEnabled(True)
            self.token_message.setText(message_of(e))
        self.tasks.run(self.client.set_hf_token, token, on_done=done, on_error=failed,
                       owner=self)

    # --- general --------------------------------------------------------------------------
    def _set_login(self, on: bool) -> None:
        from app import autostart
        try:
            autostart.enable(self.home) if on else autostart.disable()
        except OSError as e:
            log.warning("can't change the login item: %s", e)
            self.login_box.blockSignals(True)
            self.login_box.setChecked(autostart.enabled())
            self.login_box.blockSignals(False)

    def _set_menubar_only(self, on: bool) -> None:
        from app import autostart
        self.settings.setValue(MENUBAR_ONLY, bool(on))
        autostart.set_menubar_only(on)

    def _general_tab(self, tray_available: bool) -> QWidget:
        self.keep_box = QCheckBox("Keep running in the background (in the tray) when the "
                                  "window closes")
        self.keep_box.setEnabled(tray_available)
        self.keep_box.setChecked(tray_available and str(
            self.settings.value(KEEP_IN_TRAY, False)).lower() in ("true", "1"))
        self.keep_box.toggled.connect(lambda on: self.settings.setValue(KEEP_IN_TRAY,
                                                                        bool(on)))
        from app import autostart
        self.login_box = QCheckBox("Start Shoal when I log in")
        self.login_box.setChecked(autostart.enabled())
        self.login_box.toggled.connect(self._set_login)
        self.menubar_box = QCheckBox("Menubar only: no Dock icon (macOS)")
        self.menubar_box.setEnabled(sys.platform == "darwin" and tray_available)
        self.menubar_box.setChecked(str(self.settings.value(MENUBAR_ONLY, False)).lower()
                                    in ("true", "1"))
        self.menubar_box.toggled.connect(self._set_menubar_only)
        note = QLabel("" if tray_available else "This desktop has no tray, so closing the "
                      "window quits Shoal.")
        theme.set_role(note, "muted")
        self.appearance_box = QComboBox()
        self.appearance_box.setAccessibleName("Appearance")
        for key, text in MODES:
            self.appearance_box.addItem(text, key)
        self.appearance_box.setCurrentIndex(max(self.appearance_box.findData(
            str(self.settings.value(APPEARANCE, "system"))), 0))
        self.appearance_box.currentIndexChanged.connect(
            lambda _i: self.appearance_changed.emit(self.appearance_box.currentData()))
        look = QFormLayout()
        look.addRow("&Appearance:", self.appearance_box)
        tab = QWidget()
        layout = QVBoxLayout(tab)
        layout.addLayout(look)
        layout.addWidget(self.keep_box)
        layout.addWidget(self.login_box)
        layout.addWidget(self.menubar_box)
        layout.addWidget(note)
        layout.addStretch(1)
        layout.setAlignment(Qt.AlignmentFlag.AlignTop)
        return tab
