"""The poller: interest changes applied once per iteration, right before the wait.

Theory of operation
===================

asyncio's selector loop tells the kernel about every interest change at once:
``remove_reader`` is an ``EPOLL_CTL_DEL``, ``add_reader`` an ``EPOLL_CTL_ADD``,
``add_writer`` on a reading socket an ``EPOLL_CTL_MOD``.  A transport that
pauses and resumes reading in one callback, or that adds a writer and drains
its buffer before the loop polls again, pays for changes the kernel never
needed to see.  HAProxy measured up to 4 ``epoll_ctl`` per keep-alive request
from that dance, and +9 %/+14 % req/s from dropping it; libuv keeps a queue of
changed watchers and flushes it in ``uv__io_poll`` just before ``epoll_wait``.

This poller does the same.  For each fd it knows two masks:

* *wanted*: what the loop asked for (a key's ``events``), updated
  synchronously by ``register``/``modify``/``unregister`` so that ``get_key``
  and ``get_map`` (which the loop's ``add_reader`` relies on) always tell the
  truth;
* *applied*: what the kernel was last told.

A change marks the fd dirty; :meth:`select` sends the net change of every dirty
fd to the kernel, then waits.  A reader removed and added back before the next
poll costs nothing.

Lazy removal of reading interest (HAProxy's lazy updates: its 2.x pollers cut
``epoll_ctl`` from 20,078 to 66 per test).  When the only change of an owned
fd (edge 1 below) is that reading is no longer wanted, the flush does not tell
the kernel at all: the fd stays polled for input.  A keep-alive connection
that pauses reading and resumes it a few iterations later, while its peer
sends nothing, so costs no system call.  Only if an event for the unwanted
direction actually arrives is the change applied, then (one MOD or DEL, as an
eager flush would have sent, plus the wake-up that brought the event).  The
event itself is dropped: the loop only sees what is wanted.  Removing *write*
interest is never lazy: a socket whose buffer drained is writable, so the
EPOLLOUT nobody wants would arrive at the very next poll.

epoll's sharp edges, and what we do about each
----------------------------------------------

1. *Registrations belong to open files, not fd numbers.*  Closing the last
   descriptor of a file silently drops its registration, and the number can be
   handed to a new socket within the same iteration.  Worse, a registration
   whose fd is closed while a duplicate of the file lives on (a fork child,
   ``socket.dup``) can no longer be removed by number: epoll keeps reporting
   it under a number that may by then name something else.  So a removal may
   be deferred only while the fd is certainly open, and only an *owner* can
   promise that: a transport calls :meth:`DeferredSelector.own` for its socket and
   :meth:`DeferredSelector.release` right before closing it, which applies any pending
   change while the fd is still open.  Removals of owned fds are deferred
   (pause+resume in one iteration costs nothing); removals of any other fd go
   to the kernel at once, as in stock asyncio.

2. *New registrations are applied at once*, not at the flush: it is one
   syscall either way, and it keeps errors where stock asyncio raises them
   (``add_reader`` on a closed fd raises OSError immediately).  If the number
   was registered before, the new file may or may not be the one the kernel
   holds, so the change goes out as MOD falling back to ADD on ENOENT, or ADD
   falling back to MOD on EEXIST: correct whichever file the number names.

3. *DEL or MOD of a closed fd* fails with EBADF or ENOENT: the kernel already
   dropped it.  Both are ignored, as selectors' ``unregister`` ignores them
   and stock asyncio is silent when a registered fd is closed.

4. *Stray events*: if the kernel reports an fd we do not know (a registration
   kept alive by a duplicate, edge 1) and it cannot be removed, the epoll set
   is rebuilt from the wanted masks (rare, and always correct).

5. *epoll refuses regular files and /dev/null with EPERM* (they are always
   ready; stock asyncio raises PermissionError from ``add_reader``).  Such fds
   are kept out of the kernel and reported ready on every poll, with a zero
   timeout, like libuv serves what kqueue rejects with a select() thread.

Where epoll does not exist, or ``ASYNCIO_RELAXED_POLLER`` forces it, the same
bookkeeping drives a stdlib selector (kqueue, poll, select) through
:class:`SelectorBackend`; a stdlib selector passed to the loop's constructor is
wrapped the same way.

This module knows nothing of asyncio; it is tested with pipes and sockets only.
"""

from __future__ import annotations

import errno
import math
import select
import selectors
from collections.abc import Callable, Mapping
from typing import Any

from ._stats import Counters

__all__ = [
    "EVENT_READ",
    "EVENT_WRITE",
    "DeferredSelector",
    "EpollBackend",
    "SelectorBackend",
    "default_backend",
]

EVENT_READ = selectors.EVENT_READ
EVENT_WRITE = selectors.EVENT_WRITE
_BOTH = EVENT_READ | EVENT_WRITE
SelectorKey = selectors.SelectorKey

_HAS_EPOLL = hasattr(select, "epoll")
_EPOLLIN = getattr(select, "EPOLLIN", 1)
_EPOLLOUT = getattr(select, "EPOLLOUT", 4)


def _kernel_to_mask(kmask: int) -> int:
    """An epoll event mask as EVENT_READ/EVENT_WRITE.

    Errors and hang-ups wake both directions, as in selectors.EpollSelector.
    """
    mask = 0
    if kmask & ~_EPOLLIN:
        mask |= EVENT_WRITE
    if kmask & ~_EPOLLOUT:
        mask |= EVENT_READ
    return mask


def _fileobj_to_fd(fileobj: Any) -> int:
    """Same rules and error texts as selectors._fileobj_to_fd."""
    if isinstance(fileobj, int):
        fd = fileobj
    else:
        try:
            fd = int(fileobj.fileno())
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"Invalid file object: {fileobj!r}") from None
    if fd < 0:
        raise ValueError(f"Invalid file descriptor: {fd}")
    return fd


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
            (fd, _kernel_to_mask(kmask))
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
    if kind in ("auto", "epoll") and _HAS_EPOLL:
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


# An fd's state in one small int (ints below 256 are shared objects):
_WANTED = _BOTH  # bits 0-1: the mask the loop asked for; 0 when not registered
_APPLIED_SHIFT = 2  # bits 2-3: the mask the kernel holds; 0 when it holds none
_APPLIED = _BOTH << _APPLIED_SHIFT
_OWNED = 16  # bit 4: own() was called and release() not yet (edge 1)
# The state of nearly every fd of a server: a connection's socket, owned by
# its transport, reading, and the kernel told so.  DeferredSelector._state leaves it
# out (a registered fd without an entry is in this state), so an idle
# connection costs one dict entry in the poller, not two.
_COMMON = EVENT_READ | EVENT_READ << _APPLIED_SHIFT | _OWNED


class _Mapping(Mapping[Any, SelectorKey]):
    """get_map(): the registered keys, looked up by fd or file object."""

    __slots__ = ("_poller",)

    def __init__(self, poller: DeferredSelector) -> None:
        self._poller = poller

    def __len__(self) -> int:
        return len(self._poller._data)

    def __getitem__(self, fileobj: Any) -> SelectorKey:
        return self._poller.get_key(fileobj)

    def get(self, fileobj: Any, default: Any = None) -> Any:
        # Read on every add_reader/remove_reader by 3.13's loop: without
        # Mapping.get's try/except around __getitem__.
        # An invalid file object raises ValueError, as selectors' does.
        poller = self._poller
        fd = poller._lookup(fileobj)
        data = poller._data.get(fd, _MISSING)
        if data is _MISSING:
            return default
        return poller._key(fd, data)

    def __iter__(self) -> Any:
        return iter(self._poller._data)


_MISSING: Any = object()
_new_key = tuple.__new__  # SelectorKey without its Python-level __new__


class DeferredSelector(selectors.BaseSelector):
    """A selector whose kernel updates are deferred to the next :meth:`select`.

    *backend* is an :class:`EpollBackend` or a :class:`SelectorBackend`; a
    plain stdlib selector is wrapped.  *stats* receives the counts of kernel
    calls.  ``on_error(fd, exc)`` is told about a deferred change the kernel
    refused for a reason other than the fd being closed (ENOMEM, ENOSPC).

    Per registered fd it keeps the data (``_data``) and, unless it is
    _COMMON, a small int (``_state``: wanted mask, applied mask, owned); it
    makes SelectorKey objects only when asked (get_key, get_map, select).
    A server holding 10,000 idle connections would otherwise keep 10,000
    keys of 80 bytes and three tables.  The loop polls with :meth:`ready`,
    which hands out (fd, data, mask) without making keys.
    """

    def __init__(
        self,
        backend: EpollBackend | SelectorBackend | selectors.BaseSelector | None = None,
        *,
        stats: Counters | None = None,
    ) -> None:
        if backend is None:
            backend = default_backend()
        elif isinstance(backend, selectors.BaseSelector):
            backend = SelectorBackend(backend)
        self._backend: EpollBackend | SelectorBackend = backend
        self.stats = stats if stats is not None else Counters()
        self.on_error: Callable[[int, BaseException], None] | None = None
        self._data: dict[int, Any] = {}  # registered fd -> its key's data
        self._state: dict[int, int] = {}  # fd -> wanted | applied << 2 | owned (_get)
        self._fileobjs: dict[int, Any] = {}  # registered fd -> file object, if not the fd
        self._dirty: set[int] = set()  # fds whose wanted mask may differ
        self._exclusive: set[int] = set()  # registered with EPOLLEXCLUSIVE
        self._always_ready: set[int] = set()  # EPERM fds (edge 5)
        self._map = _Mapping(self)
        self._closed = False
        # The epoll object for the fast path of select(), None on other backends.
        self._epoll: Any = backend._epoll if isinstance(backend, EpollBackend) else None

    # -- introspection -------------------------------------------------

    @property
    def backend_name(self) -> str:
        return self._backend.name

    def fileno(self) -> int:
        return self._backend.fileno()

    def get_map(self) -> Mapping[Any, SelectorKey]:
        return self._map

    def _lookup(self, fileobj: Any) -> int:
        if type(fileobj) is int and fileobj >= 0:
            return fileobj  # the loop's case: _fileobj_to_fd without the call
        try:
            return _fileobj_to_fd(fileobj)
        except ValueError:
            # A closed file object: find it by identity, as selectors does.
            for fd, registered in self._fileobjs.items():
                if registered is fileobj:
                    return fd
            raise

    def _key(self, fd: int, data: Any) -> SelectorKey:
        """The key of registered *fd* (a registered fd without a state is _COMMON)."""
        return _new_key(
            SelectorKey,
            (self._fileobjs.get(fd, fd), fd, self._state.get(fd, _COMMON) & _WANTED, data),
        )

    def get_key(self, fileobj: Any) -> SelectorKey:
        fd = self._lookup(fileobj)
        data = self._data.get(fd, _MISSING)
        if data is _MISSING:
            raise KeyError(f"{fileobj!r} is not registered")
        return self._key(fd, data)

    def _get(self, fd: int) -> int:
        """*fd*'s state: its entry, or _COMMON if registered, or 0."""
        state = self._state.get(fd)
        if state is None:
            return _COMMON if fd in self._data else 0
        return state

    def _put(self, fd: int, state: int) -> None:
        """Store *fd*'s state; call it after any change of ``_data[fd]``."""
        if state == (_COMMON if fd in self._data else 0):
            self._state.pop(fd, None)
        else:
            self._state[fd] = state

    def _applied(self, fd: int) -> int:
        """The mask the kernel holds for *fd* (0: none)."""
        return (self._get(fd) & _APPLIED) >> _APPLIED_SHIFT

    def _set_applied(self, fd: int, mask: int) -> None:
        self._put(fd, (self._get(fd) & ~_APPLIED) | mask << _APPLIED_SHIFT)

    @property
    def pending_changes(self) -> int:
        """Number of fds whose interest change has not reached the kernel."""
        return len(self._dirty)

    # -- ownership (edge 1) ----------------------------------------------

    def own(self, fd: int) -> None:
        """Promise to call :meth:`release` before closing *fd*.

        Until then, removing *fd*'s registration is deferred to the next
        flush, so that a removal undone within the iteration costs nothing.
        """
        self._put(fd, self._get(fd) | _OWNED)

    def release(self, fd: int) -> None:
        """*fd* is about to be closed: apply its pending change now.

        That includes a lazily kept reading interest: once the owner has
        closed the fd, a duplicate of the file could keep the registration
        alive where no number names it any more (edge 1).
        """
        state = self._get(fd) & ~_OWNED
        self._put(fd, state)
        self._dirty.discard(fd)
        if state & _APPLIED:
            self._flush_one(fd)

    def exclusive(self, fd: int) -> None:
        """Register *fd* with EPOLLEXCLUSIVE (where epoll has it) from now on.

        For listeners shared by processes: one connection wakes one of them.
        The kernel allows the flag on ADD only, so a change of an exclusive
        registration is sent as DEL + ADD.  Cleared by unregister().
        """
        if isinstance(self._backend, EpollBackend) and hasattr(select, "EPOLLEXCLUSIVE"):
            self._exclusive.add(fd)

    def reregister(self, fd: int) -> bool:
        """Register *fd* with the kernel anew: EPOLL_CTL_DEL, then EPOLL_CTL_ADD.

        What is polled stays the same; what changes is this epoll set's place
        among the waiters of the file: epoll adds a new registration at the
        head of the file's wait queue (add_wait_queue), so the order in which
        the file's next event wakes the epoll sets that watch it changes.
        For a listener shared by processes (accept=balanced in the loop).
        A level-triggered fd that is still ready is reported again by the
        next poll, as before.  Returns False, and sends nothing, unless the
        kernel holds exactly what is wanted for *fd* (a change pending, an
        fd epoll refused, or a backend other than epoll).
        """
        if fd not in self._data or self._epoll is None or fd in self._dirty:
            return False
        state = self._state.get(fd, _COMMON)  # registered
        if (state & _APPLIED) >> _APPLIED_SHIFT != state & _WANTED:
            return False
        self._remove_now(fd)
        self._flush_one(fd)  # the ADD; errors as for any deferred change
        return True

    # -- changes --------------------------------------------------------

    def register(self, fileobj: Any, events: int, data: Any = None) -> SelectorKey:
        if not events or events & ~_BOTH:
            raise ValueError(f"Invalid events: {events!r}")
        fd = self._lookup(fileobj)  # a closed file object registered: KeyError below
        if fd in self._data:
            raise KeyError(f"{fileobj!r} (FD {fd}) is already registered")
        states = self._state
        state = states.get(fd, 0) | events  # not registered: no entry means 0
        self._data[fd] = data
        if fileobj is not fd:
            self._fileobjs[fd] = fileobj
        if state == _COMMON:  # _put, inlined (registered now)
            states.pop(fd, None)
        else:
            states[fd] = state
        applied = (state & _APPLIED) >> _APPLIED_SHIFT
        if state & _OWNED and applied:
            # Removed earlier (this iteration, or lazily kept since) and the
            # owner has not closed it: the kernel holds this very file, so
            # only a difference from what it holds needs telling.
            if events == applied:
                self._dirty.discard(fd)
            else:
                self._dirty.add(fd)
        else:
            try:
                self._apply(fd, events)
            except BaseException:
                state = self._get(fd) & ~_WANTED
                del self._data[fd]
                self._fileobjs.pop(fd, None)
                self._put(fd, state)
                raise
        return _new_key(SelectorKey, (fileobj, fd, events, data))

    def modify(self, fileobj: Any, events: int, data: Any = None) -> SelectorKey:
        if not events or events & ~_BOTH:
            raise ValueError(f"Invalid events: {events!r}")
        fd = self._lookup(fileobj)
        datas = self._data
        if fd not in datas:
            raise KeyError(f"{fileobj!r} is not registered")
        states = self._state
        state = states.get(fd, _COMMON)  # registered
        if events != state & _WANTED:
            self._dirty.add(fd)
            state = (state & ~_WANTED) | events
            if state == _COMMON:  # _put, inlined
                del states[fd]
            else:
                states[fd] = state
        datas[fd] = data
        return self._key(fd, data)

    def unregister(self, fileobj: Any) -> SelectorKey:
        fd = self._lookup(fileobj)
        try:
            data = self._data.pop(fd)
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None
        states = self._state
        state = states.get(fd, _COMMON)  # it was registered
        key = _new_key(SelectorKey, (self._fileobjs.pop(fd, fd), fd, state & _WANTED, data))
        state &= ~_WANTED
        if state:  # _put, inlined (not registered now)
            states[fd] = state
        else:
            states.pop(fd, None)
        self._exclusive.discard(fd)
        if fd in self._always_ready:
            self._always_ready.discard(fd)
            self._dirty.discard(fd)
        elif state & _OWNED and state & _APPLIED:
            self._dirty.add(fd)  # deferred: the owner releases before closing
        else:
            self._dirty.discard(fd)
            if state & _APPLIED:
                self._remove_now(fd)
        return key

    def _apply(self, fd: int, mask: int) -> None:
        """Tell the kernel *mask* for *fd* now, whatever file the number names."""
        stats = self.stats
        backend = self._backend
        if fd in self._exclusive:
            if self._applied(fd):
                self._remove_now(fd)
            stats.epoll_ctl_add += 1
            backend.add(fd, mask, exclusive=True)
            self._set_applied(fd, mask)
            return
        try:
            if self._applied(fd):
                try:
                    stats.epoll_ctl_mod += 1
                    backend.modify(fd, mask)
                except FileNotFoundError:
                    # The old file was closed and the number reused (edge 2).
                    stats.epoll_ctl_add += 1
                    backend.add(fd, mask)
            else:
                try:
                    stats.epoll_ctl_add += 1
                    backend.add(fd, mask)
                except FileExistsError:
                    stats.epoll_ctl_mod += 1
                    backend.modify(fd, mask)
        except PermissionError:
            # epoll refuses files that are always ready (edge 5).
            self._set_applied(fd, 0)
            self._always_ready.add(fd)
            stats.always_ready_fds += 1
            return
        except BaseException:
            self._set_applied(fd, 0)
            raise
        self._set_applied(fd, mask)

    def _remove_now(self, fd: int) -> None:
        self._set_applied(fd, 0)
        self.stats.epoll_ctl_del += 1
        try:
            self._backend.remove(fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EBADF):
                raise

    def flush(self) -> None:
        """Send the net interest change of every dirty fd to the kernel."""
        dirty = self._dirty
        if not dirty:
            return
        self._dirty = set()
        for fd in dirty:
            self._flush_one(fd, lazy=True)

    def _flush_one(self, fd: int, lazy: bool = False) -> None:
        """Tell the kernel *fd*'s wanted mask, unless it already holds it.

        With *lazy*, a change that only drops reading interest from an owned
        fd is not sent (see "Lazy removal" above): safe because the owner
        releases the fd before closing it, and select() applies the change
        when an unwanted event comes.
        """
        state = self._get(fd)
        wanted = state & _WANTED
        applied = (state & _APPLIED) >> _APPLIED_SHIFT
        if wanted == applied or fd in self._always_ready:
            return
        if (
            lazy
            and not wanted & ~applied  # nothing to add
            and (applied & ~wanted) == EVENT_READ  # only reading dropped
            and state & _OWNED
            and fd not in self._exclusive
        ):
            return
        if not wanted:
            self._remove_now(fd)
            return
        try:
            self._apply(fd, wanted)
        except OSError as exc:
            if exc.errno == errno.EBADF:
                return  # closed while registered: nothing to wait on (edge 3)
            # Anything else (ENOMEM, ENOSPC from max_user_watches) is real,
            # but must not surface in an unrelated caller: report it.
            if self.on_error is None:
                raise
            self.on_error(fd, exc)

    # -- waiting ---------------------------------------------------------

    def select(self, timeout: float | None = None) -> list[tuple[SelectorKey, int]]:
        """Apply pending changes, then wait at most *timeout* seconds (None: block)."""
        return [(self._key(fd, data), mask) for fd, data, mask in self.ready(timeout)]

    def ready(self, timeout: float | None = None) -> list[tuple[int, Any, int]]:
        """select() for the loop: (fd, data, mask) per ready fd, no SelectorKey."""
        if self._dirty:
            self.flush()
        if self._always_ready:
            timeout = 0
        if timeout is not None:
            if timeout <= 0:
                timeout = 0
            else:
                # epoll_wait has millisecond resolution: round up so that a
                # timer due in 0.3 ms does not become a busy loop of zero waits.
                timeout = math.ceil(timeout * 1e3) * 1e-3
        datas = self._data
        states = self._state
        stats = self.stats
        stats.poll_waits += 1
        ready: list[tuple[int, Any, int]] = []
        epoll = self._epoll
        if epoll is not None:
            # Fast path for the epoll backend, the one every event of a busy
            # server goes through: the kernel's (fd, mask) pairs are turned
            # into (fd, data, mask) in one pass, without EpollBackend.poll's
            # intermediate list.  Same translation as EpollBackend.poll.
            try:
                fd_events = epoll.poll(-1 if timeout is None else timeout, len(datas) or 1)
            except InterruptedError:
                fd_events = []
            append = ready.append
            epollin = _EPOLLIN
            for fd, kmask in fd_events:
                if kmask == epollin and fd not in states and fd in datas:
                    # The common case, by far: input on a registered fd in
                    # the usual state (no _state entry: reading wanted and
                    # applied), so nothing below could change the mask.
                    append((fd, datas[fd], EVENT_READ))
                    continue
                data = datas.get(fd, _MISSING)
                if data is _MISSING:
                    self._unwanted(fd)
                    continue
                events = states.get(fd, _COMMON) & _WANTED
                mask = _kernel_to_mask(kmask)
                if mask & ~events:
                    self._unwanted(fd)
                    mask &= events
                    if not mask:
                        continue
                append((fd, data, mask))
        else:
            try:
                fd_events = self._backend.poll(timeout, max(len(datas), 1))
            except InterruptedError:
                fd_events = []
            for fd, mask in fd_events:
                data = datas.get(fd, _MISSING)
                if data is _MISSING:
                    self._unwanted(fd)
                    continue
                events = states.get(fd, _COMMON) & _WANTED
                if mask & ~events:
                    self._unwanted(fd)
                    mask &= events
                    if not mask:
                        continue
                ready.append((fd, data, mask))
        for fd in self._always_ready:
            ready.append((fd, datas[fd], states.get(fd, _COMMON) & _WANTED))
        stats.events += len(ready)
        return ready

    def _unwanted(self, fd: int) -> None:
        """The kernel reported a direction nobody wants on *fd*.

        Either a lazily kept reading interest (apply the removal now), an
        error or hang-up (reported for both directions; nothing to do when
        the kernel holds what is wanted), or a stray (edge 4).
        """
        state = self._get(fd)
        if state & _OWNED and state & _APPLIED:
            self._dirty.discard(fd)
            if state & _WANTED:
                self._flush_one(fd)  # a MOD, if the kernel holds more
                return
            self._set_applied(fd, 0)
            self.stats.epoll_ctl_del += 1
            try:
                self._backend.remove(fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.EBADF):
                    if self.on_error is None:
                        raise
                    self.on_error(fd, exc)
                elif isinstance(self._backend, EpollBackend):
                    # The owner broke its promise and closed the fd while a
                    # duplicate keeps the registration alive: epoll reports
                    # it under a number we cannot remove (edges 1 and 4).
                    self._rebuild()
            return
        if not state & _WANTED:
            self._stray(fd)
        # Otherwise an error or hang-up woke both directions of a registered
        # fd whose kernel mask is what is wanted: nothing to change.

    def _stray(self, fd: int) -> None:
        """The kernel reported an fd we no longer watch (edge 4)."""
        if not isinstance(self._backend, EpollBackend):
            return
        self._set_applied(fd, 0)
        try:
            self.stats.epoll_ctl_del += 1
            self._backend.remove(fd)
        except OSError:
            self._rebuild()

    def _rebuild(self) -> None:
        """Replace the epoll set with one built from the wanted masks."""
        self._backend.close()
        self._backend = EpollBackend()
        self._epoll = self._backend._epoll
        for fd in {*self._state, *self._data}:
            self._set_applied(fd, 0)
        self._dirty = set(self._data) - self._always_ready
        self.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._data.clear()
        self._state.clear()
        self._fileobjs.clear()
        self._dirty.clear()
        self._exclusive.clear()
        self._always_ready.clear()
        self._backend.close()
