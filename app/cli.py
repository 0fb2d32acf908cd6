"""The `shoal` command's front door: with no subcommand it opens the app, otherwise it
hands over to the engine's CLI (which never imports Qt)."""

from __future__ import annotations

import sys

from engine.cli import main as engine_main
from engine.cli import parser

APP_VALUE_OPTIONS = ("--home", "--port", "--log-level")  # the app's options that take a value


def engine_command(argv: list[str]) -> bool:
    """Does argv name one of the engine's subcommands (node, models, ...)? The first word
    that is neither an option nor an option's value decides, so `shoal --port 8421` opens
    the app instead of reading 8421 as a subcommand."""
    import argparse

    names: set[str] = set()
    for action in parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            names.update(action.choices)
    value_next = False
    for a in argv:
        if value_next:
            value_next = False
        elif a in APP_VALUE_OPTIONS:
            value_next = True
        elif not a.startswith("-"):
            return a in names
    return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--self-test" in argv:  # also in the frozen app: is MLX and the default model working?
        from engine.selftest import main as self_test
        return self_test([a for a in argv if a != "--self-test"])
    if engine_command(argv):
        return engine_main(argv)
    from app.main import main as app_main
    return app_main(["shoal", *argv])


if __name__ == "__main__":
    sys.exit(main())
