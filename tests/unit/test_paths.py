"""Where specrag keeps its files: the data and cache dirs from the environment."""

from specrag.paths import cache_dir, data_dir, default_index_dir


def test_a_tilde_in_the_environment_is_the_home_folder(tmp_path, monkeypatch):
    """A quoted ``~`` (an env file, systemd, docker) was a folder named "~" in the working
    directory for the checkpoints, while the index path was expanded: two places."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SPECRAG_DATA_DIR", "~/data")
    monkeypatch.setenv("SPECRAG_CACHE_DIR", "~/cache")
    assert data_dir() == tmp_path / "data" and default_index_dir() == tmp_path / "data" / "index"
    assert cache_dir() == tmp_path / "cache"


def test_a_home_of_no_such_user_in_the_environment_is_one_line(monkeypatch, capsys):
    """``SPECRAG_DATA_DIR='~nosuchuser/d'`` ended ``ask`` with "RuntimeError: Could not
    determine home directory." and exit 1, where a path option says it in one line (exit 2)."""
    from specrag.cli import main

    monkeypatch.setenv("SPECRAG_DATA_DIR", "~specrag-no-such-user/d")
    assert main(["ask", "Who led the Norse?"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "specrag: error: SPECRAG_DATA_DIR=~specrag-no-such-user/d: Could not determine home "
        "directory"
    ]
