"""Starting a real server process for an integration test, and waiting for it to answer."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    """A TCP port nobody listens on now (localhost)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(
    cmd: list[str],
    health_url: str,
    log_path: Path,
    *,
    timeout_s: float = 120,
    poll_s: float = 1.0,
    **popen: object,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` until the block ends; fail the test (with its log) if ``health_url`` never
    answers 200 or the process exits first."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **popen)  # type: ignore[call-overload]
        try:
            deadline = time.time() + timeout_s
            while True:
                try:
                    if httpx.get(health_url, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    pytest.fail(f"{cmd[0]} exited:\n" + log_path.read_text()[-3000:])
                if time.time() > deadline:
                    pytest.fail(f"{cmd[0]} did not start:\n" + log_path.read_text()[-3000:])
                time.sleep(poll_s)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
