"""Secrets never need the command line, where `ps` shows them to every user of the
machine: `shoal node` reads its API key and cluster secret from a file or the environment
(a value on the command line still works, with a warning), and `shoal secret set` reads
the secret from stdin or a file."""

from __future__ import annotations

import io

import pytest

from engine.cli import main, read_secret_file, secret_arg


def test_a_secret_file_gives_its_first_line(tmp_path):
    f = tmp_path / "key"
    f.write_text("  s3cret \nthe rest is ignored\n")
    assert read_secret_file(str(f), "--api-key-file") == "s3cret"


@pytest.mark.parametrize(("name", "text", "says"), [
    ("missing", None, "there is no file"),
    ("", None, "could not read"),  # a folder
    ("empty", "\n  \nthe key, a line too late", "the first line of .* is empty"),
])
def test_a_secret_file_that_gives_nothing_is_an_error_naming_it(tmp_path, name, text, says):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=f"--secret-file: {says}") as e:
        read_secret_file(str(path), "--secret-file")
    assert str(path) in str(e.value)


def test_a_value_on_the_command_line_works_but_warns_and_names_the_safer_ways(capsys,
                                                                            monkeypatch):
    monkeypatch.delenv("SHOAL_API_KEY", raising=False)
    assert secret_arg("--api-key", "k", None, "SHOAL_API_KEY", "use SHOAL_API_KEY") == "k"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--api-key" in err and "`ps`" in err \
        and "every user" in err and "use SHOAL_API_KEY" in err


def test_the_file_comes_first_then_the_command_line_then_the_environment(tmp_path, capsys,
                                                                        monkeypatch):
    f = tmp_path / "key"
    f.write_text("from-file\n")
    monkeypatch.setenv("SHOAL_API_KEY", "from-env")
    assert secret_arg("--api-key", None, str(f), "SHOAL_API_KEY", "") == "from-file"
    assert secret_arg("--api-key", None, None, "SHOAL_API_KEY", "") == "from-env"
    assert capsys.readouterr().err == ""  # neither shows in `ps`
    monkeypatch.delenv("SHOAL_API_KEY")
    assert secret_arg("--api-key", None, None, "SHOAL_API_KEY", "") is None


@pytest.mark.parametrize("flag", ["--api-key-file", "--secret-file"])
def test_the_node_wont_start_with_a_secret_file_it_cant_read(tmp_path, capsys, flag):
    code = main(["node", "--home", str(tmp_path), "--model", "none", flag,
                 str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2 and f"shoal node: {flag}: there is no file {tmp_path / 'nope'}" in err


def test_the_nodes_help_says_where_secrets_may_come_from(capsys):
    with pytest.raises(SystemExit):
        main(["node", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for way in ("--api-key-file PATH", "SHOAL_API_KEY", "--secret-file PATH", "SHOAL_SECRET",
                "shoal secret set -", "`ps` shows it to every user"):
        assert way in text, way


def test_a_key_and_a_key_file_together_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["node", "--api-key", "k", "--api-key-file", str(tmp_path / "k")])
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_KEYRING", "0")  # never the user's keyring
    return tmp_path


def stored(home):
    from engine.cluster.secret import SecretStore
    return SecretStore(home, use_keyring=False).get()


def test_secret_set_reads_stdin_so_the_secret_needs_no_argument(home, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("from-stdin\n"))
    assert main(["secret", "set", "-", "--home", str(home)]) == 0
    assert stored(home) == "from-stdin" and capsys.readouterr().err == ""


def test_secret_set_reads_a_file(home, capsys):
    (home / "s").write_text("from-file\n")
    assert main(["secret", "set", "--file", str(home / "s"), "--home", str(home)]) == 0
    assert stored(home) == "from-file" and capsys.readouterr().err == ""


def test_secret_set_with_the_value_still_works_and_warns(home, capsys):
    assert main(["secret", "set", "old-way", "--home", str(home)]) == 0
    assert stored(home) == "old-way" and "`ps`" in capsys.readouterr().err


@pytest.mark.parametrize("stdin", ["", "\n"])
def test_secret_set_with_nothing_to_read_says_how(home, monkeypatch, capsys, stdin):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main(["secret", "set", "-", "--home", str(home)]) == 2
    assert main(["secret", "set", "--home", str(home)]) == 2  # not a terminal: no prompt
    err = capsys.readouterr().err
    assert "pipe the secret in" in err and "shoal secret set -" in err
    assert stored(home) is None


def test_secret_set_from_a_missing_file_is_a_clear_error(home, capsys):
    assert main(["secret", "set", "--file", str(home / "nope"), "--home", str(home)]) == 2
    assert "--file: there is no file" in capsys.readouterr().err and stored(home) is None
