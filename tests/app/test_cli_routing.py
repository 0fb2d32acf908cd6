"""`shoal` with app options opens the app; with an engine subcommand it runs that."""

from __future__ import annotations

import pytest

from app.cli import engine_command


@pytest.mark.parametrize("argv,engine", [
    ([], False),
    (["--home", "/tmp/h", "--port", "8421"], False),   # 8421 is --port's value
    (["--port", "8421", "-v"], False),
    (["--home", "/tmp/h", "node", "--port", "8421"], True),
    (["models", "list"], True),
    (["-v", "chat", "hi"], True),
    (["--log-level", "DEBUG"], False),
])
def test_app_options_and_subcommands_are_told_apart(argv, engine):
    assert engine_command(argv) is engine
