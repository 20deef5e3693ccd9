"""The ``uvicorn`` server kind: uvicorn + httptools serving an ASGI hello app
(and the way ``uvicorn-json`` runs uvicorn, benchmarks.workloads.apps).

What most users of an asyncio server run: uvicorn with its httptools
protocol, keep-alive, an ASGI app answering every request with 13 bytes of
``text/plain`` (TechEmpower's plaintext test, without its pipelining).  The
loop is the one uvicorn makes from its ``--loop`` option, as a user would
name it (:func:`loop_option`): ``asyncio``, ``uvloop``, ``zuvloop``, and a
``module:function`` factory for the others (uvicorn >= 0.36), ours
``asyncio_relaxed:new_event_loop``.  That factory takes no arguments from
uvicorn, so a relaxed preset's settings reach it as the ``ASYNCIO_RELAXED_*``
environment variables a deployment would set.

The server takes its socket from this process (bound before uvicorn starts,
so the port is known) and answers the runner as every server does
(benchmarks.workloads.control): the app's lifespan startup, which runs
on uvicorn's loop, checks that the loop is the one asked for, prints
``{"listening": PORT, ...}`` and starts the thread that answers the marks;
the end of input makes uvicorn exit.  :func:`serve` runs either app
(``plaintext``, or ``json``: benchmarks.workloads.apps.json_app), on either
of uvicorn's HTTP protocols (``httptools``, ``h11``), over TLS with
uvicorn's own ``ssl_certfile``/``ssl_keyfile`` (the harness's certificate,
benchmarks.harness.tls); a loop whose ``create_server(ssl=)`` refuses says
so at startup (control.unsupported) instead of listening.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.harness import checkout, loops
from benchmarks.workloads import apps
from benchmarks.workloads.control import control, listening, unsupported

BODY = b"Hello, world!"
HEADERS = [(b"content-type", b"text/plain"), (b"content-length", str(len(BODY)).encode())]
#: uvicorn's own names for the loops it knows; the others by factory.
UVICORN_NAMES = {"asyncio": "asyncio", "uvloop": "uvloop", "zuvloop": "zuvloop"}

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def loop_option(name: str) -> str:
    """uvicorn's ``--loop`` value for loop *name* of benchmarks.harness.loops."""
    kind = loops.SPECS[name].kind
    if kind == "relaxed":
        return "asyncio_relaxed:new_event_loop"
    if kind in UVICORN_NAMES:
        return UVICORN_NAMES[kind]
    if kind in loops.PEER_KINDS:
        return f"{kind}:new_event_loop"
    raise LookupError(f"{name} is not an event loop uvicorn can run")


def check_loop(name: str, loop: asyncio.AbstractEventLoop) -> None:
    """Refuse to serve on a loop other than *name*'s (with its settings)."""
    spec = loops.SPECS[name]
    cls = type(loop)
    package = "asyncio_relaxed" if spec.kind == "relaxed" else spec.kind
    if cls.__module__.split(".")[0] != package:
        raise RuntimeError(f"uvicorn --loop {loop_option(name)} made a "
                           f"{cls.__module__}.{cls.__qualname__}, not loop {name}")
    if spec.settings:
        config = loops.settings_dict(loop.config)  # type: ignore[attr-defined]
        wrong = {k: config[k] for k, v in spec.settings.items() if config[k] != v}
        if wrong:
            raise RuntimeError(f"loop {name} under uvicorn runs with {wrong}, not "
                               f"{dict(spec.settings)}: the environment overrides the preset")


def plaintext_app(started: Callable[[asyncio.AbstractEventLoop], Awaitable[None]]) -> Any:
    """The ASGI app: ``await started(loop)`` at lifespan startup, then 13
    bytes of text for every request."""

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    try:
                        await started(asyncio.get_running_loop())
                    except Exception as exc:
                        await send({"type": "lifespan.startup.failed", "message": str(exc)})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        await send({"type": "http.response.body", "body": BODY})

    return app


def serve(name: str, app: str = "plaintext", http: str = "httptools",
          over_tls: bool = False) -> None:
    """Serve *app* ("plaintext" or "json") on loop *name* (a preset of
    benchmarks.harness.loops) under uvicorn with its *http* protocol, over
    TLS with *over_tls*, until the end of input."""
    import uvicorn

    preset = loops.preset(name)
    for key, value in loops.SPECS[preset].settings.items():
        os.environ[f"ASYNCIO_RELAXED_{key.upper()}"] = value
    # IPPROTO_TCP, as the socket of create_server(host, port) that plain
    # ``uvicorn --port`` makes: stock asyncio sets TCP_NODELAY only on a
    # socket whose proto says TCP, and a socket.socket() says 0 (under
    # Nagle, a response written in two parts waits for a delayed ACK, 40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    holder: list[uvicorn.Server] = []

    async def started(loop: asyncio.AbstractEventLoop) -> None:
        check_loop(preset, loop)
        if over_tls:
            why = await apps.tls_refused(loop)
            if why:
                unsupported(why)
                raise RuntimeError(why)  # uvicorn's startup fails: nothing listens
        cls = type(loop)
        listening(sock.getsockname()[1], f"{cls.__module__}.{cls.__qualname__}",
                  checkout.relaxed_package(), uvicorn=uvicorn.__version__,
                  uvicorn_loop=loop_option(preset), uvicorn_http=http)
        control(loop, lambda: setattr(holder[0], "should_exit", True))

    make = {"plaintext": plaintext_app, "json": apps.json_app}[app]
    config = uvicorn.Config(make(started), loop=loop_option(preset), http=http,
                            lifespan="on", access_log=False, log_level="warning", backlog=1024,
                            **(apps.tls_paths() if over_tls else {}))
    holder.append(uvicorn.Server(config))
    holder[0].run(sockets=[sock])
