"""Start Shoal at login, and the macOS menubar-only mode.

macOS: a LaunchAgent (~/Library/LaunchAgents/org.shoal.app.plist, RunAtLoad) that opens
the app; Linux: an XDG autostart entry (~/.config/autostart/shoal.desktop). Menubar-only
hides the Dock icon through NSApplication's activation policy (Accessory), reached with
ctypes so the app needs no PyObjC.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import plistlib
import shlex
import sys
from pathlib import Path

log = logging.getLogger(__name__)
LABEL = "org.shoal.app"


def entry_path(system: str | None = None, home: Path | None = None) -> Path:
    """Where the login item lives on this platform."""
    system = system or sys.platform
    home = home or Path.home()
    if system == "darwin":
        return home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    return config / "autostart" / "shoal.desktop"


def launch_command(shoal_home: Path) -> list[str]:
    """The command a login item runs: this Python running the app with its home."""
    return [sys.executable, "-m", "app", "--home", str(shoal_home)]


def enable(shoal_home: Path, system: str | None = None, home: Path | None = None) -> Path:
    system = system or sys.platform
    path = entry_path(system, home)
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = launch_command(shoal_home)
    if system == "darwin":
        path.write_bytes(plistlib.dumps({"Label": LABEL, "ProgramArguments": cmd,
                                         "RunAtLoad": True, "ProcessType": "Interactive"}))
    else:
        path.write_text("[Desktop Entry]\nType=Application\nName=Shoal\n"
                        f"Exec={shlex.join(cmd)}\nX-GNOME-Autostart-enabled=true\n"
                        "Comment=Pool your machines to run large language models\n")
    log.info("Shoal starts at login (%s)", path)
    return path


def disable(system: str | None = None, home: Path | None = None) -> None:
    entry_path(system, home).unlink(missing_ok=True)


def enabled(system: str | None = None, home: Path | None = None) -> bool:
    return entry_path(system, home).is_file()


def set_menubar_only(on: bool) -> bool:
    """macOS: hide (on) or show the Dock icon. False where that isn't possible."""
    if sys.platform != "darwin":
        return False
    try:
        objc = ctypes.cdll.LoadLibrary(ctypes.util.find_library("objc") or "libobjc.dylib")
        objc.objc_getClass.restype = ctypes.c_void_p
        objc.sel_registerName.restype = ctypes.c_void_p
        send = objc.objc_msgSend
        send.restype = ctypes.c_void_p
        send.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        app = send(objc.objc_getClass(b"NSApplication"),
                   objc.sel_registerName(b"sharedApplication"))
        set_policy = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_long)(ctypes.cast(send, ctypes.c_void_p).value)
        # NSApplicationActivationPolicyRegular = 0, Accessory = 1 (no Dock icon, menubar only)
        return bool(set_policy(app, objc.sel_registerName(b"setActivationPolicy:"),
                               1 if on else 0))
    except (OSError, AttributeError, TypeError) as e:
        log.warning("can't switch the Dock icon: %s", e)
        return False
