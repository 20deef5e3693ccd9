"""An aiohttp HTTP server on the loop of your choice.

Serve on one loop (Ctrl-C or SIGTERM stops it gracefully)::

    python examples/http_server.py --loop relaxed --write deferred --port 8080
    curl -i localhost:8080/          # the X-Event-Loop header names the loop class
    curl localhost:8080/stats        # our loop's settings and statistics()
    curl localhost:8080/metrics      # Prometheus text (pip install prometheus-client)

Serve under gunicorn, each worker making its own loop after the fork
(settings through gunicorn's raw_env, ``-e``), from the checkout's root
(gunicorn imports this file as ``examples.http_server``)::

    mkdir -p /dev/shm/pool
    gunicorn 'examples.http_server:create_app' --workers 4 --bind 127.0.0.1:8080 \\
        --worker-class asyncio_relaxed.gunicorn.GunicornWebWorker \\
        -e ASYNCIO_RELAXED_ACCEPT=balanced -e ASYNCIO_RELAXED_STATS_DIR=/dev/shm/pool
    python -m asyncio_relaxed top /dev/shm/pool      # every worker, live
    curl localhost:8080/metrics                  # every worker, one scrape

Routes: ``GET /`` says hello; ``GET /4k`` returns 4 KiB; ``POST /echo``
returns its JSON body; ``GET /stats`` returns the loop's name, the process id
and, on asyncio_relaxed's loop, its settings, ``statistics()``, ``health()``
(with utilisation and lag p50/p99 since the loop was made), ``gauges()`` and
``listener_statistics()``; ``GET /metrics`` the loop's counters, gauges and
health in Prometheus' text format (``asyncio_relaxed.metrics``; each sample
labelled with the worker's pid), and with ``ASYNCIO_RELAXED_STATS_DIR`` set
every worker's of the pool at once, whichever worker answers.  Every
response carries ``X-Event-Loop``.  With ``--port 0`` the system picks a
free port; the first line printed is ``{"listening": PORT, "loop": NAME}``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import enum
import json
import os
import socket
from typing import Any

from aiohttp import web

import asyncio_relaxed

FOUR_KIB = b"x" * 4096


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    cls = type(loop)
    return f"{cls.__module__}.{cls.__qualname__}"


def loop_report(loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    """What /stats returns: which loop, which process, and our loop's counters."""
    report: dict[str, Any] = {"loop": loop_name(loop), "pid": os.getpid()}
    if isinstance(loop, asyncio_relaxed.Loop):
        config = loop.config
        report["config"] = {
            field.name: _plain(getattr(config, field.name)) for field in dataclasses.fields(config)
        }
        report["statistics"] = loop.statistics().as_dict()
        health = loop.health()
        report["health"] = {**health.as_dict(), "utilisation": health.utilisation(),
                            "lag_p50": health.lag_p50, "lag_p99": health.lag_p99}
        report["gauges"] = loop.gauges().as_dict()
        report["listeners"] = [
            {**dataclasses.asdict(listener), "address": str(listener.address)}
            for listener in loop.listener_statistics()
        ]
    return report


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


# -- the application ------------------------------------------------------------


async def hello(request: web.Request) -> web.Response:
    return web.Response(text="Hello, world!\n")


async def four_kib(request: web.Request) -> web.Response:
    return web.Response(body=FOUR_KIB, content_type="application/octet-stream")


async def echo(request: web.Request) -> web.Response:
    try:
        data = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="POST /echo wants a JSON body\n") from None
    return web.json_response(data)


async def stats(request: web.Request) -> web.Response:
    return web.json_response(loop_report(asyncio.get_running_loop()))


async def metrics(request: web.Request) -> web.Response:
    loop = asyncio.get_running_loop()
    if not isinstance(loop, asyncio_relaxed.Loop):
        raise web.HTTPNotImplemented(text="/metrics needs asyncio_relaxed's loop\n")
    try:
        import prometheus_client
    except ImportError:
        raise web.HTTPNotImplemented(text="/metrics needs prometheus-client: "
                                          "pip install prometheus-client\n") from None
    from asyncio_relaxed.metrics import PoolCollector, PrometheusCollector

    # With stats_dir (a pool's loops publishing there), any worker serves
    # every worker's series in one scrape; else this loop's.
    registry = prometheus_client.CollectorRegistry()
    stats_dir = loop.config.stats_dir
    registry.register(PoolCollector(stats_dir) if stats_dir else PrometheusCollector(loop))
    return web.Response(body=prometheus_client.generate_latest(registry),
                        headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})


async def name_the_loop(request: web.Request, response: web.StreamResponse) -> None:
    # on_response_prepare runs for every response, errors included, so a
    # client can tell which loop served any request.
    response.headers["X-Event-Loop"] = loop_name(asyncio.get_running_loop())


async def create_app() -> web.Application:
    """The application; a coroutine function, as aiohttp's gunicorn worker expects."""
    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/4k", four_kib)
    app.router.add_post("/echo", echo)
    app.router.add_get("/stats", stats)
    app.router.add_get("/metrics", metrics)
    app.on_response_prepare.append(name_the_loop)
    return app


# -- running it -----------------------------------------------------------------


def listen(host: str, port: int, backlog: int) -> socket.socket:
    # Bound here rather than by run_app so that --port 0 can report the port
    # it got before serving: connections made meanwhile wait in the backlog.
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=backlog)


def main(argv: list[str] | None = None) -> None:
    # Imported here: gunicorn imports this module as examples.http_server for
    # create_app(), where the scripts' folder is not on sys.path.
    from _loops import add_loop_option, loop_factory

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_loop_option(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--backlog", type=int, default=1024)
    parser.add_argument(
        "--write",
        choices=[m.value for m in asyncio_relaxed.WriteMode],
        help="relaxed write mode (default: ASYNCIO_RELAXED_WRITE, else eager)",
    )
    parser.add_argument(
        "--partial-write",
        choices=[m.value for m in asyncio_relaxed.PartialWrite],
        help="relaxed short-write policy (default: ASYNCIO_RELAXED_PARTIAL_WRITE, else poll)",
    )
    parser.add_argument(
        "--stats-dir",
        help="publish the loop's statistics there for `python -m asyncio_relaxed top` and "
        "/metrics (default: ASYNCIO_RELAXED_STATS_DIR, else none)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight requests get to finish after SIGINT/SIGTERM",
    )
    args = parser.parse_args(argv)
    loop = loop_factory(parser, args.loop, write=args.write,
                        partial_write=args.partial_write, stats_dir=args.stats_dir)()
    sock = listen(args.host, args.port, args.backlog)
    print(json.dumps({"listening": sock.getsockname()[1], "loop": loop_name(loop)}), flush=True)
    # run_app installs SIGINT and SIGTERM handlers on the loop (GracefulExit):
    # it stops accepting, gives in-flight requests shutdown_timeout, runs the
    # app's cleanup, then closes the loop.  It returns normally, so the exit
    # status is 0.
    web.run_app(
        create_app(),
        sock=sock,
        loop=loop,
        backlog=args.backlog,
        shutdown_timeout=args.shutdown_timeout,
        print=None,
        access_log=None,
    )
    report: dict[str, Any] = {"stopped": loop_name(loop)}
    if isinstance(loop, asyncio_relaxed.Loop):
        report["statistics"] = loop.statistics().as_dict()  # readable after close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
