"""Reading a catalog state directory once: its base and records, the position a follower goes
on from, a torn tail left as it is, a base newer than the log's start (a fold that died before
the log's swap), unreadable bases passed over, and a directory with nothing logged yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from genrec.live_catalog.base import CatalogBase, write_base
from genrec.live_catalog.log import CatalogLog
from genrec.live_catalog.log_format import CatalogLogError, LogRecord, frame
from genrec.live_catalog.stored import LOG_FILE, StoredCatalog, TailState, read_followed, read_state


def retires(n: int, start: int = 1) -> list[LogRecord]:
    return [LogRecord(v, "retire", [v]) for v in range(start, start + n)]


def logged(path: Path, n: int, start: int = 0) -> Path:
    log, _ = CatalogLog.open(path, start)
    for record in retires(n, start + 1):
        log.append(record)
    log.close()
    return path


def test_the_records_and_the_position_after_them(tmp_path: Path) -> None:
    state = logged(tmp_path / "s", 4, start=2)
    stored, position = read_followed(state)
    assert stored == StoredCatalog(2, None, tuple(retires(4, 3)))
    assert stored.version == 6 and read_state(state) == stored
    size = (state / LOG_FILE).stat().st_size
    assert (position.offset, position.version, position.count, position.after) == (size, 6, 4, 2)
    assert position.inode == (state / LOG_FILE).stat().st_ino and not position.base


def test_a_torn_tail_is_ignored_and_left_as_it_is(tmp_path: Path) -> None:
    state = logged(tmp_path / "s", 3)
    data = (state / LOG_FILE).read_bytes()
    (state / LOG_FILE).write_bytes(data[:-5])  # the last record cut short
    stored, position = read_followed(state)
    assert stored.records == tuple(retires(2)) and position.version == 2
    assert (state / LOG_FILE).stat().st_size == len(data) - 5


def test_a_base_newer_than_the_log_start_skips_the_records_it_holds(tmp_path: Path) -> None:
    state = logged(tmp_path / "s", 5)
    write_base(state, CatalogBase(3, None))  # written by a fold that died before the swap
    stored = read_state(state)
    assert stored.after == stored.base.version == 3 and stored.records == tuple(retires(2, 4))
    write_base(state, CatalogBase(9, None))  # past the log's end: versions would go back
    with pytest.raises(CatalogLogError, match="ends at version 5, before base-9.pt"):
        read_state(state)


def test_an_unreadable_base_gives_way_to_an_older_one(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir()
    body = frame({"format": 1, "after": 3, "base": True}) + frame(
        {"version": 4, "op": "retire", "data": [4]})
    (state / LOG_FILE).write_bytes(body)
    write_base(state, CatalogBase(3, None))
    (state / "base-4.pt").write_bytes(b"torn")
    stored = read_state(state)
    assert stored.base.version == 3 and stored.records == (LogRecord(4, "retire", [4]),)
    (state / "base-3.pt").write_bytes(b"torn too")
    with pytest.raises(CatalogLogError, match="follows base-3.pt, and no readable base"):
        read_state(state)


def test_nothing_logged_yet(tmp_path: Path) -> None:
    empty = tmp_path / "new"
    with pytest.raises(CatalogLogError, match="no catalog log"):
        read_state(empty)
    stored, position = read_followed(empty, start_version=7)
    assert stored == StoredCatalog(7, None, ()) and stored.version == 7
    assert position == TailState(version=7)
    empty.mkdir()
    assert read_state(empty, start_version=7) == StoredCatalog(7, None, ())
