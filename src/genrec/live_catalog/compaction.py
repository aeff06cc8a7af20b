"""Background compaction of the served generative catalog, and background folds of its
durable log (:class:`LogFolder`, see :mod:`genrec.live_catalog.log`).

A live update costs O(changes + delta) (:meth:`CatalogState.updated`): the delta's trie and
dead-rank lists are rebuilt each time, so the delta must stay small. Once it holds
:func:`compaction_threshold` items, :class:`Compactor` folds it into a new base in a
background thread (:meth:`CatalogState.compacted`, O(N log N): seconds at 10M items) on a
snapshot of the installed state, while updates and searches go on. When it finishes, under
the service catalog's lock, it installs ``current.rebased(compacted)`` (the updates made
meanwhile carried over) if the current state still grew from that snapshot (same base, same
or later version, its delta a superset), else drops it. A compaction changes nothing a
request can see, so the state keeps its version number.

At most one compaction runs at a time; a failure is logged and counted, never raised into a
request (the next update past the threshold tries again). The thread is a daemon with a low
CPU priority (where the OS allows it per thread): requests go first; shutdown joins it only
briefly.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from genrec.live_catalog.base import GenerativeBase
from genrec.live_catalog.delta import member

if TYPE_CHECKING:
    from genrec.live_catalog.host import CatalogHost
    from genrec.live_catalog.log import CatalogLog, LogMark
    from genrec.live_catalog.state import CatalogState

log = logging.getLogger("genrec.serving")

# Delta size that starts a compaction: 1% of the catalog, at least 4096 items (a small catalog
# compacts in milliseconds but need not do so every few updates) and at most 65536 (an
# update's O(delta) rebuild then stays at a few tens of ms at any catalog size, while a
# compaction of a 10M-item catalog, seconds long, starts at most once per 65536 changes).
COMPACT_FRACTION = 100
COMPACT_MIN_ITEMS = 4096
COMPACT_MAX_ITEMS = 65536
# CPU niceness of the compaction thread (Linux: per thread), so batches keep their share
COMPACT_NICE = 10
_MAX_EVENTS = 1024  # finished compactions kept until reported (metrics drain them)

INSTALLED, DROPPED, FAILED = "installed", "dropped", "failed"


def compaction_threshold(num_items: int) -> int:
    """Delta items that start a background compaction of a catalog of ``num_items`` items."""
    return max(COMPACT_MIN_ITEMS, min(num_items // COMPACT_FRACTION, COMPACT_MAX_ITEMS))


@dataclass(frozen=True)
class CompactionEvent:
    """One finished compaction: its ``outcome`` (``installed``, ``dropped``: the catalog was
    replaced meanwhile, ``failed``), its wall time, and the delta size it folded."""

    outcome: str
    seconds: float
    delta_items: int


@dataclass(frozen=True)
class CatalogStats:
    """Where a generative catalog stands: its delta size, whether a compaction runs, and the
    compactions finished since the last report (plain data: it crosses threads and, from an
    engine process, the pipe)."""

    delta_items: int
    compacting: bool = False
    compactions: tuple[CompactionEvent, ...] = ()


def _lower_priority() -> None:
    try:  # on Linux, setpriority on a thread id changes that thread alone
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPACT_NICE)
    except (AttributeError, OSError):
        pass


def grew_from(current: CatalogState, snapshot: CatalogState) -> bool:
    """Whether ``current`` was reached from ``snapshot`` by updates alone (the condition for
    :meth:`CatalogState.rebased`): same base, no older version, a delta holding the
    snapshot's."""
    if current.base_vocab is not snapshot.base_vocab or current.version < snapshot.version:
        return False
    return bool(member(current.delta_items, snapshot.delta_items).all())


class BackgroundTask:
    """Runs one job at a time in a daemon thread named ``name``, at a low CPU priority."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._mutex = threading.Lock()  # the thread slot (and subclasses' events; never long)
        self._thread: threading.Thread | None = None
        self._closed = False

    def launch(self, job: Callable[..., None], *args: object) -> bool:
        """Start ``job(*args)`` unless one runs or this is closed; True when it started."""
        with self._mutex:
            if self._closed or self._thread is not None:
                return False
            thread = self._thread = threading.Thread(target=self._body, args=(job, args),
                                                     daemon=True, name=self.name)
        thread.start()
        return True

    def _body(self, job: Callable[..., None], args: tuple) -> None:
        _lower_priority()
        try:
            job(*args)
        finally:
            with self._mutex:
                self._thread = None

    @property
    def running(self) -> bool:
        """Whether a job is under way."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the running job (if any); True when none runs any more."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.running

    def close(self, timeout: float = 1.0) -> None:
        """Start no more jobs, and wait up to ``timeout`` s for a running one."""
        self._closed = True
        self.wait(timeout)


class Compactor(BackgroundTask):
    """Runs the background compactions of ``engine``'s generative catalog; ``lock`` is the
    lock every update installs its state under. ``threshold``: delta items that start one
    (``None``: :func:`compaction_threshold` of the catalog size; 0: never). A compaction
    that finishes after :meth:`close` is not installed."""

    def __init__(self, engine: CatalogHost, lock: threading.Lock,
                 threshold: int | None = None) -> None:
        if threshold is not None and threshold < 0:
            raise ValueError(f"compact_threshold: must be >= 0, got {threshold}")
        super().__init__("genrec-compaction")
        self.engine, self.lock, self.threshold = engine, lock, threshold
        self._events: deque[CompactionEvent] = deque(maxlen=_MAX_EVENTS)
        self.completed = 0  # compactions installed

    def due(self, state: CatalogState) -> bool:
        """Whether ``state``'s delta is large enough to compact."""
        if self.threshold == 0:
            return False
        limit = (compaction_threshold(state.num_items) if self.threshold is None
                 else self.threshold)
        return state.delta_items.numel() >= limit

    def maybe_start(self) -> bool:
        """Start a compaction of the installed state if it is due and none runs; call it with
        :attr:`lock` held, after installing a state. True when one started."""
        state = self.engine.catalog
        if self._closed or state is None or not self.due(state):
            return False
        return self.launch(self._run, state)

    def _run(self, snapshot: CatalogState) -> None:
        start = time.perf_counter()
        size = int(snapshot.delta_items.numel())
        outcome = FAILED
        try:
            # built on the host (seconds at 10M items: no device lock held), moved to the
            # device and installed under the device's lock, then the catalog's (the order
            # the preparing thread takes them in)
            compacted = snapshot.compacted("cpu")
            with self.engine.device_work(), self.lock:
                compacted = compacted.to(snapshot.trie.device)
                current = self.engine.catalog
                if not self._closed and current is not None and grew_from(current, snapshot):
                    self.engine.set_catalog(current.rebased(compacted))  # same version
                    outcome = INSTALLED
                    self.completed += 1
                else:
                    outcome = DROPPED
        except Exception:  # noqa: BLE001 - logged; requests and updates go on
            log.exception("catalog compaction failed (delta of %d items)", size)
        finally:
            event = CompactionEvent(outcome, time.perf_counter() - start, size)
            with self._mutex:
                self._events.append(event)
            if outcome != FAILED:
                log.info("catalog compaction %s: %d delta items in %.2f s", outcome, size,
                         event.seconds)

    def stats(self, drain: bool = True) -> CatalogStats:
        """The catalog's :class:`CatalogStats`; ``drain``: the reported events are forgotten."""
        state = self.engine.catalog
        with self._mutex:
            events = tuple(self._events)
            if drain:
                self._events.clear()
            running = self._thread is not None
        size = int(state.delta_items.numel()) if state is not None else 0
        return CatalogStats(size, running, events)


class LogFolder(BackgroundTask):
    """Folds a catalog ``log`` (:meth:`CatalogLog.fold`) in the background once it is due: a
    new base of the catalog as of one version, the log then holding only the later records.
    A failure is logged, never raised into an update (the next one tries again)."""

    def __init__(self, log: CatalogLog) -> None:
        super().__init__("genrec-catalog-fold")
        self.log = log
        self.completed = 0  # folds written

    def maybe_start(self, state: CatalogState | None, ids: tuple[str, ...]) -> bool:
        """Start a fold if the log is due and none runs; call it with the catalog's lock held,
        after an update, ``state`` being the generative catalog as of the log's last record and
        ``ids`` the item ids added since the model's as of that record. True when one
        started."""
        if self._closed or not self.log.due():
            return False
        return self.launch(self._run, self.log.mark(), state, ids)

    def _run(self, mark: LogMark, state: CatalogState | None, ids: tuple[str, ...]) -> None:
        start = time.perf_counter()
        try:
            generative = None
            if state is not None:
                codes, retired = state.export()
                generative = GenerativeBase(codes, tuple(state.codebook_sizes), retired)
            if self.log.fold(mark, generative, ids):
                self.completed += 1
                log.info("catalog log folded at version %d in %.2f s", mark.version,
                         time.perf_counter() - start)
        except Exception:  # noqa: BLE001 - logged; requests and updates go on
            log.exception("catalog log fold at version %d failed", mark.version)
