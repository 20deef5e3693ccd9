"""What a loop says when it is made (_startup): its startup line, once per
process and settings, at DEBUG on our logger unless the application asked
for it at INFO or a server's error log announces its workers; and a warning
for each unknown ASYNCIO_RELAXED_* variable naming the closest setting, to a
server's error log where the application configured no logging for ours.
(tests/test_logs.py holds the rest of the loop's logging to stock's.)"""

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
def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's loops say their line and warnings again, and see (as do
    the processes it starts) only the ASYNCIO_RELAXED_* variables it sets,
    none of the caller's."""
    for name in list(os.environ):
        if name.startswith("ASYNCIO_RELAXED_"):
            monkeypatch.delenv(name)
    _startup._announced.clear()
    _startup._warned.clear()


def test_the_startup_line_names_version_backend_and_changed_settings(
        caplog: pytest.LogCaptureFixture) -> None:
    # Our logger's own level set to INFO: the application asks for the line.
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
        f"{loop.statistics().backend}, {loop._build}) in process {os.getpid()}: "
        "write=deferred accept=balanced",
        f"asyncio_relaxed {asyncio_relaxed.__version__} ({_impl()}, "
        f"{plain.statistics().backend}, {plain._build}) in process {os.getpid()}: "
        "default settings",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records)


def test_with_the_level_inherited_the_startup_line_is_debug(
        caplog: pytest.LogCaptureFixture) -> None:
    """The root logger at DEBUG, ours NOTSET: the line at DEBUG, as stock's
    "Using selector" line, and nothing at INFO or above; the servers' error
    logs exist (importing the servers makes them) but no server configured
    them, so this process is no server's worker."""
    assert logging.getLogger("asyncio_relaxed").level == logging.NOTSET
    for name in _startup.SERVER_LOGGERS:
        assert not logging.getLogger(name).handlers
    with caplog.at_level(logging.DEBUG):
        asyncio_relaxed.new_event_loop(write="deferred").close()
    ours = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "asyncio_relaxed"]
    assert ours == [(logging.DEBUG, f"asyncio_relaxed {asyncio_relaxed.__version__} ({_impl()}, "
                                    f"{_backend()}, {asyncio_relaxed.BUILD}) in process "
                                    f"{os.getpid()}: write=deferred")]
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []


def test_our_level_set_above_info_keeps_the_line_out(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG), \
            caplog.at_level(logging.WARNING, logger="asyncio_relaxed"):
        asyncio_relaxed.new_event_loop().close()
    assert [r for r in caplog.records if r.name == "asyncio_relaxed"] == []


def test_the_rule_decides_logger_and_level() -> None:
    ours = logging.getLogger("asyncio_relaxed")
    assert _startup.startup_destination() == (ours, logging.DEBUG)
    ours.setLevel(logging.DEBUG)
    try:
        assert _startup.startup_destination() == (ours, logging.INFO)
        ours.setLevel(logging.ERROR)
        assert _startup.startup_destination() == (ours, logging.DEBUG)
    finally:
        ours.setLevel(logging.NOTSET)


def _backend() -> str:
    loop = asyncio_relaxed.new_event_loop()
    loop.close()
    return loop.statistics().backend


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
server.propagate = False  # as gunicorn's and uvicorn's configurations have it
if sys.argv[2] == "root":  # the application's own logging, to stderr
    logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
asyncio_relaxed.new_event_loop(accept="single").close()
"""


@pytest.mark.parametrize("server", _startup.SERVER_LOGGERS)
def test_without_logging_configured_a_servers_error_log_takes_the_line(server: str) -> None:
    env = {**os.environ, "ASYNCIO_RELAXED_ACEPT": "single"}
    out = subprocess.run([sys.executable, "-c", _SERVER_LOG, server, "none"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"{server} WARNING ASYNCIO_RELAXED_ACEPT is not a setting")
    assert lines[0].endswith("did you mean ASYNCIO_RELAXED_ACCEPT?")
    assert lines[1].startswith(f"{server} INFO asyncio_relaxed {asyncio_relaxed.__version__} (")
    assert lines[1].endswith(": accept=single")
    assert len(lines) == 2 and out.stderr == ""


@pytest.mark.parametrize("server", _startup.SERVER_LOGGERS)
def test_in_a_servers_worker_its_log_takes_the_line_whatever_else_logs(server: str) -> None:
    """The application logs everything from DEBUG on (to stderr): the
    startup line is still the server's, at INFO, where it announces its
    workers, and not the application's; the warning, bad input the
    application should hear, is the application's."""
    env = {**os.environ, "ASYNCIO_RELAXED_ACEPT": "single"}
    out = subprocess.run([sys.executable, "-c", _SERVER_LOG, server, "root"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout
    assert lines[0].startswith(f"{server} INFO asyncio_relaxed {asyncio_relaxed.__version__} (")
    assert lines[0].endswith(": accept=single")
    application = out.stderr.splitlines()
    assert application[0] == "asyncio DEBUG Using selector: DeferredSelector", out.stderr
    assert application[1].startswith(
        "asyncio_relaxed WARNING ASYNCIO_RELAXED_ACEPT is not a setting")
    assert [line for line in application if "in process" in line] == []


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
