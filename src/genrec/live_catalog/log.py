"""The served catalog on disk: an append-only log of update records
(:mod:`genrec.live_catalog.log_format`) beside a base snapshot
(:mod:`genrec.live_catalog.base`), in one state directory (see
:meth:`genrec.live_catalog.served.ServiceCatalog.from_dir`).

:meth:`CatalogLog.append` writes one record, flushes and fsyncs before returning: that is the
acknowledgement point. On open, a torn tail (a crash mid-write) is cut off (the file truncated
to the last good record, with a warning); corruption or a version that goes back is a
:class:`CatalogLogError`. A failed write leaves the log unusable until the process restarts
(what reached the disk is unknown).

:meth:`CatalogLog.fold` writes ``base-V.pt`` durably, then replaces the log by one holding
only the records after V (temp file, fsync, rename, fsync of the directory), then removes the
older bases. A crash between the steps opens to the same catalog: the newest readable base,
then the log's records after it.

One process writes a directory at a time: it holds the directory's lock file
(:mod:`genrec.live_catalog.dir_lock`) while the log is open, or, ``shared`` (several processes
serving one directory, see :mod:`genrec.live_catalog.follow`), only for each write
(:meth:`CatalogLog.hold`): the writer catches up to the log's end (:meth:`CatalogLog.adopt`,
which also cuts off a torn tail a dead writer left), appends, and lets go; a fold then holds
it from the base's write to the log's swap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genrec.live_catalog.base import (
    GenerativeBase,
    base_files,
    fold_base,
    remove_bases_before,
    sync_dir,
)
from genrec.live_catalog.dir_lock import LOCK_WAIT_S, can_lock, lock_dir, try_lock, unlock
from genrec.live_catalog.log_format import (
    FORMAT,
    OPS,
    CatalogLogError,
    LogRecord,
    LogScan,
    frame,
    scan_log,
)
from genrec.live_catalog.stored import LOG_FILE, StoredCatalog, TailState, read_dir
from genrec.utils.atomic import atomic_write

logger = logging.getLogger("genrec.serving")


@dataclass(frozen=True)
class FoldPolicy:
    """Log size past which a fold is due: ``records`` since the base or ``bytes`` of records
    (0: no bound of that kind; both 0: never fold)."""

    records: int = 100_000
    bytes: int = 64 << 20


@dataclass(frozen=True)
class LogMark:
    """A point in the log: the ``version`` reached there, the byte ``offset`` after it, the
    log file's ``inode`` and the version ``after`` its header names (a later fold's file may
    reuse the inode, never that version)."""

    version: int
    offset: int
    inode: int = 0
    after: int = 0


def _write_log(path: Path, after: int, base: bool, tail: bytes = b"") -> int:
    # a new log (header + ``tail``) put in place durably; its header's size
    header = frame({"format": FORMAT, "after": after, "base": base})
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(header + tail))
    sync_dir(path.parent)
    return len(header)


class CatalogLog:
    """The log of a state directory, open for appending (:meth:`open`); ``policy`` says when
    :meth:`due` says a fold is due. Thread-safe: appends, discards and the swap of a fold are
    serialised."""

    def __init__(self, directory: Path, lock_file: Any, stored: StoredCatalog, scan: LogScan,
                 policy: FoldPolicy, shared: bool = False) -> None:
        self.directory, self.path, self.policy = directory, directory / LOG_FILE, policy
        self._mutex = threading.Lock()
        self._lock_file, self.shared = lock_file, shared
        self._holder = threading.RLock()  # the flock is per open file: one thread at a time
        self._file = open(self.path, "ab", buffering=0)
        self._inode = os.fstat(self._file.fileno()).st_ino
        self._header_end, self._size = scan.header_end, scan.end
        self._last = scan.records[-1][0] if scan.records else None  # last record's offset
        self._base_version = stored.base.version if stored.base is not None else None
        self._version, self._count = stored.version, len(stored.records)
        self.broken: BaseException | None = None
        self._closed = False

    @classmethod
    def open(cls, directory: str | Path, start_version: int = 0,
             policy: FoldPolicy | None = None, shared: bool = False
             ) -> tuple[CatalogLog, StoredCatalog]:
        """Open (or create, starting at ``start_version``) the state directory; returns the
        log and what it holds. A torn tail is cut off here. Raises :class:`CatalogLogError`
        when another process has the directory open (``shared``: when another process's
        write does not let go of it within :data:`LOCK_WAIT_S`)."""
        directory = Path(directory)
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            sync_dir(directory.parent)
        lock_file = lock_dir(directory, LOCK_WAIT_S if shared else 0.0)
        try:
            for stale in directory.glob(".*.tmp"):  # an atomic write a crash interrupted
                stale.unlink()
            path = directory / LOG_FILE
            if not path.exists():
                if base_files(directory):
                    raise CatalogLogError(f"{directory}: base files but no {LOG_FILE}")
                _write_log(path, int(start_version), False)
            stored, scan = read_dir(directory)
            log = cls(directory, lock_file, stored, scan, policy or FoldPolicy(), shared)
            if scan.end < scan.size:
                _torn(path, scan.end, scan.size)
                with log._mutex:
                    log._cut(scan.end)
        except BaseException:
            lock_file.close()
            raise
        finally:
            if shared and not lock_file.closed:
                unlock(lock_file)
        return log, stored

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the directory's lock (``shared``: taken here, waiting up to
        :data:`LOCK_WAIT_S` for another process's write; else held since :meth:`open`)."""
        with self._holder:
            if not self.shared or not can_lock():
                yield
                return
            if not try_lock(self._lock_file, LOCK_WAIT_S):
                raise RuntimeError(f"{self.directory}: another process held the catalog lock "
                                   f"for {LOCK_WAIT_S:.0f} s")
            try:
                yield
            finally:
                unlock(self._lock_file)

    def tail_state(self) -> TailState:
        """Where this log's file ends (its last good record): a reader's position there."""
        with self._mutex:
            mtime = os.fstat(self._file.fileno()).st_mtime_ns
            return TailState(self._inode, self._size, self._header_end, self._after(),
                             self._base_version is not None, self._version, self._count, mtime)

    def _after(self) -> int:
        # the version the log file's header names (under the mutex)
        base = self._base_version
        return base if base is not None else self._version - self._count

    def adopt(self, state: TailState) -> None:
        """Take the log file as a reader found it, under :meth:`hold` after reading it to its
        end (``shared``: other processes appended or folded): appends go on after
        ``state``; what lies beyond it (a torn tail a dead writer left) is cut off."""
        with self._mutex:
            self._usable()
            if state.inode != self._inode:
                self._file.close()
                self._file = open(self.path, "ab", buffering=0)
                self._inode = os.fstat(self._file.fileno()).st_ino
                if self._inode != state.inode:
                    raise RuntimeError(f"{self.path}: replaced while the lock was held")
            self._header_end, self._last = state.header_end, None
            self._base_version = state.after if state.base else None
            self._version, self._count = state.version, state.count
            size = os.fstat(self._file.fileno()).st_size
            self._size = size
            if size > state.offset:
                _torn(self.path, state.offset, size)
                self._cut(state.offset)

    @property
    def version(self) -> int:
        """The version of the last record (or of the base the log follows)."""
        return self._version

    def _usable(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.path}: the log is closed")
        if self.broken is not None:
            raise RuntimeError(f"{self.path}: a write failed ({self.broken}); restart to "
                               f"recover the catalog from disk") from self.broken

    def append(self, record: LogRecord) -> None:
        """Write ``record`` (the next version) durably: returns once it is fsynced."""
        if record.op not in OPS:
            raise ValueError(f"unknown catalog operation {record.op!r}")
        body = frame(record.payload())
        with self._mutex:
            self._usable()
            if record.version != self._version + 1:
                raise RuntimeError(f"{self.path}: version {record.version} after "
                                   f"{self._version}: versions go one by one")
            try:
                view = memoryview(body)
                while view:  # unbuffered: nothing of a failed write is left to flush later
                    view = view[self._file.write(view):]
                os.fsync(self._file.fileno())
            except BaseException as err:
                self.broken = err  # what reached the disk is unknown: no more appends
                with contextlib.suppress(Exception):  # but none of this record, if possible
                    self._file.truncate(self._size)
                    os.fsync(self._file.fileno())
                raise
            self._last, self._size = self._size, self._size + len(body)
            self._version, self._count = record.version, self._count + 1

    def discard_last(self) -> None:
        """Cut off the record just appended (its update was refused before it was
        installed), durably."""
        with self._mutex:
            self._usable()
            if self._last is None:
                raise RuntimeError(f"{self.path}: no appended record to discard")
            self._cut(self._last)
            self._last, self._version, self._count = None, self._version - 1, self._count - 1

    def _cut(self, offset: int) -> None:
        try:
            self._file.truncate(offset)
            os.fsync(self._file.fileno())
        except BaseException as err:
            self.broken = err
            raise
        self._size = offset

    def due(self) -> bool:
        """Whether the log has grown past a fold bound."""
        records, size = self.policy.records, self.policy.bytes
        return bool((records and self._count >= records)
                    or (size and self._size - self._header_end >= size))

    def mark(self) -> LogMark:
        """Where the log is now (take it with the catalog as of that version)."""
        with self._mutex:
            return LogMark(self._version, self._size, self._inode, self._after())

    def fold(self, mark: LogMark, generative: GenerativeBase | None,
             ids: tuple[str, ...]) -> bool:
        """Write the base of ``mark`` (``generative``: the generative catalog as of that
        version, ``ids``: the item ids added since the model's as of it), then keep only the
        later records in the log. False: nothing to fold (or, ``shared``, another process
        folded the log since ``mark``)."""
        with self.hold():
            if self.shared:  # others may have appended or folded since the mark
                scan = scan_log(self.path)
                if (scan.inode, scan.header["after"]) != (mark.inode, mark.after):
                    return False
                self.adopt(TailState.of(scan))
            return self._fold(mark, generative, ids)

    def _fold(self, mark: LogMark, generative: GenerativeBase | None,
              ids: tuple[str, ...]) -> bool:
        if self._base_version is not None and mark.version <= self._base_version:
            return False
        fold_base(self.directory, self.path, self._base_version, mark.version, mark.offset,
                  generative, ids)
        with self._mutex:  # no append runs during the swap: none is lost
            self._usable()
            try:  # a failure may leave the handle on the replaced file: then stop appending
                with open(self.path, "rb") as f:
                    f.seek(mark.offset)
                    tail = f.read(self._size - mark.offset)
                header_end = _write_log(self.path, mark.version, True, tail)
                self._file.close()
                self._file = open(self.path, "ab", buffering=0)
                self._inode = os.fstat(self._file.fileno()).st_ino
            except BaseException as err:
                self.broken = err
                raise
            shift = header_end - mark.offset
            self._header_end, self._size = header_end, self._size + shift
            if self._last is not None:
                self._last = self._last + shift if self._last >= mark.offset else None
            self._base_version, self._count = mark.version, self._version - mark.version
        remove_bases_before(self.directory, mark.version)
        return True

    def close(self) -> None:
        """Close the files (the directory's lock is released)."""
        with self._mutex:
            self._closed = True
            self._file.close()
            self._lock_file.close()


def _torn(path: Path, end: int, size: int) -> None:
    logger.warning("%s: cut off a torn record at offset %d (%d bytes): a write a crash "
                   "interrupted, never acknowledged", path, end, size - end)
