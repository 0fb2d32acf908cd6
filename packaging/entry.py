"""Entry point of the frozen app (PyInstaller). The GUI, the node and its workers start
children as `sys.executable -m MODULE ...` or `-c CODE`, as with a Python interpreter; in
the bundle sys.executable is this program, so it answers those two forms too."""

import os
import runpy
import sys


def _system_library_path() -> None:
    """PyInstaller's bootloader points LD_LIBRARY_PATH at the bundle; system tools the node
    runs (ip, ibv_devices, a browser) must get the system's libraries, not our libssl. This
    process already read it at startup, and children that are this app set it again."""
    original = os.environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is not None:
        os.environ["LD_LIBRARY_PATH"] = original
    else:
        os.environ.pop("LD_LIBRARY_PATH", None)


def main() -> int:
    if sys.platform.startswith("linux"):
        _system_library_path()
    argv = sys.argv[1:]
    if len(argv) >= 2 and argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's path in argv[0]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    if len(argv) >= 2 and argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        return 0
    from app.cli import main as shoal
    return shoal(argv)


if __name__ == "__main__":
    sys.exit(main())
