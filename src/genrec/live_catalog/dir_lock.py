"""A state directory's lock file (``flock``): one process writes a directory at a time
(:mod:`genrec.live_catalog.log`). The lock goes with the open file: released when it is
closed, or when the process dies. Not on Windows (no ``fcntl``): no guard there."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from genrec.live_catalog.log_format import CatalogLogError

try:
    import fcntl
except ImportError:  # not on Windows: no guard against a second writer there
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "lock"
LOCK_WAIT_S = 30.0  # longest wait for another process's write (or fold) to let go


def try_lock(lock_file: Any, wait_s: float) -> bool:
    """Lock ``lock_file`` exclusively, waiting up to ``wait_s``; False: still held elsewhere
    (True where there is no ``flock``)."""
    if fcntl is None:
        return True
    end = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.002)


def unlock(lock_file: Any) -> None:
    """Let go of ``lock_file``'s lock (the file stays open)."""
    if fcntl is not None:
        fcntl.flock(lock_file, fcntl.LOCK_UN)


def lock_dir(directory: Path, wait_s: float = 0.0) -> Any:
    """``directory``'s lock file, open and locked (waiting up to ``wait_s``); raises
    :class:`CatalogLogError` when another process holds it."""
    lock_file = open(directory / LOCK_FILE, "a")
    if not try_lock(lock_file, wait_s):
        lock_file.close()
        raise CatalogLogError(f"{directory}: in use by another process") from None
    return lock_file


def can_lock() -> bool:
    """Whether this platform has ``flock`` (a guard against a second writer)."""
    return fcntl is not None
