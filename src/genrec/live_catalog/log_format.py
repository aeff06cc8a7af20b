"""The record format of the catalog log (:mod:`genrec.live_catalog.log`).

A log file is a sequence of framed records: ``magic (4 bytes) | payload length (uint32 LE) |
CRC32 of the payload (uint32 LE) | payload``, the payload ASCII JSON (so the magic, made of
bytes >= 0x80, never occurs inside one: a scan finds where records start). The first record
is the header ``{"format": 1, "after": V, "base": bool}``: the records follow version V (the
version of ``base-V.pt`` when ``base``, else of the catalogs the server loads itself). Each
other record is one update, ``{"version": v, "op": "upsert" | "retire", "data": [...],
"ids": [...]}`` in rows (upsert: the item dicts as the service took them, ``semantic_id`` and
ranker fields included, ``item_id`` the item's row; retire: rows), ``ids`` the table ids the
update added (rows N, N+1, ... of the id map; omitted when none), versions V+1, V+2, ... one
by one.

Reading (:func:`scan_log`): a record at the tail that is cut short or fails its checksum is a
write a crash interrupted (a torn tail: reported, not raised); a bad record followed by a good
one is corruption, and a version out of sequence an error (:class:`CatalogLogError`, naming
the file and offset): versions never go back.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"\xd7\x43\xcc\x8f"
FRAME = struct.Struct("<4sII")  # magic, payload length, CRC32 of the payload
FORMAT = 1
OPS = ("upsert", "retire")


class CatalogLogError(RuntimeError):
    """A state directory that cannot be read back as it was written (names file and offset)."""


@dataclass(frozen=True)
class LogRecord:
    """One update: the ``version`` it produces, ``op`` (``"upsert"``: ``data`` item dicts,
    ``"retire"``: item rows), the table ids it adds to the id map (``ids``)."""

    version: int
    op: str
    data: list
    ids: tuple[str, ...] = ()

    def payload(self) -> dict[str, Any]:
        """The record as it is framed."""
        out = {"version": self.version, "op": self.op, "data": self.data}
        return out | ({"ids": list(self.ids)} if self.ids else {})


@dataclass(frozen=True)
class LogScan:
    """A log file read: its ``header``, ``(offset, record)`` of each good record, where the
    header and the good records end, and the bytes read (more than ``end``: a torn tail)."""

    header: dict[str, Any]
    records: tuple[tuple[int, LogRecord], ...]
    header_end: int
    end: int
    size: int
    inode: int = 0  # of the file read (a fold replaces the file: a new inode)


def frame(payload: dict[str, Any]) -> bytes:
    """One framed record of ``payload``."""
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("ascii")
    return FRAME.pack(MAGIC, len(body), zlib.crc32(body)) + body


def _frame_at(buf: bytes, at: int) -> tuple[dict[str, Any], int] | None:
    # the payload of a good record at ``at`` and where it ends; None: no good record there
    if len(buf) - at < FRAME.size:
        return None
    magic, length, crc = FRAME.unpack_from(buf, at)
    end = at + FRAME.size + length
    if magic != MAGIC or length == 0 or end > len(buf):
        return None
    body = buf[at + FRAME.size : end]
    if zlib.crc32(body) != crc:
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    return (payload, end) if isinstance(payload, dict) else None


def _header(buf: bytes) -> tuple[dict[str, Any], int] | None:
    # the header at the start of ``buf`` and where it ends; None: no good header there
    first = _frame_at(buf, 0)
    if first is None or first[0].get("format") != FORMAT or not isinstance(
            first[0].get("after"), int):
        return None
    return first


def read_header(buf: bytes) -> dict[str, Any] | None:
    """The header a log file's first bytes ``buf`` hold (``None``: no good header there)."""
    first = _header(buf)
    return first[0] if first is not None else None


def scan_log(path: Path, stop: int | None = None) -> LogScan:
    """Read the log ``path`` (its first ``stop`` bytes). Raises :class:`CatalogLogError` for
    a bad header, corruption, or versions out of sequence."""
    with open(path, "rb") as f:
        inode = os.fstat(f.fileno()).st_ino
        buf = f.read() if stop is None else f.read(stop)
    return scan_bytes(buf, path, inode)


def scan_bytes(buf: bytes, path: Path, inode: int = 0) -> LogScan:
    """:func:`scan_log` of a whole log file's bytes ``buf`` read from ``path``."""
    first = _header(buf)
    if first is None:
        raise CatalogLogError(f"{path}: offset 0: not a catalog log header (format {FORMAT})")
    header, at = first
    records, end = scan_records(buf, at, header["after"] + 1, path)
    return LogScan(header, records, at, end, len(buf), inode)


def scan_records(buf: bytes, at: int, expected: int, path: Path, base: int = 0
                 ) -> tuple[tuple[tuple[int, LogRecord], ...], int]:
    """The good update records of ``buf`` from ``at`` on (the first of version ``expected``)
    as ``(offset, record)``, offsets counted from ``base`` (where ``buf`` starts in the file),
    and where they end. A torn tail ends them; raises :class:`CatalogLogError` for a damaged
    record followed by good ones or a version out of sequence."""
    records = []
    while at < len(buf):
        got = _frame_at(buf, at)
        if got is None:
            later = buf.find(MAGIC, at + 1)
            while later >= 0:
                if _frame_at(buf, later) is not None:
                    raise CatalogLogError(f"{path}: offset {base + at}: a damaged record "
                                          f"followed by good ones (offset {base + later}): the "
                                          f"log is corrupt")
                later = buf.find(MAGIC, later + 1)
            break  # a torn tail: the write a crash interrupted (or one under way)
        payload, end = got
        version, op, data = payload.get("version"), payload.get("op"), payload.get("data")
        ids = payload.get("ids", [])
        if (not isinstance(version, int) or op not in OPS or not isinstance(data, list)
                or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
            raise CatalogLogError(f"{path}: offset {base + at}: not a catalog update record")
        if version != expected:
            how = "goes back" if version < expected else "skips versions"
            raise CatalogLogError(f"{path}: offset {base + at}: version {version} {how} "
                                  f"(version {expected} comes next)")
        records.append((base + at, LogRecord(version, op, data, tuple(ids))))
        expected, at = version + 1, end
    return tuple(records), base + at
