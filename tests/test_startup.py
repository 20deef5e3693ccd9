"""What a loop says when it is made (_startup): its startup line, once per
process and settings, and a warning for each unknown ASYNCIO_RELAXED_*
variable naming the closest setting; to a server's error log where the
application configured no logging for ours."""

from __future__ import annotations

import logging
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

import asyncio_relaxed
from asyncio_relaxed import _startup

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _forget() -> None:
    _startup._announced.clear()
    _startup._warned.clear()


def test_the_startup_line_names_version_backend_and_changed_settings(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="asyncio_relaxed"):
        loop = asyncio_relaxed.new_event_loop(write="deferred", accept="balanced")
        loop.close()
        again = asyncio_relaxed.new_event_loop(write="deferred", accept="balanced")
        again.close()
        plain = asyncio_relaxed.new_event_loop()
        plain.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "asyncio_relaxed"]
    assert lines == [
        f"asyncio_relaxed {asyncio_relaxed.__version__} ({_impl()}, "
        f"{loop.statistics().backend}) in process {os.getpid()}: write=deferred accept=balanced",
        f"asyncio_relaxed {asyncio_relaxed.__version__} ({_impl()}, "
        f"{plain.statistics().backend}) in process {os.getpid()}: default settings",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records)


def _impl() -> str:
    import platform

    return f"{platform.python_implementation()} {platform.python_version()}"


def test_an_unknown_variable_is_named_with_the_closest_setting(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCIO_RELAXED_WRTE", "deferred")
    monkeypatch.setenv("ASYNCIO_RELAXED_ZZZ", "1")
    monkeypatch.setenv("ASYNCIO_RELAXED_EMPTY", "")  # set to nothing: nothing to ignore
    with caplog.at_level(logging.WARNING, logger="asyncio_relaxed"):
        for _ in range(2):
            asyncio_relaxed.new_event_loop().close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    version = asyncio_relaxed.__version__
    assert warnings == [
        f"ASYNCIO_RELAXED_WRTE is not a setting of asyncio_relaxed {version} and is ignored; "
        "did you mean ASYNCIO_RELAXED_WRITE?",
        f"ASYNCIO_RELAXED_ZZZ is not a setting of asyncio_relaxed {version} and is ignored",
    ]


_SERVER_LOG = """
import logging, sys
import asyncio_relaxed
server = logging.getLogger(sys.argv[1])
handler = logging.StreamHandler(sys.stdout)
handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
server.addHandler(handler)
server.setLevel(logging.INFO)
asyncio_relaxed.new_event_loop(accept="single").close()
"""


@pytest.mark.parametrize("server", _startup.SERVER_LOGGERS)
def test_without_logging_configured_a_servers_error_log_takes_the_line(server: str) -> None:
    env = {**os.environ, "ASYNCIO_RELAXED_ACEPT": "single"}
    out = subprocess.run([sys.executable, "-c", _SERVER_LOG, server], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"{server} WARNING ASYNCIO_RELAXED_ACEPT is not a setting")
    assert lines[0].endswith("did you mean ASYNCIO_RELAXED_ACCEPT?")
    assert lines[1].startswith(f"{server} INFO asyncio_relaxed {asyncio_relaxed.__version__} (")
    assert lines[1].endswith(": accept=single")
    assert len(lines) == 2 and out.stderr == ""


def test_without_any_logging_the_warning_reaches_stderr() -> None:
    env = {**os.environ, "ASYNCIO_RELAXED_WRTE": "eager"}
    out = subprocess.run([sys.executable, "-c", "import asyncio_relaxed; "
                          "asyncio_relaxed.new_event_loop().close()"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout == ""
    assert out.stderr.strip() == (
        f"ASYNCIO_RELAXED_WRTE is not a setting of asyncio_relaxed {asyncio_relaxed.__version__}"
        " and is ignored; did you mean ASYNCIO_RELAXED_WRITE?")


@pytest.mark.slow
def test_uvicorn_log_level_info_shows_the_loop() -> None:
    pytest.importorskip("uvicorn")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "ASYNCIO_RELAXED_WRITE": "deferred"}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests._asgi_app:app", "--port", str(port),
         "--loop", "asyncio_relaxed:new_event_loop", "--log-level", "info"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline:
            line = server.stdout.readline()  # type: ignore[union-attr]
            if not line:
                break
            seen.append(line)
            if "Uvicorn running" in line:
                break
        text = "".join(seen)
        assert f"asyncio_relaxed {asyncio_relaxed.__version__} (" in text, text
        assert f"in process {server.pid}: write=deferred" in text, text
    finally:
        server.terminate()
        server.wait(timeout=30)
        server.stdout.close()  # type: ignore[union-attr]
