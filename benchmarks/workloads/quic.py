"""The QUIC workload's server and client (aioquic over create_datagram_endpoint).

``quic-10m``: the client (on the built-in clients' loop) opens one QUIC
connection and sends streams of ``--request`` bytes (10 MiB), one at a
time, each ended by the client; the server (on the loop under test) counts
what it receives and answers each ended stream with ``ok``; the next stream
starts at that answer.  aioquic does the QUIC and TLS 1.3 (the certificates
of benchmarks.harness.tls) in Python on top of the loop's datagram
endpoint, so the loop's share of the server's CPU is its datagram
transport and its timers.  The figure is server CPU per MiB received.
aioquic comes with the bench extra on CPython; where it is missing (PyPy)
the workload is skipped with the reason (``needs``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from benchmarks.harness import checkout, tls
from benchmarks.workloads.control import control, finish, listening

ALPN = ["bench"]
MiB = 1 << 20
#: Flow-control windows wide enough that a 10 MiB stream is not held back
#: by them (aioquic's defaults are 1 MiB per stream).
WINDOW = 64 * MiB


def _configuration(is_client: bool) -> Any:
    from aioquic.quic.configuration import QuicConfiguration

    config = QuicConfiguration(is_client=is_client, alpn_protocols=ALPN, max_data=WINDOW,
                               max_stream_data=WINDOW)
    folder = tls.ensure()
    if is_client:
        config.load_verify_locations(str(folder / tls.CA_FILE))
        config.server_name = tls.HOSTNAME
    else:
        config.load_cert_chain(folder / tls.SERVER_FILE, folder / tls.SERVER_FILE)
    return config


async def serve(loop: asyncio.AbstractEventLoop) -> None:
    """The ``quic`` server until the end of input."""
    from aioquic.asyncio import QuicConnectionProtocol
    from aioquic.asyncio import serve as quic_serve
    from aioquic.quic.events import StreamDataReceived

    class Sink(QuicConnectionProtocol):
        def quic_event_received(self, event: Any) -> None:
            if isinstance(event, StreamDataReceived) and event.end_stream:
                self._quic.send_stream_data(event.stream_id, b"ok", end_stream=True)
                self.transmit()

    stop = loop.create_future()
    server = await quic_serve("127.0.0.1", 0, configuration=_configuration(False),
                              create_protocol=Sink)
    port = server._transport.get_extra_info("sockname")[1]  # no public accessor
    listening(port, f"{type(loop).__module__}.{type(loop).__qualname__}",
              checkout.relaxed_package())
    control(loop, lambda: finish(stop))
    await stop
    server.close()


async def client(args: argparse.Namespace, ready: Any, go: Any) -> dict[str, Any]:
    """Streams of ``args.request`` bytes through the warm-up, then through
    ``args.duration`` after *go* (a coroutine function); *ready* is called
    between the two.  MiB sent in the measured streams, elapsed, Gbit/s."""
    from aioquic.asyncio import QuicConnectionProtocol, connect
    from aioquic.quic.events import StreamDataReceived

    loop = asyncio.get_running_loop()

    class Sender(QuicConnectionProtocol):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.answers: dict[int, asyncio.Future[None]] = {}

        def quic_event_received(self, event: Any) -> None:
            if isinstance(event, StreamDataReceived) and event.end_stream:
                answer = self.answers.pop(event.stream_id, None)
                if answer is not None:
                    finish(answer)

        async def stream(self, data: bytes) -> None:
            stream_id = self._quic.get_next_available_stream_id()
            answer = self.answers[stream_id] = loop.create_future()
            self._quic.send_stream_data(stream_id, data, end_stream=True)
            self.transmit()
            await asyncio.wait_for(answer, 60)

    data = b"q" * args.request
    async with connect("127.0.0.1", args.port, configuration=_configuration(True),
                       create_protocol=Sender) as conn:
        sender: Any = conn
        until = time.perf_counter() + args.warmup
        while time.perf_counter() < until:
            await sender.stream(data)
        ready()
        await go()
        started = time.perf_counter()
        streams = 0
        while not streams or time.perf_counter() - started < args.duration:
            await sender.stream(data)
            streams += 1
        elapsed = time.perf_counter() - started
    sent = streams * len(data)
    return {"requests": sent / MiB, "elapsed": elapsed, "gbit_s": sent * 8 / elapsed / 1e9,
            "streams": streams}
