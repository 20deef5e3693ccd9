"""asyncio_relaxed inside the tools people run asyncio with, each for real.

Every server test starts the real tool (gunicorn, uvicorn, the aiohttp example)
as a subprocess in its own session, on loopback, sends real HTTP requests with
http.client, asks which loop served them, then stops the tool with a signal
and checks that it exited cleanly.  The process group is killed in a finally
block whatever happens, and every wait has a deadline.  The pytest-asyncio and
anyio pytest-plugin tests run a small pytest session in a subprocess, with the
conftest that picks the hook or the fixture by pytest-asyncio's version.

A peer that is not installed skips its tests with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import importlib
import importlib.metadata
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import asyncio_relaxed

ROOT = Path(__file__).resolve().parent.parent
RELAXED = f"{asyncio_relaxed.Loop.__module__}.{asyncio_relaxed.Loop.__qualname__}"

# Each test's own bound; the waits inside are shorter, so a hang fails with the
# server's output rather than with a bare timeout.
pytestmark = pytest.mark.timeout(45)


def version_of(distribution: str) -> tuple[int, ...]:
    numbers = []
    for part in importlib.metadata.version(distribution).split(".")[:3]:
        digits = re.match(r"\d+", part)
        numbers.append(int(digits.group()) if digits else 0)
    return tuple(numbers)


def child_env(**settings: str) -> dict[str, str]:
    """The environment of a child: this checkout first on the path, no stray settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCIO_RELAXED_")}
    paths = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(settings)
    return env


class Server:
    """A server subprocess in its own session; a thread collects its output.

    The reader thread keeps the pipe drained, so a chatty server never blocks
    on a full pipe, and lets a test wait for a line with a deadline.
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str], pass_fds: Sequence[int] = ()):
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=tuple(pass_fds),
            start_new_session=True,  # its own process group: workers are killed with it
        )
        self._lines: list[str] = []
        self._eof = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._changed:
                self._lines.append(raw.decode(errors="replace"))
                self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "".join(self._lines)

    def describe(self) -> str:
        return f"$ {' '.join(self.argv)}\n{self.output}"

    def wait_for(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        """The first output line matching *pattern*, waiting at most *timeout* s."""
        return self.wait_for_all(pattern, 1, timeout)[0]

    def wait_for_all(self, pattern: str, count: int, timeout: float = 20) -> list[re.Match[str]]:
        """The first *count* output lines matching *pattern*, waiting at most
        *timeout* s for them."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [m for m in map(regex.search, self._lines) if m is not None]
                if len(found) >= count:
                    return found[:count]
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._eof:
                    raise AssertionError(
                        f"{len(found)} of {count} output lines matched {pattern!r} within "
                        f"{timeout} s\n{self.describe()}"
                    )
                self._changed.wait(remaining)

    def startup_lines(self, pids: Sequence[int]) -> dict[int, str]:
        """Each process of *pids*: the settings its loop's startup line names
        in the server's log at INFO, waited for."""
        version = re.escape(asyncio_relaxed.__version__)
        return {
            pid: self.wait_for(
                rf"\bINFO\b.* asyncio_relaxed {version} \(.*\) in process {pid}: (.*)$").group(1)
            for pid in pids
        }

    def startup_pids(self) -> list[int]:
        """The process of every startup line in the server's log so far."""
        version = re.escape(asyncio_relaxed.__version__)
        return sorted(int(pid) for pid in re.findall(
            rf" asyncio_relaxed {version} \(.*\) in process (\d+): ", self.output))

    def booted_workers(self, count: int) -> list[int]:
        """The pids of gunicorn's first *count* workers, as its log names them."""
        return [int(m.group(1))
                for m in self.wait_for_all(r"Booting worker with pid: (\d+)", count)]

    def stop(self, sig: signal.Signals, timeout: float = 20) -> int:
        """Send *sig* to the server and return its exit status."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running {timeout} s after {sig.name}\n{self.describe()}"
            ) from None

    def wait(self, timeout: float = 20) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s\n{self.describe()}") from None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this test started
        self.proc.wait(10)
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()


class Response:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    port: int, path: str, method: str = "GET", body: Any = None, timeout: float = 15
) -> Response:
    """One request on a new loopback connection (so a pre-forked server may
    hand it to any worker)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return Response(response.status, response.headers, response.read())
    finally:
        conn.close()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening loopback socket on a free port, handed to gunicorn as fd://N
    (on CPython: FD_BIND says why not on PyPy).

    Bound here, so there is no port to guess and no log line to parse;
    requests made before a worker is up wait in the backlog.
    """
    sock = socket.create_server(("127.0.0.1", 0), backlog=128)
    try:
        yield sock
    finally:
        sock.close()


#: gunicorn's ``fd://N`` opens the socket with ``socket.fromfd(N, AF_UNIX)``
#: and tells TCP from Unix by its address.  CPython decodes that address in
#: the family the kernel reports, PyPy (8.0.1) in the family it was given, so
#: there a TCP listener passes for a Unix socket with a garbled path: the
#: workers' /metrics fails to encode it (500) and the arbiter unlinks it at
#: shutdown (FileNotFoundError, exit status 1).  On PyPy gunicorn binds a
#: port of its own and says which.
FD_BIND = sys.implementation.name == "cpython"


def gunicorn_bind(listener: socket.socket) -> tuple[str, list[int]]:
    """gunicorn's --bind for *listener*, and the fds to pass it."""
    if FD_BIND:
        return f"fd://{listener.fileno()}", [listener.fileno()]
    return "127.0.0.1:0", []


def gunicorn_port(server: Server, listener: socket.socket) -> int:
    """The port gunicorn serves (see FD_BIND)."""
    if FD_BIND:
        return int(listener.getsockname()[1])
    return int(server.wait_for(r"Listening at: http://127\.0\.0\.1:(\d+) ").group(1))


def gunicorn_argv(app: str, worker_class: str, bind: str, workers: int, *extra: str) -> list[str]:
    argv = [
        sys.executable, "-m", "gunicorn", app,
        "--worker-class", worker_class,
        "--workers", str(workers),
        "--bind", bind,
        "--graceful-timeout", "5",
        "--timeout", "30",
    ]  # fmt: skip
    if version_of("gunicorn") >= (25, 1):
        # Else each run would share the default $HOME/.gunicorn/gunicorn.ctl.
        argv.append("--no-control-socket")
    return [*argv, *extra]


# -- gunicorn -------------------------------------------------------------------


def test_gunicorn_aiohttp_worker_serves_on_relaxed_loop(listener: socket.socket) -> None:
    pytest.importorskip("gunicorn", reason="gunicorn is not installed")
    pytest.importorskip("aiohttp", reason="aiohttp is not installed")
    bind, fds = gunicorn_bind(listener)
    argv = gunicorn_argv(
        "examples.http_server:create_app",
        "asyncio_relaxed.gunicorn.GunicornWebWorker",
        bind,
        2,
    )
    # Settings in the environment gunicorn starts with, read by each worker.
    env = child_env(ASYNCIO_RELAXED_WRITE="deferred")
    with Server(argv, env, pass_fds=fds) as server:
        port = gunicorn_port(server, listener)
        hello = request(port, "/")
        assert hello.status == 200, server.describe()
        assert hello.body == b"Hello, world!\n"
        four_kib = request(port, "/4k")
        assert four_kib.status == 200 and len(four_kib.body) == 4096
        echoed = request(port, "/echo", "POST", {"n": [1, 2, 3], "s": "é"})
        assert echoed.status == 200 and echoed.json() == {"n": [1, 2, 3], "s": "é"}
        stats = [request(port, "/stats") for _ in range(4)]
        for response in (hello, four_kib, echoed, *stats):
            assert response.headers["X-Event-Loop"] == RELAXED, server.describe()
        for response in stats:
            report = response.json()
            assert report["loop"] == RELAXED
            assert report["pid"] != server.proc.pid, "served by the arbiter, not a worker"
            assert report["config"]["write"] == "deferred"
            assert report["statistics"]["accept"] >= 1  # connections came through our loop
        if importlib.util.find_spec("prometheus_client") is not None:
            # Each worker exports its own loop, labelled with its pid: a
            # child of the arbiter.
            for _ in range(4):
                pid = sample_pid(metrics_of(request(port, "/metrics")))
                assert parent_of(pid) == server.proc.pid, (pid, server.describe())
        # Each worker says which loop it runs, once, in gunicorn's log.
        workers = server.booted_workers(2)
        assert server.startup_lines(workers) == dict.fromkeys(workers, "write=deferred")
        assert server.stop(signal.SIGTERM) == 0, server.describe()
        assert server.startup_pids() == sorted(workers), server.describe()


def test_gunicorn_uvicorn_worker_serves_on_relaxed_loop(listener: socket.socket) -> None:
    pytest.importorskip("gunicorn", reason="gunicorn is not installed")
    pytest.importorskip("uvicorn", reason="uvicorn is not installed")
    if version_of("uvicorn") < (0, 36):
        pytest.skip("UvicornWorker needs uvicorn >= 0.36 (loop factories as module:function)")
    bind, fds = gunicorn_bind(listener)
    argv = gunicorn_argv(
        "tests._asgi_app:app",
        "asyncio_relaxed.gunicorn.UvicornWorker",
        bind,
        2,
        # Settings through gunicorn's raw_env this time.
        "-e", "ASYNCIO_RELAXED_WRITE=deferred",
        "-e", "ASYNCIO_RELAXED_PARTIAL_WRITE=feed",
    )  # fmt: skip
    with Server(argv, child_env(), pass_fds=fds) as server:
        port = gunicorn_port(server, listener)
        for _ in range(4):
            response = request(port, "/")
            assert response.status == 200, server.describe()
            report = response.json()
            assert report["loop"] == RELAXED, server.describe()
            assert response.headers["X-Event-Loop"] == RELAXED
            assert report["pid"] != server.proc.pid
            assert report["config"]["write"] == "deferred"
            assert report["config"]["partial_write"] == "feed"
        # Each worker says which loop it runs, once, in gunicorn's log.
        workers = server.booted_workers(2)
        assert server.startup_lines(workers) == dict.fromkeys(
            workers, "write=deferred partial_write=feed")
        # uvicorn shuts down gracefully, then re-raises the signal it caught so
        # that its parent sees why it stopped (seen on 0.36 and 0.54).
        assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM), server.describe()
        assert "Application shutdown complete" in server.output, server.describe()
        assert server.startup_pids() == sorted(workers), server.describe()


@pytest.mark.parametrize(
    ("worker_class", "app", "peer"),
    [
        ("GunicornWebWorker", "examples.http_server:create_app", "aiohttp"),
        ("UvicornWorker", "tests._asgi_app:app", "uvicorn"),
    ],
)
def test_gunicorn_stops_on_a_bad_setting(
    listener: socket.socket, worker_class: str, app: str, peer: str
) -> None:
    """A bad ASYNCIO_RELAXED_* value fails the worker's boot, so gunicorn stops
    with the message instead of respawning workers that fail forever."""
    pytest.importorskip("gunicorn", reason="gunicorn is not installed")
    pytest.importorskip(peer, reason=f"{peer} is not installed")
    if peer == "uvicorn" and version_of("uvicorn") < (0, 36):
        pytest.skip("UvicornWorker needs uvicorn >= 0.36")
    bind, fds = gunicorn_bind(listener)
    argv = gunicorn_argv(
        app, f"asyncio_relaxed.gunicorn.{worker_class}", bind, 1,
        "-e", "ASYNCIO_RELAXED_WRITE=bogus",
    )  # fmt: skip
    with Server(argv, child_env(), pass_fds=fds) as server:
        status = server.wait(20)
        assert status != 0, server.describe()
        assert "ASYNCIO_RELAXED_WRITE='bogus' is not a valid setting" in server.output
        assert "Worker failed to boot" in server.output, server.describe()


def test_gunicorn_module_names_its_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gunicorn", reason="gunicorn is not installed")
    module = importlib.import_module("asyncio_relaxed.gunicorn")
    assert {"GunicornWebWorker", "UvicornWorker"} <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchWorker'"):
        module.NoSuchWorker  # noqa: B018
    # A missing peer is an ImportError that says what to install.
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    monkeypatch.delitem(sys.modules, "aiohttp.worker", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'aiohttp>=3.9'"):
        module.__getattr__("GunicornWebWorker")
    monkeypatch.setitem(sys.modules, "gunicorn", None)
    monkeypatch.delitem(sys.modules, "asyncio_relaxed.gunicorn")
    with pytest.raises(ImportError, match=r"pip install 'gunicorn>=22.0'"):
        importlib.import_module("asyncio_relaxed.gunicorn")


# -- uvicorn --------------------------------------------------------------------


def test_uvicorn_cli_loop_option() -> None:
    pytest.importorskip("uvicorn", reason="uvicorn is not installed")
    if version_of("uvicorn") < (0, 36):
        pytest.skip("--loop module:function needs uvicorn >= 0.36")
    argv = [
        sys.executable, "-m", "uvicorn", "tests._asgi_app:app",
        "--loop", "asyncio_relaxed:new_event_loop",
        "--host", "127.0.0.1", "--port", "0",
    ]  # fmt: skip
    env = child_env(ASYNCIO_RELAXED_PARTIAL_WRITE="feed")
    with Server(argv, env) as server:
        port = int(server.wait_for(r"Uvicorn running on http://127\.0\.0\.1:(\d+)").group(1))
        response = request(port, "/")
        assert response.status == 200, server.describe()
        report = response.json()
        assert report["loop"] == RELAXED, server.describe()
        assert report["config"]["partial_write"] == "feed"
        # uvicorn's one process says which loop it runs, once, in its log.
        pid = server.proc.pid
        assert server.startup_lines([pid]) == {pid: "partial_write=feed"}
        # uvicorn shuts down gracefully, then re-raises the signal it caught so
        # that its parent sees why it stopped (seen on 0.36 and 0.54).
        assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM), server.describe()
        assert "Application shutdown complete" in server.output, server.describe()
        assert server.startup_pids() == [pid], server.describe()


def metrics_of(response: Any) -> dict[str, Any]:
    """The families of a /metrics response, read by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    assert response.status == 200, response.body
    return {f.name: f for f in text_string_to_metric_families(response.body.decode())}


def sample_pid(families: dict[str, Any]) -> int:
    return int(families["asyncio_relaxed_iterations"].samples[0].labels["pid"])


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("PPid:")).split()[1])


# -- aiohttp web.run_app (the example) -----------------------------------------


@pytest.mark.parametrize("loop", ["relaxed", "asyncio", "uvloop"])
def test_http_server_example(loop: str) -> None:
    """examples/http_server.py: run_app on the chosen loop; SIGINT stops it cleanly."""
    pytest.importorskip("aiohttp", reason="aiohttp is not installed")
    if loop == "uvloop":
        pytest.importorskip("uvloop", reason="uvloop is not installed")
    argv = [sys.executable, "examples/http_server.py", "--loop", loop, "--port", "0"]
    if loop == "relaxed":
        argv += ["--write", "deferred", "--partial-write", "feed"]
    with Server(argv, child_env()) as server:
        started = json.loads(server.wait_for(r"^\{.*\"listening\"").string)
        port = started["listening"]
        hello = request(port, "/")
        assert hello.status == 200 and hello.body == b"Hello, world!\n", server.describe()
        assert len(request(port, "/4k").body) == 4096
        assert request(port, "/echo", "POST", [1, {"a": None}]).json() == [1, {"a": None}]
        assert request(port, "/echo", "POST").status == 400  # no JSON body
        report = request(port, "/stats").json()
        assert hello.headers["X-Event-Loop"] == report["loop"] == started["loop"]
        if loop == "relaxed":
            assert report["loop"] == RELAXED
            assert report["config"]["write"] == "deferred"
            assert report["config"]["partial_write"] == "feed"
            assert report["statistics"]["writes_deferred"] >= 1
            if importlib.util.find_spec("prometheus_client") is not None:
                scraped = metrics_of(request(port, "/metrics"))
                accepted = scraped["asyncio_relaxed_accepted_connections"].samples
                assert next(s.value for s in accepted if s.name.endswith("_total")) >= 5
                assert sample_pid(scraped) == server.proc.pid
        else:
            assert report["loop"] != RELAXED and "statistics" not in report
            assert request(port, "/metrics").status == 501
        assert server.stop(signal.SIGINT) == 0, server.describe()
        stopped = json.loads(server.wait_for(r"^\{.*\"stopped\"").string)
        assert stopped["stopped"] == started["loop"]


# -- pytest plugins and anyio ---------------------------------------------------


PYTEST_ASYNCIO_CONFTEST = """
import importlib.metadata

import pytest

import asyncio_relaxed

PYTEST_ASYNCIO = tuple(
    int(part) for part in importlib.metadata.version("pytest-asyncio").split(".")[:2]
)

if PYTEST_ASYNCIO >= (1, 4):

    def pytest_asyncio_loop_factories(config, item):
        return {"relaxed": asyncio_relaxed.new_event_loop}

else:  # pytest-asyncio 0.23 to 1.3

    @pytest.fixture(scope="session")
    def event_loop_policy():
        return asyncio_relaxed.EventLoopPolicy()
"""

PYTEST_ASYNCIO_TESTS = """
import asyncio

import pytest
import pytest_asyncio

import asyncio_relaxed


@pytest_asyncio.fixture
async def fixture_loop():
    yield asyncio.get_running_loop()


@pytest.mark.asyncio
async def test_runs_on_relaxed(fixture_loop):
    loop = asyncio.get_running_loop()
    assert isinstance(loop, asyncio_relaxed.Loop), type(loop)
    assert fixture_loop is loop
    assert loop.config.write == "deferred"  # from the environment


@pytest.mark.asyncio
async def test_loopback_round_trip():
    async def echo(reader, writer):
        writer.write(await reader.readexactly(5))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"hello")
    assert await asyncio.wait_for(reader.readexactly(5), 10) == b"hello"
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
"""

ANYIO_CONFTEST = """
import pytest

import asyncio_relaxed


@pytest.fixture(params=[("asyncio", {"loop_factory": asyncio_relaxed.new_event_loop})])
def anyio_backend(request):
    return request.param
"""

ANYIO_TESTS = """
import asyncio

import pytest

import asyncio_relaxed


@pytest.mark.anyio
async def test_runs_on_relaxed():
    loop = asyncio.get_running_loop()
    assert isinstance(loop, asyncio_relaxed.Loop), type(loop)
"""


def run_inner_pytest(
    directory: Path,
    conftest: str,
    tests: str,
    ini: str = "",
    options: Sequence[str] = (),
    **settings: str,
) -> str:
    """Run a pytest session on *tests* in *directory*; return its output."""
    (directory / "conftest.py").write_text(textwrap.dedent(conftest))
    (directory / "test_inner.py").write_text(textwrap.dedent(tests))
    (directory / "pytest.ini").write_text(f"[pytest]\nfilterwarnings = error\n{ini}")
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        *options,
        str(directory),
    ]
    done = subprocess.run(
        argv,
        cwd=directory,
        env=child_env(**settings),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=40,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def test_pytest_asyncio_runs_tests_on_relaxed_loop(tmp_path: Path) -> None:
    pytest.importorskip("pytest_asyncio", reason="pytest-asyncio is not installed")
    output = run_inner_pytest(
        tmp_path,
        PYTEST_ASYNCIO_CONFTEST,
        PYTEST_ASYNCIO_TESTS,
        ini="asyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n",
        ASYNCIO_RELAXED_WRITE="deferred",
    )
    assert re.search(r"\b2 passed\b", output), output


def test_anyio_pytest_plugin_runs_tests_on_relaxed_loop(tmp_path: Path) -> None:
    pytest.importorskip("anyio", reason="anyio is not installed")
    if version_of("anyio") < (4, 0):
        pytest.skip("the anyio_backend loop_factory option needs anyio >= 4.0")
    # Without pytest-asyncio, whose warnings about its own settings are not
    # this test's business.
    output = run_inner_pytest(tmp_path, ANYIO_CONFTEST, ANYIO_TESTS, options=["-p", "no:asyncio"])
    assert re.search(r"\b1 passed\b", output), output


def test_anyio_run_on_relaxed_loop() -> None:
    anyio = pytest.importorskip("anyio", reason="anyio is not installed")
    if version_of("anyio") < (4, 2):
        pytest.skip("anyio.run honours backend_options['loop_factory'] from anyio 4.2")

    async def main() -> tuple[asyncio.AbstractEventLoop, bytes]:
        # A loopback round trip through anyio's own socket streams.
        async def serve(stream: Any) -> None:
            async with stream:
                await stream.send(await stream.receive())

        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            async with anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, serve)
                with anyio.fail_after(10):
                    async with await anyio.connect_tcp("127.0.0.1", port) as client:
                        await client.send(b"ping")
                        echoed = await client.receive()
                tg.cancel_scope.cancel()
        return asyncio.get_running_loop(), echoed

    factory = functools.partial(asyncio_relaxed.new_event_loop, write="deferred")
    loop, echoed = anyio.run(main, backend="asyncio", backend_options={"loop_factory": factory})
    assert isinstance(loop, asyncio_relaxed.Loop), type(loop)
    assert loop.config.write == "deferred"
    assert echoed == b"ping"
    # anyio sets the high-water mark to 0, so every write passes it and
    # leaves from write() at once, deferred mode or not (it always did; the
    # queue round trip before that is gone).
    stats = loop.statistics()
    assert (stats.writes_deferred, stats.send >= 1) == (0, True)
