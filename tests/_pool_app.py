"""The aiohttp app of the pool test (tests/test_top.py), run by gunicorn:
each response says which worker served it and what that worker's own loop
counts, so the test can hold ``python -m asyncio_relaxed top``'s screen to
the workers' own statistics.  Imports nothing from pytest."""

from __future__ import annotations

import asyncio
import os

from aiohttp import web

import asyncio_relaxed


async def own(request: web.Request) -> web.Response:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, asyncio_relaxed.Loop)
    return web.json_response({
        "pid": os.getpid(),
        "accepted": sum(listener.accepted for listener in loop.listener_statistics()),
        "strategies": sorted({listener.strategy for listener in loop.listener_statistics()}),
        "statistics": loop.statistics().as_dict(),
    }, headers={"Connection": "close"})


async def create_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/", own)
    return app
