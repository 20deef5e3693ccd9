"""Real libraries over TLS on every loop and both ``tls`` settings: aiohttp's
server and client, websockets over wss.

Both ends run on the loop under test (the server through
``create_server(ssl=)``, the client through ``create_connection(ssl=)``), on
loopback, with trustme's certificates (``tls_files``).  Each test asserts
what the application sees: the same on stock, uvloop and ours.  (asyncpg's
``ssl=`` connections: tests/test_clients.py, against a real PostgreSQL.)
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

import pytest

from conftest import TlsFiles

pytestmark = pytest.mark.timeout(60)

LOCAL = "127.0.0.1"


def run(loop: asyncio.AbstractEventLoop, coro: Any, timeout: float = 30) -> Any:
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


def test_aiohttp_server_and_client_over_tls(tls_loop: asyncio.AbstractEventLoop,
                                            tls_files: TlsFiles) -> None:
    """GET, a 1 MiB POST echoed, a 4 MiB chunked response, 20 requests at
    once over a 5-connection pool, then the session and the site closed."""
    web = pytest.importorskip("aiohttp.web", reason="aiohttp is not installed")
    import aiohttp

    loop = tls_loop
    big = os.urandom(4 << 20)

    async def hello(request: Any) -> Any:
        version = request.transport.get_extra_info("ssl_object").version()
        return web.Response(text=f"hello {request.secure} {version}")

    async def echo(request: Any) -> Any:
        body = await request.read()
        return web.Response(body=hashlib.sha256(body).hexdigest().encode())

    async def stream(request: Any) -> Any:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for offset in range(0, len(big), 256 << 10):
            await response.write(big[offset:offset + (256 << 10)])
        await response.write_eof()
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/", hello)
        app.router.add_post("/echo", echo)
        app.router.add_get("/stream", stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, LOCAL, 0, ssl_context=tls_files.server_context())
        await site.start()
        port = runner.addresses[0][1]
        url = f"https://localhost:{port}"
        connector = aiohttp.TCPConnector(ssl=tls_files.client_context(), limit=5,
                                         resolver=_Loopback())
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                async with session.get(url + "/") as response:
                    assert response.status == 200
                    assert await response.text() == "hello True TLSv1.3"
                body = os.urandom(1 << 20)
                async with session.post(url + "/echo", data=body) as response:
                    assert await response.text() == hashlib.sha256(body).hexdigest()
                async with session.get(url + "/stream") as response:
                    assert await response.read() == big

                async def one(i: int) -> str:
                    async with session.get(url + "/") as response:
                        return await response.text()

                assert await asyncio.gather(*(one(i) for i in range(20))) \
                    == ["hello True TLSv1.3"] * 20
        finally:
            await runner.cleanup()

    run(loop, main())


class _Loopback:
    """aiohttp's resolver for "localhost": 127.0.0.1 only (the certificate
    names localhost; the site listens on IPv4)."""

    async def resolve(self, host: str, port: int = 0, family: int = 0) -> list[dict[str, Any]]:
        import socket

        return [{"hostname": host, "host": LOCAL, "port": port, "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        pass


def test_websockets_over_wss(tls_loop: asyncio.AbstractEventLoop, tls_files: TlsFiles) -> None:
    """A text echo, a 1 MiB binary message, a ping, and a close with a code
    and a reason, each end seeing the other's."""
    pytest.importorskip("websockets", reason="websockets is not installed")
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve
    from websockets.exceptions import ConnectionClosedError

    loop = tls_loop
    closed: list[tuple[Any, Any]] = []

    async def handler(ws: Any) -> None:
        try:
            async for message in ws:
                await ws.send(message)
        except ConnectionClosedError:  # 4000 is not a normal closure (1000, 1001)
            pass
        closed.append((ws.close_code, ws.close_reason))

    async def main() -> None:
        async with serve(handler, LOCAL, 0, ssl=tls_files.server_context(),
                         max_size=4 << 20) as server:
            port = next(iter(server.sockets)).getsockname()[1]
            async with connect(f"wss://localhost:{port}", host=LOCAL,
                               ssl=tls_files.client_context(),
                               server_hostname="localhost", max_size=4 << 20) as ws:
                assert ws.transport.get_extra_info("ssl_object") is not None
                await ws.send("hello")
                assert await ws.recv() == "hello"
                payload = os.urandom(1 << 20)
                await ws.send(payload)
                assert await ws.recv() == payload
                latency = await (await ws.ping())
                assert latency >= 0
                await ws.close(4000, "done")
                assert (ws.close_code, ws.close_reason) == (4000, "done")
            while not closed:
                await asyncio.sleep(0.01)
        assert closed == [(4000, "done")]

    run(loop, main())
