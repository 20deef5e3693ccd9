"""The TLS engine without sockets: two engines back to back in memory.

``asyncio_relaxed._tlsengine`` holds a TLS connection's states, its one
table of transitions and what each state makes of the layer's events; the
layer (``_tls.SSLTransport``) moves bytes and calls the application.  Here
two engines, a client's and a server's, are wired together by two byte
queues, and hypothesis runs sequences of what the layer does to them:
application writes, the records moved (whole, cut mid-record, a byte at a
time), reads, close (close_notify), the byte stream's EOF, aborts and a
corrupted record.  Each side reacts as the layer does, through the engine's
tables (a read of close_notify closes; an EOF acts by ON_EOF).

Checked after every step, against a model written here, not the engine's
table: every change of state is one stock's ``SSLProtocol._set_state``
allows (UNWRAPPED -> DO_HANDSHAKE -> WRAPPED -> FLUSHING -> SHUTDOWN, and
any -> UNWRAPPED), and no state changes except through ``to()``; what a
side has read is a prefix of what the other wrote (a corrupted record is
refused, never delivered); an SSL error leaves the side UNWRAPPED.  Once
nothing is left to move: with no fault, every byte written arrived, and a
close exchanged both close_notify records.
"""

from __future__ import annotations

import ssl
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from asyncio_relaxed import _tlsengine as engine_module
from asyncio_relaxed._compat import SSLProtocol, SSLProtocolState
from asyncio_relaxed._tlsengine import (
    CLOSE,
    DO_HANDSHAKE,
    END,
    FLUSHED,
    FLUSHING,
    HANDSHAKEN,
    ON_CLOSE,
    ON_EOF,
    SHUTDOWN,
    START,
    TAKES_APPDATA,
    TRANSITIONS,
    UNWRAPPED,
    WRAPPED,
    TLSEngine,
)
from tests.conftest import TlsFiles

#: The model: the moves stock's SSLProtocol._set_state allows, and any -> UNWRAPPED.
ALLOWED = {
    (UNWRAPPED, DO_HANDSHAKE),
    (DO_HANDSHAKE, WRAPPED),
    (WRAPPED, FLUSHING),
    (FLUSHING, SHUTDOWN),
} | {(state, UNWRAPPED) for state in SSLProtocolState}

CHUNK = 16384


class Recorded(TLSEngine):
    """An engine that records every move to() makes."""

    __slots__ = ("moves",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.moves: list[tuple[Any, Any]] = []

    def to(self, event: str) -> None:
        before = self.state
        super().to(event)
        self.moves.append((before, self.state))


class Side:
    """One end: its engine, what it wrote and read, and what befell it."""

    def __init__(self, name: str, engine: Recorded) -> None:
        self.name, self.engine = name, engine
        self.written = bytearray()  # what the application wrote while open
        self.backlog = bytearray()  # kept until the handshake is done
        self.sent = bytearray()  # application data the engine took
        self.received = bytearray()
        self.failed: BaseException | None = None  # an SSL error it raised
        self.closed = False  # close() began (close_notify sent or on its way)
        self.shut = False  # both close_notify records exchanged
        self.eof = False  # the byte stream's EOF reached it
        self.aborted = False
        self.state_seen = engine.state
        self.moves_seen = 0


class EngineMachine(RuleBasedStateMachine):
    def __init__(self, files: TlsFiles) -> None:
        super().__init__()
        server_ctx = files.server_context()
        client_ctx = files.client_context()
        self.client = Side("client", Recorded(client_ctx, False, "localhost"))
        self.server = Side("server", Recorded(server_ctx, True, None))
        self.wire = {"client": bytearray(), "server": bytearray()}  # bytes *from* a side
        self.corrupted = False
        for side in (self.client, self.server):
            side.engine.to(START)
        self.step(self.client)

    # -- the layer's reactions, through the engine's tables -----------------------

    def other(self, side: Side) -> Side:
        return self.server if side is self.client else self.client

    def emit(self, side: Side) -> None:
        self.wire[side.name] += side.engine.records()

    def fail(self, side: Side, exc: BaseException) -> None:
        assert isinstance(exc, ssl.SSLError), exc
        side.failed = exc
        side.engine.to(END)

    def read(self, side: Side) -> None:
        """The layer's read: everything decrypted; close_notify starts the close."""
        buf = bytearray(CHUNK)
        while True:
            try:
                count = side.engine.core.read(CHUNK, buf)
            except engine_module.SSL_AGAIN:
                return
            except ssl.SSLError as exc:
                self.fail(side, exc)
                return
            if not count:  # the peer's close_notify
                if ON_CLOSE.get(side.engine.state) == "flush":
                    self.close_side(side)
                elif side.engine.state is SHUTDOWN:
                    self.shutdown(side)
                return
            side.received += buf[:count]

    def shutdown(self, side: Side) -> None:
        try:
            done = side.eof or side.engine.unwrap()
        except ssl.SSLError as exc:
            self.fail(side, exc)
            return
        if done:
            # Only the peer's close_notify (or the stream's end) ends a shutdown.
            assert side.eof or self.other(side).closed, side.name
            side.shut = True

    def close_side(self, side: Side) -> None:
        side.closed = True
        side.engine.to(CLOSE)
        self.read(side)
        if side.engine.state is FLUSHING:
            side.engine.to(FLUSHED)
            self.shutdown(side)

    def step(self, side: Side) -> None:
        """New ciphertext: the state's step (ON_CIPHERTEXT), then its records out."""
        state = side.engine.state
        if state is DO_HANDSHAKE:
            try:
                done = side.engine.handshake()
            except ssl.SSLError as exc:
                side.failed = exc  # handshake() moved to UNWRAPPED itself
            else:
                if done:
                    side.engine.peer_info()
                    self.send_backlog(side)
                    self.read(side)
        elif state in (WRAPPED, FLUSHING):
            self.read(side)
        elif state is SHUTDOWN and not side.shut:
            self.shutdown(side)
        self.emit(side)

    # -- rules -------------------------------------------------------------------------

    sides = st.sampled_from(["client", "server"])
    #: A fault (EOF, abort, corruption) happens on one draw in eight: most
    #: sequences get through the handshake to data and closes.
    rare = st.integers(0, 7).map(lambda n: n == 0)

    def side(self, name: str) -> Side:
        return self.client if name == "client" else self.server

    @initialize(connected=st.booleans())
    def start(self, connected: bool) -> None:
        """Half the sequences start from a finished handshake (the rules'
        own moves reach it less often than a sequence needs for data)."""
        while connected and not self.wire["client"] == self.wire["server"] == b"":
            for name in ("client", "server"):
                self.move(name, "all")
        if connected:
            assert (self.client.engine.state, self.server.engine.state) == (WRAPPED, WRAPPED)

    @rule(name=sides, how=st.sampled_from(["all", "half", "byte"]))
    def move(self, name: str, how: str) -> None:
        """Records from *name* to its peer: all, cut mid-record, or one byte."""
        sender = self.side(name)
        receiver = self.other(sender)
        self.emit(sender)
        wire = self.wire[name]
        n = {"all": len(wire), "half": len(wire) // 2, "byte": min(1, len(wire))}[how]
        data = bytes(wire[:n])
        del wire[:n]
        if receiver.eof or receiver.engine.state is UNWRAPPED:
            return  # nobody reads a stream that ended
        receiver.engine.feed(data)
        self.step(receiver)

    @rule(name=sides, data=st.binary(min_size=1, max_size=40000))
    def write(self, name: str, data: bytes) -> None:
        """Application data: the model says a write before close() and
        before any fault is delivered (during the handshake too, once it is
        done); the engine's TAKES_APPDATA says which the layer keeps."""
        side = self.side(name)
        is_open = side.engine.state in (DO_HANDSHAKE, WRAPPED) and not (
            side.closed or side.failed or side.aborted or side.eof)
        if is_open:
            side.written += data
        if side.engine.state in TAKES_APPDATA:
            side.backlog += data
            self.send_backlog(side)

    def send_backlog(self, side: Side) -> None:
        """The layer's backlog, encrypted once WRAPPED."""
        if side.engine.state is WRAPPED and side.backlog:
            count = side.engine.encrypt(bytes(side.backlog))
            assert 0 < count <= len(side.backlog)
            side.sent += side.backlog[:count]
            del side.backlog[:count]
            self.emit(side)

    @rule(name=sides)
    def close(self, name: str) -> None:
        side = self.side(name)
        action = ON_CLOSE.get(side.engine.state)
        if action == "flush":
            self.close_side(side)
            self.emit(side)
        elif action == "abort":
            self.abort(name)

    @rule(name=sides, happens=rare)
    def eof(self, name: str, happens: bool) -> None:
        """The byte stream's EOF at *name* (its peer half-closed)."""
        side = self.side(name)
        if side.eof or not happens:
            return
        side.eof = True
        action = ON_EOF.get(side.engine.state)
        if action == "fail":
            side.failed = ssl.SSLError("ConnectionResetError during the handshake")
            side.engine.to(END)
        elif action == "flush":
            self.close_side(side)
        elif action == "write_then_shutdown":
            side.engine.to(FLUSHED)
            self.shutdown(side)
        elif action == "shutdown":
            self.shutdown(side)
        self.emit(side)

    @rule(name=sides, happens=rare)
    def abort_rule(self, name: str, happens: bool) -> None:
        if happens:
            self.abort(name)

    def abort(self, name: str) -> None:
        side = self.side(name)
        side.aborted = True
        side.engine.to(END)

    @rule(name=sides, where=st.floats(0, 1, exclude_max=True), happens=rare)
    def corrupt(self, name: str, where: float, happens: bool) -> None:
        """One byte of the records in flight from *name* flipped."""
        self.emit(self.side(name))
        wire = self.wire[name]
        if wire and happens:
            wire[int(where * len(wire))] ^= 0x55
            self.corrupted = True

    # -- the model ------------------------------------------------------------------

    @invariant()
    def moves_are_allowed(self) -> None:
        for side in (self.client, self.server):
            engine = side.engine
            for move in engine.moves[side.moves_seen:]:
                assert move in ALLOWED, (side.name, move)
            side.moves_seen = len(engine.moves)
            if engine.moves:
                assert engine.state is engine.moves[-1][1], "a state changed outside to()"
            if side.failed is not None or side.aborted:
                assert engine.state is UNWRAPPED

    @invariant()
    def data_is_a_prefix(self) -> None:
        for side in (self.client, self.server):
            sent = self.other(side).sent
            assert side.received == sent[:len(side.received)], side.name

    def teardown(self) -> None:
        """Move everything left until nothing moves; then, with no fault,
        every byte arrived and a close was answered."""
        for _ in range(200):
            moved = False
            for side in (self.client, self.server):
                self.emit(side)
                if self.wire[side.name]:
                    moved = True
                    self.move(side.name, "all")
            if not moved:
                break
        self.moves_are_allowed()
        self.data_is_a_prefix()
        sides = (self.client, self.server)
        if self.corrupted or any(s.failed or s.aborted or s.eof for s in sides):
            return
        for side in sides:
            assert side.failed is None
            assert side.engine.state in (WRAPPED, SHUTDOWN), (side.name, side.engine.state)
        if not any(s.closed for s in sides):
            for side in sides:
                assert side.received == self.other(side).written, side.name
        else:
            # A close is answered: both exchanged close_notify, and what the
            # closer wrote before it arrived.
            for side in sides:
                assert side.shut, side.name
            for closer in sides:
                if closer.closed and not self.other(closer).closed:
                    assert self.other(closer).received == closer.written


def test_two_engines_back_to_back(tls_files: TlsFiles) -> None:
    run_state_machine_as_test(
        lambda: EngineMachine(tls_files),
        settings=settings(max_examples=400, stateful_step_count=30, deadline=None,
                          database=None, derandomize=True))


# -- the table ---------------------------------------------------------------


def test_every_state_is_in_the_table() -> None:
    entered = {enters for _, enters in TRANSITIONS.values()}
    left = {leaves for leaves, _ in TRANSITIONS.values() if leaves is not None}
    assert entered | left == set(SSLProtocolState)
    assert {(leaves, enters) for leaves, enters in TRANSITIONS.values()
            if leaves is not None} | {(s, UNWRAPPED) for s in SSLProtocolState} == ALLOWED


@pytest.mark.parametrize("event", [HANDSHAKEN, CLOSE, FLUSHED])
def test_a_move_the_table_refuses_raises_stocks_error(event: str) -> None:
    """From UNWRAPPED only START and END move; the others raise the error
    stock's SSLProtocol._set_state raises, word for word."""
    import asyncio

    engine = TLSEngine(ssl.create_default_context(), False, "localhost")
    with pytest.raises(RuntimeError) as ours:
        engine.to(event)
    assert engine.state is UNWRAPPED
    loop = asyncio.new_event_loop()
    try:
        stock = SSLProtocol(loop, asyncio.Protocol(), ssl.create_default_context(), None,
                            server_hostname="localhost")
        with pytest.raises(RuntimeError) as theirs:
            stock._set_state(TRANSITIONS[event][1])
        stock._get_app_transport().close()  # (UNWRAPPED: nothing to shut down)
    finally:
        loop.close()
    assert str(ours.value) == str(theirs.value)


def test_end_leaves_any_state() -> None:
    engine = TLSEngine(ssl.create_default_context(), False, "localhost")
    for event in (START, END):
        engine.to(event)
    assert engine.state is UNWRAPPED


def test_drop_keeps_the_state_and_the_bios() -> None:
    engine = TLSEngine(ssl.create_default_context(), False, "localhost")
    engine.to(START)
    assert engine.handshake() is False  # the ClientHello waits in the outgoing BIO
    engine.drop()
    assert (engine.sslobj, engine.core, engine.state) == (None, None, DO_HANDSHAKE)
    assert engine.records()  # the BIO is still there
