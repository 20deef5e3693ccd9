"""Fault injection: recv/send/accept/connect failing at chosen calls.

The loop's side of each connection is a ``FaultySocket`` (``_differential.py``):
a real socket whose recv/recv_into, send/sendmsg, accept and connect raise
EINTR, EAGAIN, ECONNRESET, EPIPE, ENOBUFS or EMFILE, or move fewer bytes
than asked ("short"), at the calls a hypothesis-drawn plan names.  On every
loop (stock asyncio too, which holds the expectations themselves to account):

* transient faults (EINTR, EAGAIN, short) change nothing a protocol sees:
  the run equals the same run without faults, up to how much of the buffer
  the kernel took (_differential.normalise, KERNEL_SHARE and
  SEND_AFTER_CALLBACK);
* a fatal one ends the connection: connection_lost exactly once, with that
  error; what the peer got is a prefix of what was written, what the
  protocol got a prefix of what the peer sent; the exception handler is not
  called (stock reports no OSError of a transport, only logs it in debug mode);
* accept faults lose no connection; the exception handler gets stock's
  message and keys (and ours reports running out of descriptors once per
  episode, not per retry: docs/design.md, the accept path);
* connect faults end as on stock;
* ours never spins: settled, the loop idles in its poll (``statistics()``
  counts its iterations: at most ``IDLE_ITERATIONS`` per idle period).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import _differential as diff
import pytest
from _hypothesis_profiles import bounded, timeout
from hypothesis import given
from hypothesis import strategies as st

from conftest import run

TRANSIENT_EXAMPLES = 60  # per loop, as the two below
FATAL_EXAMPLES = 60
ACCEPT_EXAMPLES = 40
#: A retried send behaves as a deferred one, and shares the buffer with the
#: kernel otherwise; what was due meanwhile may run before a retried call.
FAULT_LEEWAY = frozenset({diff.KERNEL_SHARE, diff.SEND_AFTER_CALLBACK, diff.RETRIED})
FATAL = ("ECONNRESET", "EPIPE", "ENOBUFS", "EMFILE")


def needs_harness(loop_name: str) -> None:
    if loop_name == "uvloop":
        pytest.skip("uvloop's transports call libuv, not the socket object's methods")


def is_stock(loop_name: str) -> bool:
    return loop_name == "asyncio"


@timeout()
@bounded(TRANSIENT_EXAMPLES)
@given(
    kind=st.sampled_from(["socketpair", "tcp"]),
    ops=diff.sequences(8),
    first=st.tuples(diff.BUFFER_SIZES, st.none()),
    plan=diff.fault_plans({"recv": sorted(diff.TRANSIENT), "send": sorted(diff.TRANSIENT),
                           "accept": ["EINTR", "EAGAIN"]}),
)
def test_transient_faults_change_nothing_a_protocol_sees(
    loop_name: str, kind: str, ops: list[Any], first: Any, plan: dict[str, Any]
) -> None:
    needs_harness(loop_name)
    clean, clean_broken = diff.observe(loop_name, kind, ops, protocol=first)
    faults = diff.FaultPlan(plan)
    faulted, broken = diff.observe(loop_name, kind, ops, protocol=first, faults=faults,
                                   spin_check="step")
    assert not clean_broken, clean_broken
    assert not broken, f"{broken} with {faults.fired}"
    stock = is_stock(loop_name)
    difference = diff.compare(clean, faulted, FAULT_LEEWAY, stock_expected=stock,
                              stock_got=stock)
    assert difference is None, f"faults {faults.fired} changed what was seen: {difference}"


@st.composite
def fatal_plans(draw: Any) -> dict[str, Any]:
    """A plan with at least one fatal fault, on recv or on send."""
    faults = [*sorted(diff.TRANSIENT), *FATAL]
    plan = draw(diff.fault_plans({"recv": faults, "send": faults}, calls=8))
    kind = draw(st.sampled_from(["recv", "send"]))
    plan[kind][draw(st.integers(0, 7))] = draw(st.sampled_from(FATAL))
    return plan


@timeout()
@bounded(FATAL_EXAMPLES)
@given(
    kind=st.sampled_from(["socketpair", "tcp"]),
    ops=diff.sequences(8, behaving=False),
    first=st.tuples(diff.BUFFER_SIZES, st.none()),
    plan=fatal_plans(),
)
def test_a_fatal_fault_ends_the_connection_once_with_its_error(
    loop_name: str, kind: str, ops: list[Any], first: Any, plan: dict[str, Any]
) -> None:
    needs_harness(loop_name)
    faults = diff.FaultPlan(plan)
    observations, broken = diff.observe(loop_name, kind, ops, protocol=first, faults=faults,
                                        spin_check="step")
    assert not broken, f"{broken} with {faults.fired}"  # prefixes, once, no spin
    lost = [item for item in observations if item[0] == "callback" and item[2] == "connection_lost"]
    assert len(lost) == 1, observations
    before = observations[: observations.index(lost[0])]
    fatal = [item[3] for item in before if item[0] == "fault" and item[3] in FATAL]
    if fatal:
        assert lost[0][3] == diff.describe(diff.fault_error(fatal[0])), observations
    calls = [item for item in observations if item[0] == "exception_handler"]
    assert calls == [], f"an OSError of a transport reached the handler: {calls}"


# -- accept ------------------------------------------------------------------------------

ACCEPT_FAULTS = ("EINTR", "EAGAIN", "ECONNRESET", "EPIPE")
#: Faults accept() answers with the exception handler (stock: the listener's
#: reader raised; "The event loop will catch, log and ignore it").
ACCEPT_RAISES = ("ECONNRESET", "EPIPE")


async def serve_clients(
    loop: asyncio.AbstractEventLoop, faults: diff.FaultPlan, clients: int
) -> tuple[int, float]:
    """A server on a FaultySocket listener, *clients* connections to it; each
    must be served (an echo).  Returns the connections made and the seconds
    it took."""
    made: list[asyncio.Transport] = []

    class Serve(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            made.append(transport)

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

    listener = diff.FaultySocket(socket.AF_INET, socket.SOCK_STREAM)
    listener.plan = faults
    listener.bind(("127.0.0.1", 0))
    server = await loop.create_server(Serve, sock=listener)
    port = listener.getsockname()[1]
    peers = []
    started = time.monotonic()
    try:
        for _ in range(clients):
            peer = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            peers.append(peer)
            peer.setblocking(False)
            await loop.sock_connect(peer, ("127.0.0.1", port))
        for index, peer in enumerate(peers):
            message = b"client %d" % index
            await loop.sock_sendall(peer, message)
            got = b""
            while len(got) < len(message):
                chunk = await loop.sock_recv(peer, 100)
                assert chunk, f"client {index}: EOF after {got!r}"
                got += chunk
            assert got == message
        return len(made), time.monotonic() - started
    finally:
        for peer in peers:
            peer.close()
        for transport in made:
            transport.close()
        server.close()
        await server.wait_closed()


@timeout()
@bounded(ACCEPT_EXAMPLES)
@given(plan=diff.fault_plans({"accept": ACCEPT_FAULTS}, calls=8),
       clients=st.integers(1, 4))
def test_accept_faults_lose_no_connection(
    loop: asyncio.AbstractEventLoop, loop_name: str, loop_errors: Any, plan: dict[str, Any],
    clients: int
) -> None:
    needs_harness(loop_name)
    loop_errors.expect("Exception in callback")
    faults = diff.FaultPlan(plan)
    before = len(loop_errors.contexts)
    made, _ = run(loop, serve_clients(loop, faults, clients))
    assert made == clients
    reported = loop_errors.contexts[before:]
    raised = [fault for kind, _, fault in faults.fired if fault in ACCEPT_RAISES]
    assert len(reported) == len(raised), (faults.fired, reported)
    for context, fault in zip(reported, raised, strict=True):
        assert context["message"].startswith("Exception in callback ")
        assert set(context) - {"source_traceback"} == {"message", "exception", "handle"}
        assert diff.describe(context["exception"]) == diff.describe(diff.fault_error(fault))


@pytest.mark.slow
def test_accept_out_of_descriptors_reports_as_stock_and_does_not_spin(
    loop: asyncio.AbstractEventLoop, loop_name: str, loop_errors: Any
) -> None:
    """EMFILE, then ENOBUFS: the connection is still served, and the handler
    gets stock's message and keys.  Stock reports each error and goes on
    with its batch at once (the next accept of the same event succeeds);
    ours reports the episode once and takes the listener out of the poller
    for stock's ACCEPT_RETRY_DELAY (1 s) after each error, and meanwhile
    idles: a few iterations, not a spin (docs/design.md, the accept path)."""
    needs_harness(loop_name)
    loop_errors.expect("socket.accept() out of system resource")
    faults = diff.FaultPlan({"accept": {0: "EMFILE", 1: "ENOBUFS"}})
    stock = is_stock(loop_name)
    iterations = 0 if stock else loop.statistics().iterations  # type: ignore[attr-defined]
    made, seconds = run(loop, serve_clients(loop, faults, 1))
    assert made == 1
    assert [fault for _, _, fault in faults.fired] == ["EMFILE", "ENOBUFS"]
    reported = loop_errors.contexts
    assert len(reported) == (2 if stock else 1), reported
    for context in reported:
        assert context["message"] == "socket.accept() out of system resource"
        assert set(context) == {"message", "exception", "socket"}
    assert diff.describe(reported[0]["exception"]) == diff.describe(diff.fault_error("EMFILE"))
    if not stock:
        assert seconds > 1.5, f"served after {seconds:.2f} s: no back-off"
        spent = loop.statistics().iterations - iterations  # type: ignore[attr-defined]
        assert spent < 60, f"{spent} iterations in {seconds:.1f} s of back-off"


# -- connect -----------------------------------------------------------------------------


async def connect_outcome(loop: asyncio.AbstractEventLoop, fault: str | None) -> Any:
    """sock_connect() with *fault* on the first connect(); then, connected or
    not, a transport on the socket writes and reads: what each step ended in."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    faults = diff.FaultPlan({"connect": {0: fault}} if fault else {})
    sock = diff.FaultySocket(socket.AF_INET, socket.SOCK_STREAM)
    sock.plan = faults
    sock.setblocking(False)
    outcome: list[Any] = []
    try:
        try:
            await asyncio.wait_for(loop.sock_connect(sock, listener.getsockname()), 5)
        except OSError as exc:
            outcome.append(("sock_connect", diff.describe(exc)))
            return outcome
        outcome.append(("sock_connect", None))
        lost: asyncio.Future[Any] = loop.create_future()

        class Client(asyncio.Protocol):
            def connection_lost(self, exc: BaseException | None) -> None:
                lost.set_result(diff.describe(exc))

        transport, _ = await loop.create_connection(Client, sock=sock)
        transport.write(b"hello")
        try:
            # Connected, the connection is queued already; else it never comes.
            conn, _ = await asyncio.wait_for(loop.sock_accept(listener), 0.1)
        except TimeoutError:
            outcome.append(("accepted", False))
        else:
            with conn:
                outcome.append(("accepted", await loop.sock_recv(conn, 100)))
        transport.close()
        outcome.append(("connection_lost", await asyncio.wait_for(lost, 5)))
        return outcome
    finally:
        sock.close()
        listener.close()


@pytest.mark.parametrize("fault", [None, *diff.FAULT_ERRNOS])
def test_connect_faults_end_as_on_stock(
    loop: asyncio.AbstractEventLoop, loop_name: str, fault: str | None
) -> None:
    """sock_connect is stock's code on our loop too; what follows on the
    socket is our transport.  With EAGAIN the socket never connects (stock
    takes EAGAIN for "in progress"): its first read fails with ENOTCONN and
    its first send with EPIPE, and under write=deferred the send comes
    after the read (a send error surfaces at the end of the iteration), so
    there either OSError may end the connection."""
    needs_harness(loop_name)
    stock = asyncio.SelectorEventLoop()
    try:
        expected = stock.run_until_complete(asyncio.wait_for(connect_outcome(stock, fault), 10))
    finally:
        stock.close()
    got = run(loop, connect_outcome(loop, fault))
    if diff.SEND_AFTER_CALLBACK in diff.leeway(loop_name):
        expected, got = (
            [("connection_lost", "OSError") if step == "connection_lost" and value else
             (step, value) for step, value in outcome]
            for outcome in (expected, got)
        )
    assert got == expected
