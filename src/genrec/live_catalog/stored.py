"""What a catalog state directory holds (:mod:`genrec.live_catalog.log`), read once: its
base and log records (:func:`read_state`), and where a reader of its log stands
(:class:`TailState`), from which :mod:`genrec.live_catalog.follow` follows the log as it grows.

A torn tail (a write under way, or a writer that died) is ignored; corruption or versions that
go back raise :class:`CatalogLogError`. A fold that died between writing a newer base and
swapping the log leaves a base newer than the log's start: the records it covers are skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from genrec.live_catalog.base import CatalogBase, base_files, read_base
from genrec.live_catalog.log_format import CatalogLogError, LogRecord, LogScan, scan_log

logger = logging.getLogger("genrec.serving")

LOG_FILE = "catalog.log"


@dataclass(frozen=True)
class StoredCatalog:
    """What a state directory holds: the ``base`` (``None``: the catalogs as the server loads
    them), the version ``after`` that the ``records`` follow."""

    after: int
    base: CatalogBase | None
    records: tuple[LogRecord, ...]

    @property
    def version(self) -> int:
        """The catalog version these make."""
        return self.records[-1].version if self.records else self.after


@dataclass(frozen=True)
class TailState:
    """Where a reader of a log file stands: the file (``inode``; 0: none read yet), the byte
    ``offset`` after the last good record read, the header (``header_end``; the version
    ``after`` it follows, and whether a ``base`` file holds that version), the ``version``
    and ``count`` of the records read, and the file's modification time when it was read
    (``mtime_ns``; 0: not known), which tells a later fold's file that reuses the inode at
    the same size."""

    inode: int = 0
    offset: int = 0
    header_end: int = 0
    after: int = 0
    base: bool = False
    version: int = 0
    count: int = 0
    mtime_ns: int = 0

    @classmethod
    def of(cls, scan: LogScan) -> TailState:
        """The position at the end of the good records of ``scan``."""
        after = scan.header["after"]
        last = scan.records[-1][1].version if scan.records else after
        return cls(scan.inode, scan.end, scan.header_end, after, bool(scan.header.get("base")),
                   last, len(scan.records))


def newest_base(directory: Path, after: int, required: bool) -> CatalogBase | None:
    """The newest readable base of ``directory`` not older than version ``after``;
    ``required``: raise :class:`CatalogLogError` when there is none."""
    for version, path in sorted(base_files(directory).items(), reverse=True):
        if version < after:
            break
        try:
            return read_base(path)
        except CatalogLogError as err:
            logger.warning("%s; trying an older base", err)
    if required:
        raise CatalogLogError(f"{directory / LOG_FILE}: follows base-{after}.pt, and no "
                              f"readable base of version >= {after} is there")
    return None


def read_state(directory: str | Path, start_version: int | None = None) -> StoredCatalog:
    """The base and the records of a state directory (read-only: a torn tail is ignored).
    With ``start_version``, a directory without a log yet (nothing logged) holds no records
    after that version. Raises :class:`CatalogLogError` for corruption or a version that
    goes back."""
    return read_followed(directory, start_version)[0]


def read_followed(directory: str | Path, start_version: int | None = None
                  ) -> tuple[StoredCatalog, TailState]:
    """:func:`read_state`, and the position at the end of what it read (to follow from)."""
    directory = Path(directory)
    if (start_version is not None and not (directory / LOG_FILE).exists()
            and not (directory.is_dir() and base_files(directory))):
        return StoredCatalog(int(start_version), None, ()), TailState(version=int(start_version))
    stored, scan = read_dir(directory)
    return stored, TailState.of(scan)


def read_dir(directory: Path) -> tuple[StoredCatalog, LogScan]:
    """What ``directory`` holds, and the scan of its log file."""
    path = directory / LOG_FILE
    if not path.is_file():
        raise CatalogLogError(f"{path}: no catalog log")
    scan = scan_log(path)
    after = scan.header["after"]
    base = newest_base(directory, after, bool(scan.header.get("base")))
    records = tuple(r for _, r in scan.records)
    if base is not None and base.version > after:  # a crash during a fold: the base is newer
        last = records[-1].version if records else after
        if last < base.version:
            raise CatalogLogError(f"{path}: ends at version {last}, before base-{base.version}"
                                  f".pt: versions go back")
        after, records = base.version, tuple(r for r in records if r.version > base.version)
    return StoredCatalog(after, base, records), scan
