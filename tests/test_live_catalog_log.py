"""The durable catalog log (and its record format, catalog_log_format.py): the framing, fsync
before an append returns, a torn tail cut off at every byte of the last record, corruption and
versions that go back refused, folds (and a crash in the middle of one) that reopen to the
same records, one writer at a time."""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path

import pytest
import torch

from genrec.live_catalog import log as catalog_log
from genrec.live_catalog.base import (
    CatalogBase,
    GenerativeBase,
    base_files,
    fold_ranker,
    write_base,
)
from genrec.live_catalog.log import CatalogLog, FoldPolicy
from genrec.live_catalog.log_format import FRAME, MAGIC, CatalogLogError, LogRecord, frame
from genrec.live_catalog.stored import LOG_FILE, read_state


def updates(n: int, start: int = 1) -> list[LogRecord]:
    """Upserts (a generative item and a ranker item each) and retires, versions from start."""
    out = []
    for v in range(start, start + n):
        if v % 3:
            out.append(LogRecord(v, "upsert", [{"item_id": v, "semantic_id": [v % 5, 1]},
                                               {"item_id": 100 + v, "text": f"item {v}"}]))
        else:
            out.append(LogRecord(v, "retire", [v - 1, 100 + v - 1]))
    return out


def written(path: Path, n: int = 4, start: int = 0) -> Path:
    log, stored = CatalogLog.open(path, start)
    assert stored.records == () and stored.after == start and stored.base is None
    for record in updates(n, start + 1):
        log.append(record)
    log.close()
    return path


def offsets(path: Path) -> list[int]:
    """Start of each update record, then the end of the file."""
    return [at for at, _ in catalog_log.scan_log(path / LOG_FILE).records] + [
        (path / LOG_FILE).stat().st_size]


def generative(n: int) -> GenerativeBase:
    codes = torch.arange(n * 2, dtype=torch.int16).reshape(n, 2) % 7
    return GenerativeBase(codes, (7, 7), torch.tensor([1, n - 1]))


def test_record_format(tmp_path: Path) -> None:
    state = written(tmp_path / "s", n=2, start=5)
    buf = (state / LOG_FILE).read_bytes()
    payloads, at = [], 0
    while at < len(buf):
        magic, length, crc = FRAME.unpack_from(buf, at)
        body = buf[at + FRAME.size : at + FRAME.size + length]
        assert magic == MAGIC and zlib.crc32(body) == crc and body.isascii()
        payloads.append(json.loads(body))
        at += FRAME.size + length
    assert payloads[0] == {"format": 1, "after": 5, "base": False}
    assert payloads[1:] == [{"version": r.version, "op": r.op, "data": r.data}
                            for r in updates(2, 6)]
    assert read_state(state).records == tuple(updates(2, 6))


def test_append_is_on_disk_when_it_returns(tmp_path: Path, monkeypatch) -> None:
    log, _ = CatalogLog.open(tmp_path / "s")
    path = tmp_path / "s" / LOG_FILE
    synced: list[int] = []
    fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    for record in updates(3):
        before = len(synced)
        log.append(record)
        assert synced[before:] == [path.stat().st_ino]  # the log file, once per append
        with open(path, "rb") as other:  # another handle sees the whole record
            assert other.read().endswith(frame({"version": record.version, "op": record.op,
                                                "data": record.data}))
    with pytest.raises(RuntimeError, match="versions go one by one"):
        log.append(updates(1, start=2)[0])  # a version that goes back
    with pytest.raises(RuntimeError, match="versions go one by one"):
        log.append(updates(1, start=5)[0])  # one that skips a version
    log.close()
    assert read_state(tmp_path / "s").records == tuple(updates(3))


def test_a_torn_tail_is_cut_off_at_every_byte(tmp_path: Path) -> None:
    state = written(tmp_path / "s", n=3)
    full = (state / LOG_FILE).read_bytes()
    last, end = offsets(state)[-2:]
    cases = [full[:cut] for cut in range(last, end)]  # cut short anywhere in the last record
    cases += [full[:k] + bytes([full[k] ^ 0x41]) + full[k + 1 :] for k in range(last, end)]
    for k, data in enumerate(cases):
        copy = tmp_path / f"c{k}"
        shutil.copytree(state, copy)
        (copy / LOG_FILE).write_bytes(data)
        assert read_state(copy).records == tuple(updates(2))  # read-only: left as it is
        assert (copy / LOG_FILE).stat().st_size == len(data)
        log, stored = CatalogLog.open(copy)
        assert stored.records == tuple(updates(2)) and log.version == 2
        assert (copy / LOG_FILE).read_bytes() == full[:last]  # truncated to the good records
        log.append(updates(3)[2])  # and it goes on from there
        log.close()
        assert (copy / LOG_FILE).read_bytes() == full
        shutil.rmtree(copy)


def test_corruption_before_the_tail_is_refused(tmp_path: Path) -> None:
    state = written(tmp_path / "s", n=4)
    at = offsets(state)[1]  # the second record
    data = bytearray((state / LOG_FILE).read_bytes())
    data[at + FRAME.size + 3] ^= 0x20
    (state / LOG_FILE).write_bytes(bytes(data))
    for read in (read_state, CatalogLog.open):
        with pytest.raises(CatalogLogError, match=rf"{LOG_FILE}: offset {at}: a damaged record"):
            read(state)
    (state / LOG_FILE).write_bytes(b"not a log")
    with pytest.raises(CatalogLogError, match="offset 0: not a catalog log header"):
        read_state(state)


@pytest.mark.parametrize(("versions", "message"), [
    ((1, 2, 2), "offset .*: version 2 goes back"), ((1, 3), "version 3 skips versions"),
    ((0,), "version 0 goes back")])
def test_versions_never_go_back(tmp_path: Path, versions: tuple[int, ...], message: str) -> None:
    state = tmp_path / "s"
    state.mkdir()
    body = frame({"format": 1, "after": 0, "base": False})
    body += b"".join(frame({"version": v, "op": "retire", "data": [v]}) for v in versions)
    (state / LOG_FILE).write_bytes(body)
    with pytest.raises(CatalogLogError, match=message):
        CatalogLog.open(state)


def test_a_base_missing_or_behind_is_refused(tmp_path: Path) -> None:
    state = written(tmp_path / "s", n=3)
    write_base(state, CatalogBase(10, None))  # newer than the log's last version
    with pytest.raises(CatalogLogError, match="ends at version 3, before base-10.pt"):
        read_state(state)
    other = tmp_path / "t"
    other.mkdir()
    (other / LOG_FILE).write_bytes(frame({"format": 1, "after": 7, "base": True}))
    write_base(other, CatalogBase(6, None))  # older than the base the log follows
    with pytest.raises(CatalogLogError, match="follows base-7.pt, and no readable base"):
        CatalogLog.open(other)
    (other / LOG_FILE).unlink()
    with pytest.raises(CatalogLogError, match="base files but no catalog.log"):
        CatalogLog.open(other)


def test_discard_cuts_the_last_record(tmp_path: Path) -> None:
    log, _ = CatalogLog.open(tmp_path / "s")
    for record in updates(2):
        log.append(record)
    size = (tmp_path / "s" / LOG_FILE).stat().st_size
    log.append(updates(3)[2])
    log.discard_last()
    assert (tmp_path / "s" / LOG_FILE).stat().st_size == size and log.version == 2
    with pytest.raises(RuntimeError, match="no appended record"):
        log.discard_last()
    log.append(LogRecord(3, "retire", [0]))
    log.close()
    assert read_state(tmp_path / "s").records[-1] == LogRecord(3, "retire", [0])


def test_fold_keeps_the_later_records_and_reopens_the_same(tmp_path: Path) -> None:
    state = tmp_path / "s"
    log, _ = CatalogLog.open(state, policy=FoldPolicy(records=4, bytes=0))
    records = updates(9)
    for record in records[:4]:
        log.append(record)
    assert log.due()
    mark = log.mark()
    for record in records[4:7]:  # appended while the fold runs
        log.append(record)
    assert log.fold(mark, generative(5), ()) and not log.due()
    assert not log.fold(mark, generative(5), ())  # nothing new to fold
    log.discard_last()  # the record appended before the swap is cut from the new file
    for record in records[6:8]:
        log.append(record)
    log.close()
    stored = read_state(state)
    assert stored.after == stored.base.version == 4 and stored.records == tuple(records[4:8])
    assert torch.equal(stored.base.generative.codes, generative(5).codes)
    assert stored.base.generative.codes.dtype == torch.int16
    assert stored.base.ranker == fold_ranker({}, ((r.op, r.data) for r in records[:4]))
    # a second fold folds the first base's ranker changes with the later records
    log, stored = CatalogLog.open(state)
    log.fold(log.mark(), None, ())
    log.append(records[8])
    log.close()
    stored = read_state(state)
    assert list(base_files(state)) == [8] and stored.records == (records[8],)
    assert stored.base.generative is None
    assert stored.base.ranker == fold_ranker({}, ((r.op, r.data) for r in records[:8]))


def test_a_crash_during_a_fold_reopens_the_same(tmp_path: Path, monkeypatch) -> None:
    state = tmp_path / "s"
    log, _ = CatalogLog.open(state)
    records = updates(6)
    for record in records[:4]:
        log.append(record)
    mark = log.mark()
    for record in records[4:]:
        log.append(record)

    def crash(*args: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(catalog_log, "atomic_write", crash)  # the new log is never written
    with pytest.raises(OSError, match="disk gone"):
        log.fold(mark, generative(3), ())
    with pytest.raises(RuntimeError, match="a write failed"):  # no appends after that
        log.append(LogRecord(7, "retire", [1]))
    log.close()
    monkeypatch.undo()
    (state / ".catalog.log.x.tmp").write_bytes(b"half")  # what a crash leaves
    log, stored = CatalogLog.open(state)
    assert stored.after == stored.base.version == 4 and stored.records == tuple(records[4:])
    assert not list(state.glob(".*.tmp"))
    log.append(LogRecord(7, "retire", [1]))  # goes on after the base's records
    assert log.fold(log.mark(), None, ())
    log.close()
    assert list(base_files(state)) == [7] and read_state(state).records == ()


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    log, _ = CatalogLog.open(tmp_path / "s")
    with pytest.raises(CatalogLogError, match="in use by another process"):
        CatalogLog.open(tmp_path / "s")
    log.close()
    CatalogLog.open(tmp_path / "s")[0].close()
