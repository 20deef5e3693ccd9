"""One behaviour suite, every loop (uvloop's _testbase mixins, anyio's conftest).

``loop`` is parametrized over stock asyncio, uvloop (skipped with the reason
when it cannot run here) and asyncio_relaxed in each write x partial-write
setting, from the one loop table (benchmarks/harness/loops.py).  A test fails on any
call of the loop's exception handler it did not declare with
``loop_errors.expect(...)``.
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

import asyncio_relaxed
from benchmarks.harness.loops import SPECS, SUITE_LOOPS, factory, loop_class, missing

#: Our loop's settings in the suite: write x partial_write, by loop name
#: (the names are benchmarks/harness/loops.py's, the one loop table), each
#: build's where the package has two (on PyPy the pure build is the only
#: one: its -pure presets would run the same loops again).
RELAXED_SETTINGS = {
    name: dict(SPECS[name].settings) for name in SUITE_LOOPS
    if SPECS[name].kind == "relaxed" and not missing(name)
}

#: Every loop of the suite, None where it cannot run here (missing() says why).
LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop] | None] = {
    name: None if missing(name) else factory(name) for name in SUITE_LOOPS
}


class Echo(asyncio.Protocol):
    """Writes back whatever it receives."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class Recorder(asyncio.Protocol):
    """Collects what the transport tells its protocol, with futures to await.

    *keep_open*: what eof_received answers (True keeps the transport open
    for the test to close).  Made inside the loop it reports to, or given it.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop | None = None, *, keep_open: bool = False
    ) -> None:
        self.loop = loop if loop is not None else asyncio.get_event_loop()
        self.keep_open = keep_open
        self.transport: Any = None
        self.data = bytearray()
        self.calls: list[str] = []
        self.made: asyncio.Future[None] = self.loop.create_future()
        self.lost: asyncio.Future[BaseException | None] = self.loop.create_future()
        self.got_data = asyncio.Event()
        self._want: tuple[int, asyncio.Future[None]] | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.calls.append("connection_made")
        self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.got_data.set()
        if self._want is not None and len(self.data) >= self._want[0]:
            fut = self._want[1]
            self._want = None
            fut.set_result(None)

    def eof_received(self) -> bool | None:
        self.calls.append("eof_received")
        return True if self.keep_open else None

    def pause_writing(self) -> None:
        self.calls.append("pause_writing")

    def resume_writing(self) -> None:
        self.calls.append("resume_writing")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.calls.append("connection_lost")
        if not self.lost.done():
            self.lost.set_result(exc)

    async def received(self, nbytes: int) -> bytes:
        """Wait until at least *nbytes* have arrived."""
        if len(self.data) < nbytes:
            fut = self.loop.create_future()
            self._want = (nbytes, fut)
            await fut
        return bytes(self.data)


class LoopErrors:
    """Records exception-handler calls; unexpected ones fail the test."""

    def __init__(self) -> None:
        self.contexts: list[dict[str, Any]] = []
        self.expected: list[str] = []

    def handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.contexts.append(context)

    def expect(self, message_part: str) -> None:
        self.expected.append(message_part)

    def check(self) -> None:
        unexpected = [
            c
            for c in self.contexts
            if not any(part in str(c.get("message", "")) for part in self.expected)
        ]
        assert not unexpected, f"unexpected exception-handler calls: {unexpected!r}"


@pytest.fixture(autouse=True, scope="module")
def _collect_after_module() -> Iterator[None]:
    """On PyPy, what a test module left unclosed is reported against it.

    There an unclosed socket or transport warns (an error in this suite)
    whenever the collector next runs, in whichever test is running then;
    collected here, it fails the teardown of the module's last test, with
    the object named.  Not per test: a collection costs about 0.1 s there.
    """
    yield
    if not REFCOUNTED:
        collect_garbage()


#: The loop table's presets of the pure build.
PURE_PRESETS = tuple(name for name, spec in SPECS.items() if spec.build == "pure")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--without-pure", action="store_true",
        help="leave out the tests parametrized with a pure-build preset (relaxed-*-pure): "
             ".ci/run does on the Pythons and in the modes where they would run what "
             "another run covers")


def _names_a_pure_preset(value: Any) -> bool:
    if isinstance(value, str):
        return value.startswith(PURE_PRESETS)
    if isinstance(value, tuple):
        return any(_names_a_pure_preset(part) for part in value)
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--without-pure"):
        return
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        (drop if any(_names_a_pure_preset(v) for v in params) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def loop_errors() -> LoopErrors:
    return LoopErrors()


@pytest.fixture(params=list(LOOP_FACTORIES))
def loop_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    why = missing(name)
    if why:
        pytest.skip(why)
    return name


@pytest.fixture
def loop(loop_name: str, loop_errors: LoopErrors) -> Iterator[asyncio.AbstractEventLoop]:
    factory = LOOP_FACTORIES[loop_name]
    assert factory is not None
    yield from _as_fixture(factory(), loop_errors)


def _as_fixture(loop: asyncio.AbstractEventLoop,
                loop_errors: LoopErrors) -> Iterator[asyncio.AbstractEventLoop]:
    """*loop* as a fixture's: the current loop, its exception handler
    recording, its async generators shut down and itself closed after."""
    loop.set_exception_handler(loop_errors.handler)
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
    loop_errors.check()


#: The TLS tests' loops: every loop of the suite, ours with each ``tls``
#: setting (its own TLS transport, stock's SSLProtocol over its transport).
TLS_LOOP_NAMES = [f"{name}-tls-{tls}" if name in RELAXED_SETTINGS else name
                  for name in LOOP_FACTORIES
                  for tls in (("own", "stock") if name in RELAXED_SETTINGS else ("",))]


@pytest.fixture(params=TLS_LOOP_NAMES)
def tls_loop_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    base = name.split("-tls-")[0]
    why = missing(base)
    if why:
        pytest.skip(why)
    return name


@pytest.fixture
def tls_loop(tls_loop_name: str, loop_errors: LoopErrors) -> Iterator[asyncio.AbstractEventLoop]:
    """A loop of TLS_LOOP_NAMES, as the ``loop`` fixture makes its own."""
    base, _, tls = tls_loop_name.partition("-tls-")
    if tls:
        loop: asyncio.AbstractEventLoop = loop_class(base)(**RELAXED_SETTINGS[base], tls=tls)
    else:
        factory = LOOP_FACTORIES[base]
        assert factory is not None
        loop = factory()
    yield from _as_fixture(loop, loop_errors)


@pytest.fixture(params=list(RELAXED_SETTINGS))
def relaxed_loop(
    request: pytest.FixtureRequest, loop_errors: LoopErrors
) -> Iterator[asyncio_relaxed.Loop]:
    """Only our loop, in each setting and build: for tests that read
    statistics()."""
    why = missing(request.param)
    if why:
        pytest.skip(why)
    loop = loop_class(request.param)(**RELAXED_SETTINGS[request.param])
    loop.set_exception_handler(loop_errors.handler)
    try:
        yield loop
    finally:
        loop.close()
    loop_errors.check()


def compiled(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether *loop* is of the compiled build (asyncio_relaxed._speedups)."""
    return asyncio_relaxed.CLoop is not None and isinstance(loop, asyncio_relaxed.CLoop)


#: Why a test of the pure transport's read modes does not apply to a compiled loop.
NO_READ_MODES = ("the compiled transport reads every event into the process's receive "
                 "buffer (uvloop's read): it has no read modes")


#: CPython frees an object when its last reference goes.  PyPy's collector
#: frees garbage only when it runs, and an object with a ``__del__`` (a
#: transport, a socket) only at the collection after the one that ran it:
#: on PyPy nothing may count on an object being freed at once to close a
#: socket or to drop a weak reference.
REFCOUNTED = sys.implementation.name == "cpython"


def collect_garbage() -> None:
    """Free every unreachable object now, and clear the weak references to it."""
    gc.collect()
    if not REFCOUNTED:
        # One more collection per level of objects with __del__ that refer
        # to one another (a transport, then its socket).
        gc.collect()
        gc.collect()


def run(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], timeout: float = 20
) -> Any:
    """Run *coro* on *loop* with a deadline, so a hang fails instead of blocking."""
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


def iterate(loop: asyncio.AbstractEventLoop, n: int = 1) -> None:
    """Run exactly *n* loop iterations."""
    for _ in range(n):
        loop.call_soon(loop.stop)
        loop.run_forever()


def stalled_pair(sndbuf: int = 4096) -> tuple[socket.socket, socket.socket]:
    """A connected pair whose first end's send buffer fills fast."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
    a.setblocking(False)
    b.setblocking(False)
    return a, b


class TlsFiles:
    """PEM files for the TLS tests: the server's certificate chain and key
    (for localhost and 127.0.0.1), a client's, and the CA that trusts both."""

    def __init__(self, server: Any, client: Any, ca: Any, expired: Any = None) -> None:
        self.server, self.client, self.ca, self.expired = server, client, ca, expired

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server)
        return context

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        return context


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """From trustme (a CA, certificates it issued, one of them expired)
    where it installs; else from the openssl command, one self-signed
    certificate that serves as CA, server and client certificate: on PyPy,
    where trustme's cryptography has no wheel for PyPy's ABI (pyproject.toml's
    test extra)."""
    folder = tmp_path_factory.mktemp("tls")
    try:
        import trustme
    except ImportError:
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.skip("needs trustme or the openssl command, and neither is here")
        cert, key = folder / "cert.pem", folder / "key.pem"
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        both = folder / "both.pem"
        both.write_bytes(key.read_bytes() + cert.read_bytes())
        return TlsFiles(both, both, cert)
    import datetime

    ca = trustme.CA()
    files = {}
    for name, cert in (
        ("server", ca.issue_cert("localhost", "127.0.0.1")),
        ("client", ca.issue_cert("client@example.com")),
        ("expired", ca.issue_cert("localhost", "127.0.0.1",
                                  not_after=datetime.datetime(2000, 1, 1))),
    ):
        path = folder / f"{name}.pem"
        cert.private_key_and_cert_chain_pem.write_to_path(str(path))
        files[name] = path
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    return TlsFiles(files["server"], files["client"], folder / "ca.pem", files["expired"])


@pytest.fixture(scope="session")
def tls(tls_files: TlsFiles) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts: a certificate for localhost and its trust."""
    return tls_files.server_context(), tls_files.client_context()


# -- PyPy: a session that cannot exit --------------------------------------------
#
# On PyPy the collector runs concurrent.futures' weakref callback of a
# collected ThreadPoolExecutor (thread.py, weakref_cb: q.put(None)) in
# whatever thread allocates, which can be that executor's own idle worker
# inside work_queue.get() holding the queue's lock: the worker deadlocks on
# its own lock, and at exit the interpreter joins it forever (seen in a full
# run of the suite, never in one file's).  Nothing uses such a worker any
# more (its executor is gone), so once the session has reported, a PyPy
# process with a non-daemon thread left exits with the session's status.


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


_EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    import os
    import threading

    if sys.implementation.name != "pypy" or _EXIT_STATUS not in config.stash:
        return
    left = [t for t in threading.enumerate()
            if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if left:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash[_EXIT_STATUS])
