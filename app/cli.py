"""The `shoal` command's front door: with no subcommand it opens the app, otherwise it
hands over to the engine's CLI (which never imports Qt)."""

from __future__ import annotations

import sys

from engine.cli import parser
from engine.cli import main as engine_main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--self-test" in argv:  # also in the frozen app: is MLX and the default model working?
        from engine.selftest import main as self_test
        return self_test([a for a in argv if a != "--self-test"])
    args, _ = parser().parse_known_args(argv)
    if getattr(args, "cmd", None):
        return engine_main(argv)
    from app.main import main as app_main
    return app_main(["shoal", *argv])


if __name__ == "__main__":
    sys.exit(main())
