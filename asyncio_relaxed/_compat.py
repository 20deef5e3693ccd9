"""Every use of CPython's private asyncio names, in one place.

Checked against CPython 3.10.13, 3.11.7, 3.12.1 and 3.13.0 (the pyenv builds
the conformance run uses); 3.14 by reading its sources.  When a name moves,
this is the only module to change.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
from asyncio import (
    base_events,
    constants,
    events,
    format_helpers,
    futures,
    selector_events,
    sslproto,
    transports,
    trsock,
)
from typing import Any

__all__ = [
    "ACCEPT_RETRY_DELAY",
    "DEFAULT_SSL_TIMEOUTS",
    "LOG_THRESHOLD_FOR_CONNLOST_WRITES",
    "MAXIMUM_SELECT_TIMEOUT",
    "MIN_CANCELLED_TIMER_HANDLES_FRACTION",
    "MIN_SCHEDULED_TIMER_HANDLES",
    "PY312",
    "PY314",
    "SENDFILE_TRY_NATIVE",
    "STOCK_HANDLE_RUN",
    "STOCK_PROCESS_EVENTS",
    "TRANSPORT_EXTRA_SLOT",
    "FlowControlMixin",
    "Handle",
    "SSLProtocol",
    "SelectorEventLoop",
    "TransportSocket",
    "base_default_policy",
    "cancel_all_tasks",
    "format_callback_source",
    "format_handle",
    "loop_logger",
    "server_attach",
    "server_detach",
    "set_nodelay",
    "set_result_unless_cancelled",
    "transport_logger",
]

# The modules as Any: typeshed leaves out the private names used below.
_base_events: Any = base_events
_constants: Any = constants
_futures: Any = futures
_selector_events: Any = selector_events

PY312 = sys.version_info >= (3, 12)
PY314 = sys.version_info >= (3, 14)

# Typed as Any: typeshed does not declare the private attributes the loop
# overrides and reads (_ready, _scheduled, _selector, _process_events, ...).
SelectorEventLoop: Any = asyncio.SelectorEventLoop

# Base of every selector transport: pause_writing/resume_writing bookkeeping
# (_protocol_paused, _high_water, _low_water, _maybe_pause_protocol, ...).
# _base_events._SendfileFallbackProtocol reads transp._protocol_paused.
FlowControlMixin: Any = transports._FlowControlMixin

TransportSocket: Any = trsock.TransportSocket
SSLProtocol: Any = sslproto.SSLProtocol
SENDFILE_TRY_NATIVE: Any = _constants._SendfileMode.TRY_NATIVE
LOG_THRESHOLD_FOR_CONNLOST_WRITES: int = _constants.LOG_THRESHOLD_FOR_CONNLOST_WRITES
ACCEPT_RETRY_DELAY: float = _constants.ACCEPT_RETRY_DELAY

# The timer-heap housekeeping constants of BaseEventLoop._run_once.
MAXIMUM_SELECT_TIMEOUT: float = _base_events.MAXIMUM_SELECT_TIMEOUT
MIN_SCHEDULED_TIMER_HANDLES: int = _base_events._MIN_SCHEDULED_TIMER_HANDLES
MIN_CANCELLED_TIMER_HANDLES_FRACTION: float = (
    _base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION
)

# ssl_handshake_timeout, and ssl_shutdown_timeout from 3.11: the trailing
# positional arguments of _start_serving/_accept_connection/_accept_connection2.
DEFAULT_SSL_TIMEOUTS: tuple[float, ...] = (_constants.SSL_HANDSHAKE_TIMEOUT,) + (
    (_constants.SSL_SHUTDOWN_TIMEOUT,) if sys.version_info >= (3, 11) else ()
)

format_handle: Any = _base_events._format_handle

set_nodelay: Any = _base_events._set_nodelay
set_result_unless_cancelled: Any = _futures._set_result_unless_cancelled

# Handle._run as this Python defines it.  The loop's direct dispatch inlines
# it only while it is still this function: instrumentation replaces it
# (aiodebug's slow-callback logging) and must keep seeing I/O callbacks.
Handle: Any = events.Handle
STOCK_HANDLE_RUN: Any = events.Handle._run
# The selector loop's _process_events: a subclass or a patch that replaces it
# gets stock's (key, mask) pairs, not the poller's (fd, data, mask).
STOCK_PROCESS_EVENTS: Any = selector_events.BaseSelectorEventLoop._process_events  # type: ignore[attr-defined]

# BaseTransport's storage slot for _extra, under the transport's property.
TRANSPORT_EXTRA_SLOT: Any = transports.BaseTransport.__dict__["_extra"]
def format_callback_source(callback: Any, args: Any, debug: bool) -> str:
    """The "Exception in callback ..." text of Handle._run (3.13 added *debug*)."""
    source: Any = format_helpers._format_callback_source
    if sys.version_info >= (3, 13):
        return source(callback, args, debug=debug)  # type: ignore[no-any-return]
    return source(callback, args)  # type: ignore[no-any-return]

# Server._attach/_detach take the transport since 3.13 (Server.close_clients).
_ATTACH_TAKES_TRANSPORT = (
    len(inspect.signature(_base_events.Server._attach).parameters) == 2
)


def loop_logger() -> logging.Logger:
    """asyncio's logger as base_events sees it now (tests patch it there)."""
    return _base_events.logger  # type: ignore[no-any-return]


def transport_logger() -> logging.Logger:
    """asyncio's logger as selector_events sees it now (tests patch it there)."""
    return _selector_events.logger  # type: ignore[no-any-return]


def server_attach(server: Any, transport: Any) -> None:
    if _ATTACH_TAKES_TRANSPORT:
        server._attach(transport)
    else:
        server._attach()


def server_detach(server: Any, transport: Any) -> None:
    if _ATTACH_TAKES_TRANSPORT:
        server._detach(transport)
    else:
        server._detach()


def server_active_count(server: Any) -> int:
    """Open transports of an asyncio Server (attached in the transport's
    __init__, detached at connection_lost): Server._active_count on
    3.10-3.12, the size of Server._clients (a WeakSet of them) from 3.13."""
    count = getattr(server, "_active_count", None)
    if count is not None:
        return int(count)
    clients = getattr(server, "_clients", None)
    return len(clients) if clients is not None else 1


def cancel_all_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio.runners._cancel_all_tasks, for run() on 3.10."""
    from asyncio import runners

    runners._cancel_all_tasks(loop)  # type: ignore[attr-defined]


def base_default_policy() -> Any:
    """The class our EventLoopPolicy derives from.

    asyncio.DefaultEventLoopPolicy is deprecated from 3.14 (accessing it
    warns); the class behind it is reached without the warning.
    """
    if PY314:
        if sys.platform == "win32":
            from asyncio import windows_events

            return windows_events._DefaultEventLoopPolicy  # type: ignore[attr-defined]
        from asyncio import unix_events

        return unix_events._UnixDefaultEventLoopPolicy
    return asyncio.DefaultEventLoopPolicy
