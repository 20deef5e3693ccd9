"""Gunicorn worker classes that run every worker on asyncio_relaxed's loop.

aiohttp applications (the counterpart of ``aiohttp.worker.GunicornUVLoopWebWorker``)::

    gunicorn 'myapp:create_app' --worker-class asyncio_relaxed.gunicorn.GunicornWebWorker

ASGI applications through uvicorn (the counterpart of ``uvicorn_worker.UvicornWorker``
with ``loop="uvloop"``)::

    gunicorn 'myapp:app' --worker-class asyncio_relaxed.gunicorn.UvicornWorker

Theory of operation
-------------------

Each worker makes its own loop after gunicorn has forked it, never in the
arbiter.  An epoll instance made before ``fork()`` is one kernel object shared
by parent and child: a descriptor that one process registers or removes
changes the other's interest set, and both would be woken for the same events.
aiohttp's and uvicorn's workers already make their loop in the worker; these
classes change only which loop that is.

Settings are read when the loop is made, from ``ASYNCIO_RELAXED_*`` environment
variables (see :class:`asyncio_relaxed.Config`).  Gunicorn's ``raw_env`` setting
(``-e ASYNCIO_RELAXED_WRITE=deferred`` or ``raw_env = [...]`` in a config file)
sets them in the arbiter before it forks, so every worker sees them, as does an
environment the arbiter was started with.  A bad value stops gunicorn at worker
boot ("Worker failed to boot", exit status 3) with the message naming the
variable, instead of respawning workers that fail forever.

Each class is built the first time it is looked up (PEP 562), and only then is
its peer imported: importing this module needs gunicorn alone,
``GunicornWebWorker`` needs aiohttp, ``UvicornWorker`` needs uvicorn >= 0.36 (the
first release that takes a loop factory as ``"module:function"``, and calls it
with no arguments).  A missing peer raises ImportError naming what to install.
"""

from __future__ import annotations

import asyncio
import importlib
import warnings
from collections.abc import Callable
from typing import Any

import asyncio_relaxed

try:
    import gunicorn  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401
except ImportError as exc:  # optional peer
    raise ImportError(
        "asyncio_relaxed.gunicorn holds gunicorn worker classes and needs gunicorn, "
        "which is not installed; install it with: pip install 'gunicorn>=22.0'"
    ) from exc

__all__ = ["UVICORN_LOOP", "GunicornWebWorker", "UvicornWorker"]

#: uvicorn's ``loop`` setting for our loop: uvicorn >= 0.36 imports a
#: "module:attribute" string and uses it as the loop factory, so this also works
#: as ``uvicorn app:app --loop asyncio_relaxed:new_event_loop``.
UVICORN_LOOP = "asyncio_relaxed:new_event_loop"

# Built on first look-up by __getattr__ below; declared for type checkers.
GunicornWebWorker: Any
UvicornWorker: Any


def _close_inherited_loop() -> None:
    """Close a loop the arbiter left set for this thread, as aiohttp's worker does.

    Python 3.12 and 3.13 warn (DeprecationWarning) when there is no current
    loop and make one, which is closed at once; 3.14 raises RuntimeError.
    Neither is worth reporting from a worker's start-up.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.get_event_loop().close()
    except RuntimeError:
        pass  # no loop was set


def _build_aiohttp_worker() -> type:
    try:
        from aiohttp import worker as aiohttp_worker  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:  # optional peer
        raise ImportError(
            "asyncio_relaxed.gunicorn.GunicornWebWorker serves aiohttp applications and "
            "needs aiohttp, which is not installed; install it with: "
            "pip install 'aiohttp>=3.9'"
        ) from exc

    class GunicornWebWorker(aiohttp_worker.GunicornWebWorker):  # type: ignore[misc, unused-ignore]
        """``aiohttp.worker.GunicornWebWorker`` on an :class:`asyncio_relaxed.Loop`.

        Everything but the loop is aiohttp's: the app factory, access log,
        graceful shutdown, ``max_requests``, signals through the loop.
        """

        def init_process(self) -> None:
            # The steps of aiohttp's init_process, with our loop.  aiohttp's
            # own would replace it with asyncio.new_event_loop(); its uvloop
            # worker gets around that by installing a policy first, which
            # Python 3.14 deprecates.  So call gunicorn's init_process
            # directly (it boots the worker and calls run()).  Revisit if
            # aiohttp's init_process ever does more than make the loop.
            _close_inherited_loop()
            self.loop = asyncio_relaxed.new_event_loop()
            asyncio.set_event_loop(self.loop)
            super(aiohttp_worker.GunicornWebWorker, self).init_process()

    return GunicornWebWorker


def _build_uvicorn_worker() -> type:
    try:
        import uvicorn  # type: ignore[import-not-found, unused-ignore]
        from uvicorn.config import (  # type: ignore[import-not-found, unused-ignore]
            Config as UvicornConfig,
        )
    except ImportError as exc:  # optional peer
        raise ImportError(
            "asyncio_relaxed.gunicorn.UvicornWorker serves ASGI applications through "
            "uvicorn and needs uvicorn >= 0.36, which is not installed; install it with: "
            "pip install 'uvicorn>=0.36' uvicorn-worker"
        ) from exc
    if not hasattr(UvicornConfig, "get_loop_factory"):
        raise ImportError(
            "asyncio_relaxed.gunicorn.UvicornWorker needs uvicorn >= 0.36, the first "
            "release that accepts a loop factory as 'module:function'; uvicorn "
            f"{uvicorn.__version__} is installed; upgrade with: pip install -U uvicorn"
        )
    base: Any
    try:
        # The maintained home of uvicorn's gunicorn worker.
        base = importlib.import_module("uvicorn_worker").UvicornWorker
    except ImportError:
        try:
            with warnings.catch_warnings():
                # uvicorn.workers warns on import that it moved to the
                # uvicorn-worker package.  The advice is for whoever chose the
                # import, here this module, and our docs repeat it.
                warnings.simplefilter("ignore", DeprecationWarning)
                base = importlib.import_module("uvicorn.workers").UvicornWorker
        except ImportError as exc:
            raise ImportError(
                "asyncio_relaxed.gunicorn.UvicornWorker needs uvicorn's gunicorn worker, "
                "which this uvicorn no longer ships; install it with: pip install uvicorn-worker"
            ) from exc

    class UvicornWorker(base):  # type: ignore[misc]
        """uvicorn's gunicorn worker with ``loop="asyncio_relaxed:new_event_loop"``.

        uvicorn calls the factory in the worker's ``run()``, after the fork,
        through ``asyncio.run(..., loop_factory=...)``; no policy is set.
        """

        CONFIG_KWARGS: dict[str, Any] = {**base.CONFIG_KWARGS, "loop": UVICORN_LOOP}

        def init_process(self) -> None:
            # uvicorn makes the loop only in run(), after gunicorn has marked
            # the worker booted, so a bad ASYNCIO_RELAXED_* value would make
            # the arbiter respawn failing workers forever.  Resolving the
            # settings here fails the boot instead, and gunicorn stops.
            asyncio_relaxed.resolve()
            super().init_process()

    return UvicornWorker


_BUILDERS: dict[str, Callable[[], type]] = {
    "GunicornWebWorker": _build_aiohttp_worker,
    "UvicornWorker": _build_uvicorn_worker,
}


def __getattr__(name: str) -> Any:
    build = _BUILDERS.get(name)
    if build is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = build()
    cls.__qualname__ = name  # not "_build_...<locals>.Name" in reprs and logs
    globals()[name] = cls  # built once; later look-ups do not come here
    return cls


def __dir__() -> list[str]:
    return sorted({*globals(), *_BUILDERS})
