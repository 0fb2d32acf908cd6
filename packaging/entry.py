"""Entry point of the frozen app (PyInstaller). The GUI, the node and its workers start
children as `sys.executable -m MODULE ...` or `-c CODE`, as with a Python interpreter; in
the bundle sys.executable is this program, so it answers those two forms too."""

import runpy
import sys


def main() -> int:
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
