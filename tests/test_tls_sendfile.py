"""TLS, start_tls and loop.sendfile run over our transport, on every loop."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest

from conftest import run


def relaxed_recv_count(loop: asyncio.AbstractEventLoop) -> int | None:
    stats = getattr(loop, "statistics", None)
    return stats().recv if stats is not None else None


def test_tls_echo_large_writes(
    loop: asyncio.AbstractEventLoop, tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    server_ctx, client_ctx = tls
    payload = bytes(range(256)) * 4096  # 1 MiB

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.readexactly(len(payload))
        writer.write(data)
        await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="localhost"
        )
        assert writer.get_extra_info("ssl_object") is not None
        writer.write(payload)
        await writer.drain()
        assert await reader.readexactly(len(payload)) == payload
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    before = relaxed_recv_count(loop)
    run(loop, main())
    after = relaxed_recv_count(loop)
    if before is not None:
        assert after is not None and after > before  # our transport did the reads


def test_start_tls_upgrade(
    loop: asyncio.AbstractEventLoop, loop_name: str, tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    server_ctx, client_ctx = tls

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readline() == b"STARTTLS\n"
        writer.write(b"GO\n")
        await writer.drain()
        await writer.start_tls(server_ctx)
        line = await reader.readline()
        writer.write(line.upper())
        await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"STARTTLS\n")
        assert await reader.readline() == b"GO\n"
        await writer.start_tls(client_ctx, server_hostname="localhost")
        writer.write(b"secret\n")
        assert await reader.readline() == b"SECRET\n"
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    run(loop, main())


def test_sendfile(loop: asyncio.AbstractEventLoop, loop_name: str, tmp_path: Any) -> None:
    if loop_name == "uvloop":
        pytest.skip("uvloop does not implement loop.sendfile")
    path = tmp_path / "blob"
    blob = bytes(range(256)) * 8192  # 2 MiB
    path.write_bytes(blob)

    async def main() -> None:
        got = bytearray()
        done = loop.create_future()

        class Sink(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                got.extend(data)
                if len(got) == len(blob) + 9:
                    done.set_result(None)

        server = await loop.create_server(Sink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        transport.write(b"head:")
        with path.open("rb") as f:
            sending = asyncio.ensure_future(loop.sendfile(transport, f))
            await asyncio.sleep(0)  # it has started: writes are refused until it ends
            with pytest.raises(RuntimeError, match="unable to write; sendfile is in progress"):
                transport.write(b"in between")
            sent = await sending
        assert sent == len(blob)
        transport.write(b"tail")  # accepted again
        await done
        assert bytes(got) == b"head:" + blob + b"tail"
        transport.close()
        server.close()
        await server.wait_closed()

    run(loop, main())
