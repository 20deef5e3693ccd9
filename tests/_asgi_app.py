"""A tiny ASGI app for the integration tests: it reports the loop serving it.

``GET /`` (any path) answers JSON ``{"loop", "pid", "config"}``, where
``config`` holds asyncio_relaxed's settings when the loop is ours, and an
``X-Event-Loop`` header.  Run by uvicorn and gunicorn in a subprocess, so it
imports nothing from pytest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import asyncio_relaxed

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def report(loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    cls = type(loop)
    result: dict[str, Any] = {"loop": f"{cls.__module__}.{cls.__qualname__}", "pid": os.getpid()}
    if isinstance(loop, asyncio_relaxed.PyLoop):
        result["config"] = {
            f.name: (v.value if isinstance(v := getattr(loop.config, f.name), enum.Enum) else v)
            for f in dataclasses.fields(loop.config)
        }
    return result


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = report(asyncio.get_running_loop())
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"x-event-loop", body["loop"].encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})
