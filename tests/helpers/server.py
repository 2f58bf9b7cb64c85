"""A `chat/serve.py` process for a test, and OpenAI's error object checked."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.helpers.paths import ROOT


@contextlib.contextmanager
def running_server(log: Path, *flags: str, timeout: float = 120) -> Iterator[str]:
    """A `chat/serve.py` process with these flags on a free port (`--port 0`) and one thread; yields its
    address once /health answers, stops it afterwards, and fails if its log holds a traceback."""
    # the repository first, then whatever the caller's path holds (the GPU kit's wheels live there)
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "chat" / "serve.py"), "--port", "0", *flags],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        yield wait_until_healthy(proc, log, timeout)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def assert_openai_error(reply: httpx.Response, status: int, pattern: str) -> dict:
    """The reply is OpenAI's error object with this status, its message matching `pattern`; returns it."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert re.search(pattern, error["message"]), error
    assert error["type"] == "invalid_request_error" and set(error) == {"message", "type", "param", "code"}
    return error


def wait_until_healthy(proc: subprocess.Popen, log: Path, timeout: float = 120) -> str:
    """The address a `chat/serve.py` process logs (it listens on `--port 0`), once its /health answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        found = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", log.read_text())
        if found:
            try:
                if httpx.get(found[1] + "/health", timeout=5).status_code == 200:
                    return found[1]
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    raise AssertionError("the server did not come up: " + log.read_text()[-3000:])

