"""One lock per device for device work that could overlap a CUDA graph capture.

With torch's default (global) capture-error mode, device work issued by another thread while
a stream captures invalidates the capture. genrec's discipline: a graph is captured under the
lock of its device (:func:`device_lock`), and every device operation that may run beside the
engine's batches takes it too: the thread preparing the next batch, a catalog update built
off the engine's thread, the install of a background compaction (built on the host). Work on
the engine's own batch thread (batches, catalog installs and catch-ups between them) cannot
overlap a capture, which runs there. Every engine on a device shares its lock (an ensemble's
members capture on one device).

The lock is re-entrant (a thread preparing an ensemble's batch takes it once per member) and
checked: :meth:`DeviceLock.waiting` and :meth:`DeviceLock.held` say who waits and who holds
it, so tests can see that a device operation waits for a capture instead of running beside it.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_locks: dict[str, DeviceLock] = {}
_locks_guard = threading.Lock()


class DeviceLock:
    """A re-entrant lock that counts the threads waiting for it (a context manager)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count = threading.Lock()
        self._waiting = 0
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> DeviceLock:
        with self._count:
            self._waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._count:
                self._waiting -= 1
        self._owner, self._depth = threading.get_ident(), self._depth + 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = None
        self._lock.release()

    def waiting(self) -> int:
        """Threads waiting for the lock now."""
        with self._count:
            return self._waiting

    def held(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == threading.get_ident()


def device_lock(device: torch.device | str) -> DeviceLock:
    """The lock of ``device`` (one per device in the process)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = str(dev)
    with _locks_guard:
        found = _locks.get(key)
        if found is None:
            found = _locks[key] = DeviceLock()
        return found
