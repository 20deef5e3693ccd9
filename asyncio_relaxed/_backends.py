"""The kernel interfaces the poller drives: epoll directly, or any stdlib selector.

Both take a mask of ``selectors.EVENT_READ``/``EVENT_WRITE`` and raise what
the kernel says (``OSError`` with its errno); the poller
(:class:`asyncio_relaxed._poller.DeferredSelector`) decides what to send and
what an error means.

This module knows nothing of asyncio.
"""

from __future__ import annotations

import select
import selectors

__all__ = ["EPOLLIN", "EPOLLOUT", "HAS_EPOLL", "HAS_EXCLUSIVE", "EpollBackend", "SelectorBackend",
           "default_backend", "kernel_to_mask"]

EVENT_READ = selectors.EVENT_READ
EVENT_WRITE = selectors.EVENT_WRITE

HAS_EPOLL = hasattr(select, "epoll")
EPOLLIN = getattr(select, "EPOLLIN", 1)
EPOLLOUT = getattr(select, "EPOLLOUT", 4)
HAS_EXCLUSIVE = hasattr(select, "EPOLLEXCLUSIVE")


def kernel_to_mask(kmask: int) -> int:
    """An epoll event mask as EVENT_READ/EVENT_WRITE.

    Errors and hang-ups wake both directions, as in selectors.EpollSelector.
    """
    mask = 0
    if kmask & ~EPOLLIN:
        mask |= EVENT_WRITE
    if kmask & ~EPOLLOUT:
        mask |= EVENT_READ
    return mask


class EpollBackend:
    """Direct select.epoll: ADD/MOD/DEL raise OSError with the kernel's errno."""

    name = "epoll"

    def __init__(self) -> None:
        self._epoll = select.epoll()

    def fileno(self) -> int:
        return self._epoll.fileno()

    @staticmethod
    def _kernel_mask(mask: int) -> int:
        kmask = 0
        if mask & EVENT_READ:
            kmask |= select.EPOLLIN
        if mask & EVENT_WRITE:
            kmask |= select.EPOLLOUT
        return kmask

    def add(self, fd: int, mask: int, exclusive: bool = False) -> None:
        kmask = self._kernel_mask(mask)
        if exclusive:
            kmask |= select.EPOLLEXCLUSIVE
        self._epoll.register(fd, kmask)

    def modify(self, fd: int, mask: int) -> None:
        self._epoll.modify(fd, self._kernel_mask(mask))

    def remove(self, fd: int) -> None:
        self._epoll.unregister(fd)

    def poll(self, timeout: float | None, max_events: int) -> list[tuple[int, int]]:
        return [
            (fd, kernel_to_mask(kmask))
            for fd, kmask in self._epoll.poll(-1 if timeout is None else timeout, max_events)
        ]

    def close(self) -> None:
        self._epoll.close()


class SelectorBackend:
    """Drives any stdlib selector through the EpollBackend interface.

    ``add`` means "register whatever file the number names now": an existing
    entry is dropped first, because a wrapped EpollSelector cannot tell a
    reused number from the old file (its ``modify`` with an unchanged mask is
    a no-op).  ``modify`` re-registers when the stdlib selector lost the fd.
    """

    def __init__(self, selector: selectors.BaseSelector) -> None:
        self._selector = selector
        self.name = type(selector).__name__.replace("Selector", "").lower() or "select"

    def fileno(self) -> int:
        fileno = getattr(self._selector, "fileno", None)
        return fileno() if fileno is not None else -1

    def add(self, fd: int, mask: int, exclusive: bool = False) -> None:
        try:
            self._selector.unregister(fd)
        except KeyError:
            pass
        self._selector.register(fd, mask)

    def modify(self, fd: int, mask: int) -> None:
        try:
            self._selector.modify(fd, mask)
        except (KeyError, FileNotFoundError):
            # Unknown to the selector, or a stdlib EpollSelector whose kernel
            # entry vanished (it drops its key before raising): register anew.
            self._selector.register(fd, mask)

    def remove(self, fd: int) -> None:
        try:
            self._selector.unregister(fd)
        except KeyError:
            pass

    def poll(self, timeout: float | None, max_events: int) -> list[tuple[int, int]]:
        return [(key.fd, mask) for key, mask in self._selector.select(timeout)]

    def close(self) -> None:
        self._selector.close()


def default_backend(kind: str = "auto") -> EpollBackend | SelectorBackend:
    """The backend for a poller setting (auto, epoll, poll, select)."""
    if kind in ("auto", "epoll") and HAS_EPOLL:
        return EpollBackend()
    if kind == "epoll":
        raise ValueError("ASYNCIO_RELAXED_POLLER='epoll' is not available on this platform; "
                         "allowed here: auto|poll|select")
    if kind == "poll":
        if not hasattr(selectors, "PollSelector"):
            raise ValueError("ASYNCIO_RELAXED_POLLER='poll' is not available on this "
                             "platform; allowed here: auto|select")
        return SelectorBackend(selectors.PollSelector())
    if kind == "select":
        return SelectorBackend(selectors.SelectSelector())
    return SelectorBackend(selectors.DefaultSelector())
