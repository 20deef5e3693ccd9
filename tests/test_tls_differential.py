"""TLS connections observed on stock and on ours, for random sequences of
what an application does to them (hypothesis).

Both ends of a connection are on one loop (a socketpair: the server end
through ``connect_accepted_socket(ssl=)``, the client end through
``create_connection(sock=, ssl=)``), so a run is deterministic.  A sequence
is up to eight operations: either end writes (bytes, a bytearray it then
overwrites, writelines), pauses or resumes reading, lowers its write buffer
limits, closes or aborts.  An end closed while closing (by itself, or by
the peer's close_notify) gets no more calls but close and abort: stock's
transport lets its SSLProtocol go there, and the others raise
AttributeError.  After each the loop runs until nothing changes;
what the two protocols saw (their callbacks in order, the data as one stream
each, the exceptions their calls raised, the exception-handler calls) must
be stock's, with ``tls=own`` and ``tls=stock`` alike, in each write mode.
Data is compared as streams (how many data_received calls carry it is not
part of the contract) and, under ``write=deferred``, where a write's data
leaves relative to the next operation is its own (it leaves at the end of
the iteration: docs/settings.md).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from _hypothesis_profiles import bounded, timeout
from hypothesis import given
from hypothesis import strategies as st

import asyncio_relaxed
from conftest import TlsFiles

END = st.sampled_from(["server", "client"])
OPS = st.one_of(
    st.tuples(st.just("write"), END, st.integers(1, 300_000)),
    st.tuples(st.just("write_reused"), END, st.integers(1, 5000)),
    st.tuples(st.just("writelines"), END, st.lists(st.integers(0, 3000), max_size=4)),
    st.tuples(st.just("pause_reading"), END),
    st.tuples(st.just("resume_reading"), END),
    st.tuples(st.just("limits"), END, st.integers(0, 100_000)),
    st.tuples(st.just("close"), END),
    st.tuples(st.just("abort"), END),
)


class Observer(asyncio.Protocol):
    def __init__(self, log: list[Any], name: str) -> None:
        self.log = log
        self.name = name
        self.transport: Any = None
        self.received = bytearray()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.log.append((self.name, "made"))

    def data_received(self, data: bytes) -> None:
        self.received += data

    def eof_received(self) -> None:
        self.log.append((self.name, "eof", bytes(self.received)))

    def pause_writing(self) -> None:
        self.log.append((self.name, "pause_writing"))

    def resume_writing(self) -> None:
        self.log.append((self.name, "resume_writing"))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.log.append((self.name, "lost", type(exc).__name__ if exc else None,
                         bytes(self.received)))


def observe(make_loop: Any, files: TlsFiles, ops: list[tuple[Any, ...]]) -> list[Any]:
    loop = make_loop()
    log: list[Any] = []
    loop.set_exception_handler(lambda _, ctx: log.append(("handler", ctx.get("message"))))
    a, b = socket.socketpair()
    ends: dict[str, Observer] = {"server": Observer(log, "server"),
                                 "client": Observer(log, "client")}

    async def settle() -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        await asyncio.sleep(0.002)
        for _ in range(3):
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(
            loop.connect_accepted_socket(lambda: ends["server"], a,
                                         ssl=files.server_context()),
            loop.create_connection(lambda: ends["client"], sock=b,
                                   ssl=files.client_context(), server_hostname="localhost"))
        dropped = set()
        for op in ops:
            end = ends[op[1]]
            transport = end.transport
            if op[1] in dropped and op[0] not in ("close", "abort"):
                continue  # stock's transport has let its SSLProtocol go
            if op[0] == "close" and transport.is_closing():
                dropped.add(op[1])
            try:
                if op[0] == "write":
                    transport.write(b"w" * op[2])
                elif op[0] == "write_reused":
                    data = bytearray(b"r" * op[2])
                    transport.write(data)
                    data[:] = b"x" * op[2]  # the caller reuses its buffer
                elif op[0] == "writelines":
                    transport.writelines([b"l" * n for n in op[2]])
                elif op[0] == "pause_reading":
                    transport.pause_reading()
                elif op[0] == "resume_reading":
                    transport.resume_reading()
                elif op[0] == "limits":
                    transport.set_write_buffer_limits(high=op[2])
                else:
                    getattr(transport, op[0])()
            except Exception as exc:
                log.append((op[1], "raised", type(exc).__name__, str(exc)))
            await settle()
        for name, end in ends.items():  # the finale: both read, then close
            if name not in dropped:
                end.transport.resume_reading()
                await settle()
        for name in ("client", "server"):
            ends[name].transport.close()
            await settle()
        for _ in range(50):
            if sum(entry[1] == "lost" for entry in log if len(entry) > 1) == 2:
                break
            await asyncio.sleep(0.005)

    try:
        loop.run_until_complete(asyncio.wait_for(main(), 20))
    finally:
        loop.close()
        a.close()
        b.close()
    return log


@pytest.mark.parametrize("write", ["eager", "deferred"])
@pytest.mark.parametrize("tls", ["own", "stock"])
@timeout()
@bounded(30)
@given(ops=st.lists(OPS, max_size=8))
def test_tls_sequences_observe_as_on_stock(tls: str, write: str, tls_files: TlsFiles,
                                           ops: list[tuple[Any, ...]]) -> None:
    stock = observe(asyncio.SelectorEventLoop, tls_files, ops)
    ours = observe(lambda: asyncio_relaxed.Loop(tls=tls, write=write), tls_files, ops)
    if write == "deferred":
        # Where a write's bytes are seen relative to the next operation is
        # deferred mode's own; what each end got in all is compared.
        assert sorted(map(repr, ours)) == sorted(map(repr, stock))
    else:
        assert ours == stock
