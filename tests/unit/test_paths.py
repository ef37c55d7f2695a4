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


def test_an_empty_variable_means_the_default_folder(tmp_path, monkeypatch):
    """A mutation review (2026-12-08): reading ``SPECRAG_DATA_DIR=`` (an env or compose file
    with no value) as the working directory passed every test; the index and checkpoints
    went to ``./``."""
    from pathlib import Path

    import platformdirs

    monkeypatch.setenv("SPECRAG_DATA_DIR", "")
    monkeypatch.setenv("SPECRAG_CACHE_DIR", "")
    assert data_dir() == Path(platformdirs.user_data_dir("specrag")) and data_dir().is_absolute()
    assert cache_dir() == Path(platformdirs.user_cache_dir("specrag"))
    assert cache_dir().is_absolute()


def test_another_users_process_counts_as_running(monkeypatch):
    """A mutation review (2026-12-08): reading ``os.kill``'s PermissionError (another user's
    live process) as "no such process" passed every test; one user's run would delete
    another's GGUF conversion or BM25 scratch on a shared cache dir."""
    import errno
    import os

    from specrag.paths import process_running

    def kill(pid, sig):
        raise OSError(errno.ESRCH, "No such process") if pid == 2 else PermissionError(pid)

    monkeypatch.setattr(os, "kill", kill)
    assert process_running(1) is True
    assert process_running(2) is False
