"""The settings dialog: the cluster secret through the app's node (show, copy, rotate),
the API the app's node will serve (checked, kept in app.ini but the key in the keyring,
used at its next start), and the background setting the window shares."""

import os
import stat
import sys
import types

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QGuiApplication

from app.node import LocalNode
from app.settings import KEEP_IN_TRAY, NODE_API_KEY, SettingsDialog, node_settings
from app.tasks import Tasks
from engine.client import NodeClient
from engine.cluster.secret import SecretStore


@pytest.fixture
def dialog(qtbot, home, port, monkeypatch):
    monkeypatch.setenv("SHOAL_KEYRING", "0")  # secrets stay in the home
    tasks = Tasks()
    client = NodeClient(f"http://127.0.0.1:{port}", timeout=1)  # no node: peers fail
    settings = QSettings(str(home / "app.ini"), QSettings.Format.IniFormat)
    d = SettingsDialog(home, settings, client, tasks, tray_available=True)
    qtbot.addWidget(d)
    d.show()
    yield d
    assert tasks.wait(20000)
    client.close()


def test_secret_is_shown_copied_and_rotated(qtbot, home, port, node_command, monkeypatch):
    monkeypatch.setenv("SHOAL_KEYRING", "0")  # the node keeps the secret in the home
    node = LocalNode(home, port, command=node_command(port), start_timeout=30)
    tasks = Tasks()
    try:
        node.start()
        settings = QSettings(str(home / "app.ini"), QSettings.Format.IniFormat)
        dialog = SettingsDialog(home, settings, node.client, tasks, tray_available=True)
        qtbot.addWidget(dialog)
        dialog.show()
        qtbot.waitUntil(lambda: dialog.secret_value is not None, timeout=20000)
        stored = SecretStore(home).get()
        assert dialog.secret_value == stored and dialog.secret_edit.text() == stored
        assert dialog.secret_edit.echoMode() == dialog.secret_edit.EchoMode.Password
        qtbot.mouseClick(dialog.show_secret, Qt.MouseButton.LeftButton)
        assert dialog.secret_edit.echoMode() == dialog.secret_edit.EchoMode.Normal
        qtbot.mouseClick(dialog.copy_secret, Qt.MouseButton.LeftButton)
        assert QGuiApplication.clipboard().text() == stored
        assert "Pairing code" in dialog.secret_info.text()

        dialog.rotate()
        qtbot.waitUntil(lambda: dialog.secret_value != stored, timeout=20000)
        assert SecretStore(home).get() == dialog.secret_value
        assert tasks.wait(20000)
    finally:
        node.stop()


def test_without_a_node_the_dialog_says_so(qtbot, dialog):
    qtbot.waitUntil(lambda: "Couldn't read the cluster secret" in dialog.secret_info.text(),
                    timeout=10000)
    qtbot.waitUntil(lambda: "Couldn't list peers" in dialog.peer_message.text(),
                    timeout=10000)


def test_api_settings_are_checked_and_used_at_the_next_start(qtbot, dialog, home):
    dialog.host_edit.setText("0.0.0.0")
    dialog.key_edit.setText("")
    assert not dialog.save_api()
    assert "API key" in dialog.api_message.text()

    dialog.key_edit.setText("s3cret")
    dialog.port_spin.setValue(9123)
    assert dialog.save_api()
    saved = node_settings(QSettings(str(home / "app.ini"), QSettings.Format.IniFormat))
    assert (saved.host, saved.port, saved.api_key) == ("0.0.0.0", 9123, "s3cret")
    assert "s3cret" not in (home / "app.ini").read_text()  # the key is kept elsewhere
    assert "readable only by you" in dialog.api_message.text()  # no keyring in tests
    assert stat.S_IMODE((home / "api-key").stat().st_mode) == 0o600
    node = LocalNode(home, saved.port, host=saved.host, api_key=saved.api_key)
    assert node.url == "http://127.0.0.1:9123"  # reached on loopback from here
    assert node.command[node.command.index("--host") + 1] == "0.0.0.0"
    node.client.close()


def test_keep_running_in_the_background(qtbot, dialog):
    qtbot.mouseClick(dialog.keep_box, Qt.MouseButton.LeftButton)
    assert dialog.settings.value(KEEP_IN_TRAY) in (True, "true")
    dialog.token_edit.setText("")
    dialog.save_token()
    assert "Paste a token" in dialog.token_message.text()


def test_cors_origins_are_checked_and_handed_to_the_node(qtbot, dialog, home):
    from app.settings import saved_cors_origins
    dialog.host_edit.setText("127.0.0.1")
    dialog.cors_edit.setText("localhost:3000")
    assert not dialog.save_api() and "not an origin" in dialog.api_message.text()
    dialog.cors_edit.setText("http://localhost:3000, https://ui.example/")
    assert dialog.save_api()
    assert saved_cors_origins(home) == ("http://localhost:3000", "https://ui.example")


def _ini(home) -> QSettings:
    return QSettings(str(home / "app.ini"), QSettings.Format.IniFormat)


def test_a_plain_text_key_is_moved_out_of_app_ini(home, monkeypatch):
    monkeypatch.setenv("SHOAL_KEYRING", "0")
    old = _ini(home)
    old.setValue(NODE_API_KEY, "left-by-an-old-shoal")
    old.sync()
    assert node_settings(_ini(home)).api_key == "left-by-an-old-shoal"
    assert "left-by-an-old-shoal" not in (home / "app.ini").read_text()
    assert (home / "api-key").read_text() == "left-by-an-old-shoal"
    assert node_settings(_ini(home)).api_key == "left-by-an-old-shoal"  # read from there now


def test_the_key_goes_to_the_keyring_when_one_works(qtbot, home, monkeypatch):
    data: dict = {}
    fake = types.SimpleNamespace(get_password=lambda s, a: data.get((s, a)),
                                 set_password=lambda s, a, v: data.__setitem__((s, a), v),
                                 delete_password=lambda s, a: data.pop((s, a)))
    monkeypatch.setitem(sys.modules, "keyring", fake)
    monkeypatch.setenv("SHOAL_KEYRING", "1")
    from app.settings import store_api_key
    ini = _ini(home)
    assert store_api_key(ini, "in-the-keyring") == "the system keyring"
    ini.sync()
    assert node_settings(_ini(home)).api_key == "in-the-keyring"
    assert not (home / "api-key").exists()
    assert "in-the-keyring" not in (home / "app.ini").read_text()
    store_api_key(ini, None)
    assert data == {} and node_settings(ini).api_key is None


def test_no_keyring_call_when_no_key_was_stored(home, monkeypatch):
    def hang(*a):
        raise AssertionError("the keyring was asked")
    monkeypatch.setitem(sys.modules, "keyring",
                        types.SimpleNamespace(get_password=hang, set_password=hang))
    monkeypatch.setenv("SHOAL_KEYRING", "1")
    assert node_settings(_ini(home)).api_key is None


def test_host_names_are_checked_and_the_node_answers_to_them(qtbot, dialog, home, port,
                                                             node_command):
    import httpx
    dialog.host_edit.setText("127.0.0.1")
    dialog.hosts_edit.setText("http://shoal.lan")
    assert not dialog.save_api() and "not a host name" in dialog.api_message.text()
    dialog.hosts_edit.setText("Shoal.LAN, my-box")
    assert dialog.save_api()
    node = LocalNode(home, port, command=node_command(port), start_timeout=30)
    try:
        node.start()
        ok = httpx.get(node.url + "/shoal/status", headers={"Host": f"shoal.lan:{port}"})
        assert ok.status_code == 200
        no = httpx.get(node.url + "/shoal/status", headers={"Host": "evil.example"})
        assert no.status_code == 403
    finally:
        node.stop()


def test_drafting_settings_reach_the_node_the_app_starts(qtbot, dialog, home, tmp_path):
    """Settings → API: speculative decoding off, or a draft model; the node the app starts
    reads them from its environment (a draft model it doesn't have stops it, naming it)."""
    import subprocess

    from app.settings import saved_drafting_env
    assert dialog.spec_box.isChecked()  # on by default
    assert saved_drafting_env(home) == {"SHOAL_SPECULATIVE": "on"}
    dialog.host_edit.setText("127.0.0.1")
    dialog.spec_box.setChecked(False)
    dialog.draft_edit.setText("no-such-draft")
    assert dialog.save_api()
    env = saved_drafting_env(home)
    assert env == {"SHOAL_SPECULATIVE": "off", "SHOAL_DRAFT_MODEL": "no-such-draft"}
    out = subprocess.run(
        [sys.executable, "-m", "engine.cli", "node", "--home", str(tmp_path / "n"),
         "--model", "none", "--port", "0", "--mdns", "off"],
        env={**os.environ, **env, "SHOAL_KEYRING": "0"}, capture_output=True, text=True,
        timeout=60)
    assert out.returncode != 0 and "no-such-draft" in out.stdout + out.stderr


class _Answers:
    """A stand-in for the node's client: a secret kept in a long folder, no peers."""

    def __init__(self, where: str):
        self.where = where

    def cluster_secret(self, rotate: bool) -> dict:
        return {"secret": "s" * 43, "pairing": "K7Q-2MX", "where": self.where}

    def peers(self) -> list:
        return []


def lines(label) -> list[str]:
    """The lines a word-wrapped label shows at its width."""
    from PySide6.QtGui import QTextLayout, QTextOption
    text, width = label.text(), label.contentsRect().width()
    layout = QTextLayout(text, label.font())
    option = QTextOption()
    option.setWrapMode(QTextOption.WrapMode.WordWrap)
    layout.setTextOption(option)
    layout.beginLayout()
    shown = []
    while (line := layout.createLine()).isValid():
        line.setLineWidth(width)
        assert line.naturalTextWidth() <= width
        shown.append(text[line.textStart():line.textStart() + line.textLength()])
    layout.endLayout()
    return shown


def test_a_long_path_and_no_peers_read_whole_at_laptop_size(qtbot, home):
    """At 1366x768 nothing is cut: the pairing line's folder breaks only after its
    slashes (not inside a name) and an empty peer list is a sentence that wraps, not a
    list row cut at the right."""
    where = ("/home/alexandramontgomeryfitzwilliam/.local/share/shoalclusterstatekeptfor"
             "thewholelaboratory/secrets/cluster.secret (readable only by you)")
    tasks = Tasks()
    settings = QSettings(str(home / "app.ini"), QSettings.Format.IniFormat)
    d = SettingsDialog(home, settings, _Answers(where), tasks, tray_available=True)
    qtbot.addWidget(d)
    d.show()
    qtbot.waitUntil(lambda: d.secret_value is not None and d.no_peers.isVisible())
    assert d.minimumSizeHint().width() <= 1366 and d.width() <= 1366
    for label in (d.secret_info, d.no_peers):
        qtbot.waitUntil(lambda lb=label: lb.heightForWidth(lb.width()) <= lb.height())
        shown = lines(label)
        assert len(shown) > 1  # it wraps ...
        for line in shown[:-1]:  # ... between words, or after a folder's slash
            assert line.endswith((" ", "/\u200b")), shown
    assert where in d.secret_info.text().replace("\u200b", "")
    assert not d.peer_list.isVisible()
    assert d.no_peers.text().startswith("No peers yet")
    assert tasks.wait(5000)
