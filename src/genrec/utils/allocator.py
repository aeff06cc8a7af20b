"""Keep freed activation memory in the process for reuse (glibc malloc on Linux).

A CPU forward allocates and frees tens of megabytes per layer. glibc serves such blocks with
``mmap`` and returns them to the kernel on ``free``, so every forward faults fresh zeroed pages
in again (about 90,000 minor page faults and 10% of a scoring call here). Raising malloc's
mmap and trim thresholds keeps those blocks on the heap, where the next forward reuses them:
what vLLM's CPU backend gets by preloading tcmalloc. Process-wide; idempotent; a no-op where
the C library is not glibc. ``GENREC_MALLOC_TUNING=0`` leaves malloc alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# glibc's largest accepted mmap threshold on 64-bit systems (HEAP_MAX_SIZE / 2)
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 512 << 20

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap threshold to 32 MiB and its trim threshold to 512 MiB; True when
    applied (now or earlier)."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("GENREC_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
