"""Following a catalog state directory's log (:mod:`genrec.live_catalog.log`) as it grows:
how several server processes agree on one catalog.

Every process that serves a state directory replays it on start
(:func:`genrec.live_catalog.stored.read_dir`) and then follows its log (:class:`LogTail`): a
:class:`LogPoller` thread looks at the log file every :data:`POLL_S` seconds (one ``stat``: its
inode, size and modification time; nothing else when none changed) and, when it changed, the
served catalog reads the new records and applies them in order, on the path of a local update
(:meth:`genrec.live_catalog.served.ServiceCatalog.catch_up`). A write from any process takes
the directory's lock for the write only, catches up to the log's end, then appends: the log is
the one order of the updates, its versions everyone's.

A follower never sees half a record (a write under way reads as a torn tail: it stops there
and reads on later). When the log is replaced (a fold: a new file, told by its inode and its
header, since a later fold's file may reuse a replaced file's inode) it reads the new file from
its start and goes on from its own version; behind the new log's start, it installs the base
first (:class:`TailRead.base`). When its position no longer fits the file (a record cut off
again, its update refused), it reads the whole file again and goes on by version.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Protocol

from genrec.live_catalog.base import CatalogBase, base_files, read_base
from genrec.live_catalog.log_format import (
    CatalogLogError,
    LogRecord,
    read_header,
    scan_bytes,
    scan_records,
)
from genrec.live_catalog.stored import LOG_FILE, TailState

logger = logging.getLogger("genrec.serving")

POLL_S = 0.03  # how often a follower looks at the log


@dataclass(frozen=True)
class TailRead:
    """What a :meth:`LogTail.read` found: ``base``, to install first (the reader's version was
    before the log's start), the new records as ``(offset, record)``, the position after
    them."""

    base: CatalogBase | None
    records: tuple[tuple[int, LogRecord], ...]
    state: TailState


class LogTail:
    """Follows the log of ``directory`` from ``state``: :meth:`changed` is cheap, :meth:`read`
    returns what was appended since. Not thread-safe: one reader (the catalog, under its
    lock) at a time."""

    def __init__(self, directory: str | Path, state: TailState) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOG_FILE
        self.state = state

    def changed(self) -> bool:
        """Whether the log file is not the one read up to its end (one ``stat``)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        s = self.state
        return (st.st_ino, st.st_size, st.st_mtime_ns) != (s.inode, s.offset, s.mtime_ns)

    @staticmethod
    def _same_header(f: BinaryIO, s: TailState) -> bool:
        # whether the open log ``f`` (of the inode ``s`` read) has the header ``s`` read: a
        # file of a later fold may reuse a replaced file's inode, never its header (each
        # fold's ``after`` is above the last)
        f.seek(0)
        header = read_header(f.read(s.header_end))
        return header is not None and (header["after"], bool(header.get("base"))) == (
            s.after, s.base)

    def rewind(self) -> None:
        """Read the whole file next time (the position may no longer fit it)."""
        self.state = replace(self.state, inode=0)

    def read(self, version: int) -> TailRead:
        """The records after ``version`` (the reader's catalog version) appended since the
        last read, and the base to install first when the log now starts after ``version``.
        The position is not moved: set :attr:`state` to the answer's once it is applied.
        Raises :class:`CatalogLogError` for a log that cannot be read as written."""
        s = self.state
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return TailRead(None, (), s)
        with f:
            st = os.fstat(f.fileno())
            same = st.st_ino == s.inode and self._same_header(f, s)
            if same and st.st_size == s.offset:
                return TailRead(None, (), replace(s, mtime_ns=st.st_mtime_ns))
            if same and st.st_size > s.offset:
                f.seek(s.offset)
                try:  # the usual case: records appended after the position
                    found, end = scan_records(f.read(), 0, s.version + 1, self.path, s.offset)
                    state = replace(s, offset=end, version=found[-1][1].version if found
                                    else s.version, count=s.count + len(found),
                                    mtime_ns=st.st_mtime_ns)
                    return TailRead(None, tuple(r for r in found if r[1].version > version),
                                    state)
                except CatalogLogError:
                    f.seek(0)  # the position does not fit (a record cut off): read it all
            else:
                f.seek(0)
            scan = scan_bytes(f.read(), self.path, st.st_ino)
        state = replace(TailState.of(scan), mtime_ns=st.st_mtime_ns)
        base = None
        if version < state.after:
            where = base_files(self.directory).get(state.after)
            if where is None:
                raise CatalogLogError(f"{self.path}: follows base-{state.after}.pt, which is "
                                      f"not there")
            base = read_base(where)
        done = max(version, state.after)
        return TailRead(base, tuple(r for r in scan.records if r[1].version > done), state)


class Followed(Protocol):
    """A catalog that a :class:`LogFollower` brings forward (called under its lock)."""

    @property
    def catalog_version(self) -> int: ...

    def install_base(self, base: CatalogBase) -> None:
        """Replace the catalog by ``base``."""
        ...

    def install_logged(self, record: LogRecord) -> None:
        """Apply ``record``; ``ValueError`` when refused (as by the process that logged it)."""
        ...


class LogFollower:
    """Applies what a :class:`LogTail` finds, in order, to a :class:`Followed` catalog, and
    remembers the last ``recent`` records it applied (:meth:`logged`)."""

    def __init__(self, tail: LogTail, recent: int = 64) -> None:
        self.tail = tail
        self._recent: deque[LogRecord] = deque(maxlen=recent)

    def catch_up(self, catalog: Followed, cut: Callable[[TailState], None] | None = None
                 ) -> None:
        """Bring ``catalog`` to the log's end. A record it refuses stops there (read again
        later: its writer cuts it off). ``cut``: the directory's lock is held, so a refused
        last record is a dead writer's: ``cut(position before it)`` cuts it off; a refused
        record that later ones follow raises ``RuntimeError`` (the catalogs disagree)."""
        read = self.tail.read(catalog.catalog_version)
        if read.base is not None:  # the log was folded past this version
            catalog.install_base(read.base)
        state = read.state
        for k, (offset, record) in enumerate(read.records):
            try:
                catalog.install_logged(record)
            except ValueError as err:
                if cut is None:
                    logger.warning("%s: version %d refused here (%s); read again later",
                                   self.tail.path, record.version, err)
                    self.tail.rewind()
                    return
                if k < len(read.records) - 1:
                    raise RuntimeError(f"{self.tail.path}: version {record.version}, applied "
                                       f"by later writers, is refused here: {err}") from err
                state = replace(state, offset=offset, version=record.version - 1,
                                count=state.count - 1)
                cut(state)
                break
            self._recent.append(record)
        self.tail.state = state

    def logged(self, op: str, data: list) -> int | None:
        """The version of the last applied record of this update (``None``: none recent)."""
        for record in reversed(self._recent):
            if record.op == op and record.data == data:
                return record.version
        return None


class LogPoller:
    """A daemon thread that calls ``on_change()`` whenever ``changed()`` is true, looking
    every ``interval_s`` seconds until :meth:`close`. An error of either is logged (at most
    once per ``quiet_s``) and tried again at the next look."""

    def __init__(self, changed: Callable[[], bool], on_change: Callable[[], None],
                 interval_s: float = POLL_S, quiet_s: float = 10.0) -> None:
        self.changed, self.on_change = changed, on_change
        self.interval_s, self.quiet_s = interval_s, quiet_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="genrec-catalog-follow",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        reported = -self.quiet_s
        while not self._stop.wait(self.interval_s):
            try:
                if self.changed():
                    self.on_change()
            except Exception:  # noqa: BLE001 - logged; the next look tries again
                if time.monotonic() - reported >= self.quiet_s:
                    reported = time.monotonic()
                    logger.exception("following the catalog log failed (tried again)")

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop looking; wait up to ``timeout_s`` for a call under way."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
